"""The warm path's index: where a spec's up-to-date library is, remembered per environment,
so a load skips planning, rendering and reading the manifest.

A full plan resolves the toolchain, reads compiler versions, renders every flag and hashes
the identity; the manifest check that follows reads a JSON file and stats every input.
Neither is needed to find a library that was verified in the same environment: an entry,
keyed by a hash of everything that decides the plan (the spec's fields, its pending
renders by template stat and parameters, every setting flashinfer reads (the raw
environment, PATH included), the visible GPUs when no arch list is set, the versions),
names the library and lists every file whose change could make it stale: the compilers'
binaries, the manifest's inputs (sources, rendered configs, the header closure) and the
library itself, each with the stat the manifest confirmed by content. A lookup is one small
read and one stat per file; any difference is a miss, and the full path (plan, manifest
check by content, rebuild if needed) runs and writes the entry again. So a stale or wrong
entry can only cost a full plan, never a stale load.

Entries are written atomically under ``<workspace>/plans/`` and only for settings that
validate, so a hit needs no ``config.validate``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import config
from ..version import __version__
from . import env
from .arch import visible_capabilities
from .fileutil import atomic_write_text
from .manifest import Manifest
from .plan import BuildPlan, PlannedSpec

_HEADER = "flashinfer plan index 3"


@dataclass(frozen=True)
class IndexedPlan:
    """What the warm path needs of a plan (strings: a first Path costs tens of us)."""

    build_dir: str
    library_path: str
    digest: str


def _entry_path(spec: PlannedSpec) -> str:
    """The entry's file in the configured workspace (where this process writes, too, unless
    that cannot be written: entries are then neither read nor written)."""
    import tvm_ffi

    snapshot = config.snapshot()
    decided_by = [
        spec.name,
        [str(s) for s in spec.sources],
        spec.extra_cflags,
        spec.extra_cuda_cflags,
        spec.extra_ldflags,
        [str(p) for p in spec.extra_include_paths],
        spec.supported_major_versions,
        [str(p) for p in spec.generated_sources],
        [p.fingerprint() for p in spec.renders],
        snapshot,
        visible_capabilities() if config.cuda_arch_list is None else None,
        __version__,
        tvm_ffi.__version__,
    ]
    # repr, not json: every part is a plain literal, and repr costs a fraction of a first
    # json.dumps; blake2b is built in, its first use a fraction of OpenSSL's sha256.
    key = hashlib.blake2b(repr(decided_by).encode(), digest_size=16).hexdigest()
    return f"{config.workspace_text(snapshot)}/{__version__}/plans/{spec.name}-{key}"


def lookup(spec: PlannedSpec) -> IndexedPlan | None:
    """Where the up-to-date library of ``spec`` is, if an entry knows it and every file it
    lists still has its recorded stat.

    An entry is lines: the header, the build dir, the library's name, the digest, then
    ``<size> <mtime_ns> <inode or -> <path>`` per file (a plain format: parsing it costs
    less than a first ``json.loads``)."""
    try:
        fd = os.open(_entry_path(spec), os.O_RDONLY)  # no file object: cheaper at first use
        try:
            text = os.read(fd, 1 << 20).decode()
        finally:
            os.close(fd)
        header, build_dir, library, digest, *files = text.split("\n")
        if header != _HEADER or files.pop() != "":
            return None
        for line in files:
            size, mtime_ns, inode, path = line.split(" ", 3)
            st = os.stat(path)
            if (
                st.st_size != int(size)
                or st.st_mtime_ns != int(mtime_ns)
                or (inode != "-" and st.st_ino != int(inode))
            ):
                return None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return IndexedPlan(build_dir, f"{build_dir}/{library}", digest)


def record(spec: PlannedSpec, plan: BuildPlan) -> None:
    """Remember ``plan``'s library as up to date in this environment (best effort). Call
    only after its manifest was checked: the stats recorded are the manifest's."""
    try:
        config.validate()
    except ValueError:
        return  # no entry for settings that do not validate: the load must report them
    manifest = Manifest.load(plan.build_dir)
    if manifest is None or manifest.library_record is None:
        return
    library = manifest.library_record
    lines = [
        _HEADER,
        str(plan.build_dir),
        plan.ninja.output,
        plan.digest,
        f"{library.size} {library.mtime_ns} {library.inode} {plan.library_path}",
    ]
    for binary in (plan.toolchain.nvcc, plan.toolchain.cxx):
        try:
            st = os.stat(binary)
        except OSError:
            return
        lines.append(f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {binary}")
    lines += [f"{r.size} {r.mtime_ns} - {path}" for path, r in sorted(manifest.inputs.items())]
    if any("\n" in line for line in lines):
        return  # a path with a newline: not representable, plan fully each time
    if env.workspace_dir() != env.configured_workspace():
        return  # the configured workspace is read-only: plan fully each time
    try:
        atomic_write_text(Path(_entry_path(spec)), "\n".join(lines) + "\n")
    except OSError:
        pass
