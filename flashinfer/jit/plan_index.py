"""Where a spec's build dir is, remembered per environment, so the warm path skips planning.

A full plan resolves the toolchain, reads compiler versions, renders every flag and hashes
the identity (most of a warm load's Python time). Its only use on the warm path is the
build dir, which is a function of what decides the plan: the spec's fields, the content
of its rendered sources (by stat: renders rewrite a file only when it changes), every
setting flashinfer reads (the raw environment, PATH included), the visible GPUs when no
arch list is set, the versions, and the compilers' binaries (by stat). An entry keyed by
a hash of all of those names the build dir; the manifest check that follows is the same
as after a full plan, so a stale or wrong entry can only cost a full plan, never a stale
load. Entries are written atomically under ``<workspace>/plans/``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import config
from ..version import __version__
from . import env
from .arch import visible_capabilities
from .fileutil import atomic_write_text
from .plan import BuildPlan, PlannedSpec


@dataclass(frozen=True)
class IndexedPlan:
    """What the warm path needs of a plan."""

    build_dir: Path
    library_path: Path
    digest: str


def _stat(path: Path | str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _entry_path(spec: PlannedSpec) -> Path:
    import tvm_ffi

    decided_by = [
        spec.name,
        [str(s) for s in spec.sources],
        spec.extra_cflags,
        spec.extra_cuda_cflags,
        spec.extra_ldflags,
        [str(p) for p in spec.extra_include_paths],
        spec.supported_major_versions,
        [[str(p), _stat(p)] for p in spec.generated_sources],
        config.snapshot(),
        visible_capabilities() if config.cuda_arch_list is None else None,
        __version__,
        tvm_ffi.__version__,
    ]
    key = hashlib.sha256(json.dumps(decided_by, default=str).encode()).hexdigest()[:32]
    return env.workspace_dir() / "plans" / f"{spec.name}-{key}.json"


def lookup(spec: PlannedSpec) -> IndexedPlan | None:
    """The build dir a full plan of ``spec`` would give now, if an entry knows it."""
    try:
        entry = json.loads(_entry_path(spec).read_text())
        binaries = entry["binaries"]
        if any(_stat(path) != recorded for path, recorded in binaries.items()):
            return None  # a compiler was replaced: its version may differ
        build_dir = Path(entry["build_dir"])
        return IndexedPlan(build_dir, build_dir / entry["library"], str(entry["digest"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record(spec: PlannedSpec, plan: BuildPlan) -> None:
    """Remember ``plan``'s build dir for this environment (best effort)."""
    binaries = {str(p): _stat(p) for p in (plan.toolchain.nvcc, plan.toolchain.cxx)}
    entry = {
        "build_dir": str(plan.build_dir),
        "library": plan.ninja.output,
        "digest": plan.digest,
        "binaries": binaries,
    }
    try:
        atomic_write_text(_entry_path(spec), json.dumps(entry))
    except OSError:
        pass  # a read-only workspace: plan fully next time
