"""Why a module needs a build: a changed input, or what differs from its last build.

A changed flag, arch, compiler or version selects a new build dir, so the reason is
found by comparing the new identity with the most recent other build of the module
(in this workspace version or an older one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import config
from . import env
from .manifest import MANIFEST_NAME, Manifest

_ASPECTS = (
    ("archs", "target archs"),
    ("cuda_cflags", "nvcc flags"),
    ("cflags", "host compiler flags"),
    ("ldflags", "linker flags"),
    ("nvcc", "nvcc"),
    ("cxx", "host compiler"),
    ("flashinfer", "flashinfer version"),
    ("tvm_ffi", "tvm-ffi version"),
    ("generated", "rendered config"),
    ("sources", "source list"),
)


def display_path(path: str) -> str:
    """A path relative to the package data root when it is under it."""
    root = env.FLASHINFER_INCLUDE_DIR.parent
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def changed_inputs_reason(changed: list[str]) -> str:
    shown = ", ".join(display_path(p) for p in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{shown}{more} changed"


def _flag_diff(old: list[str], new: list[str]) -> str:
    added = [f for f in new if f not in old]
    removed = [f for f in old if f not in new]
    parts = [f"+{f}" for f in added[:3]] + [f"-{f}" for f in removed[:3]]
    return " ".join(parts) or "reordered"


def _describe(key: str, old: Any, new: Any) -> str:
    if isinstance(old, list) and isinstance(new, list) and key.endswith("flags"):
        return _flag_diff(old, new)
    if key == "archs":
        return f"{' '.join(old)} -> {' '.join(new)}"
    if key in ("generated", "sources"):
        return "content" if key == "generated" else "files"
    return f"{old} -> {new}"


def explain_new_build(uri: str, identity: dict[str, Any], build_dir: Path) -> str:
    """'first build', or what differs from the most recently built other variant."""
    candidates = []
    for manifest_path in config.workspace_base.glob(f"*/cached_ops/{uri}/*/{MANIFEST_NAME}"):
        if manifest_path.parent == build_dir:
            continue
        try:
            candidates.append((manifest_path.stat().st_mtime, manifest_path))
        except OSError:
            continue
    for _, manifest_path in sorted(candidates, reverse=True):
        previous = _identity_of(manifest_path)
        if previous is None:
            continue
        diffs = [
            f"{label} changed ({_describe(key, previous.get(key), identity.get(key))})"
            for key, label in _ASPECTS
            if previous.get(key) != identity.get(key)
        ]
        if diffs:
            return "; ".join(diffs)
    return "first build"


def _identity_of(manifest_path: Path) -> dict[str, Any] | None:
    """The identity recorded in any manifest format (older versions' too), if readable."""
    try:
        identity = json.loads(manifest_path.read_text())["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return identity if isinstance(identity, dict) else None


def stale_reason(
    uri: str, identity: dict[str, Any], build_dir: Path, library: Path, manifest: Manifest | None
) -> str | None:
    """None when the built library is up to date; else why it is not."""
    if manifest is None:
        if (build_dir / MANIFEST_NAME).exists():
            return "its manifest is unreadable or from an older format"
        return explain_new_build(uri, identity, build_dir)
    return manifest_problem(build_dir, library, manifest)


def manifest_problem(build_dir: Path, library: Path, manifest: Manifest) -> str | None:
    """None when ``library`` and the inputs are as ``manifest`` records; else why not.
    Stats that changed with the content unchanged are refreshed in the manifest."""
    if manifest.library_record is None:
        return "its manifest records no library"
    problem, record = manifest.library_record.check(library)
    if problem is not None:
        return problem
    changed, restat = manifest.changed_inputs()
    if changed:
        return changed_inputs_reason(changed)
    if record is not manifest.library_record:
        manifest.library_record, restat = record, True
    if restat:
        try:  # remember the new stats so the next process skips the re-hash
            manifest.save(build_dir)
        except OSError:
            pass
    return None
