"""The on-disk module cache as a whole: listing, last-use stamps, eviction, clearing.

Each built module variant is a dir ``cached_ops/<uri>/<digest>/`` holding its library
and manifest. Loading a module touches its ``last_used`` stamp, so eviction under
FLASHINFER_CACHE_MAX_GB removes the least recently used variants first. A variant
whose library is mapped by a live process of this user (read from /proc/<pid>/maps;
other users' processes cannot be seen) is never evicted, nor the one just built.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import env
from .fileutil import sha256_file
from .manifest import MANIFEST_NAME, Manifest

logger = logging.getLogger("flashinfer.jit")

STAMP = "last_used"


@dataclass(frozen=True)
class CacheEntry:
    uri: str
    digest: str
    path: Path
    size_bytes: int
    last_used: float
    archs: tuple[str, ...] = field(default=())
    problem: str | None = None  # why the variant would be rebuilt on load (a stat check)

    @property
    def library(self) -> Path:
        return self.path / f"{self.uri}.so"


def touch(build_dir: Path | str) -> None:
    """Record a use of a module variant (best effort: the cache may be read-only)."""
    stamp = os.path.join(build_dir, STAMP)
    try:
        os.utime(stamp)
    except FileNotFoundError:
        try:
            Path(stamp).touch()
        except OSError:
            pass
    except OSError:
        pass


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def entries(root: Path | None = None) -> list[CacheEntry]:
    """Every built variant under ``root`` (default: this version's cached_ops)."""
    root = root or env.cached_ops_dir()
    found = []
    for manifest in sorted(root.glob(f"*/*/{MANIFEST_NAME}")):
        variant = manifest.parent
        record = Manifest.load(variant)
        stamp = variant / STAMP
        try:
            last_used = (stamp if stamp.exists() else manifest).stat().st_mtime
        except OSError:
            continue
        archs: tuple[str, ...] = ()
        problem: str | None = "its manifest is unreadable or from an older format"
        if record is not None and record.library_record is not None:
            archs = tuple(str(a) for a in record.identity.get("archs", ()))
            problem = record.library_record.check(variant / record.library)[0]
        found.append(
            CacheEntry(
                variant.parent.name,
                variant.name,
                variant,
                _dir_size(variant),
                last_used,
                archs,
                problem,
            )
        )
    return found


def verify(entry: CacheEntry) -> str | None:
    """Hash the variant's library against its manifest: None when it matches, else the
    problem."""
    if entry.problem is not None:
        return entry.problem
    record = Manifest.load(entry.path)
    if record is None or record.library_record is None:
        return "its manifest is unreadable"
    try:
        actual = sha256_file(entry.path / record.library)
    except OSError as err:
        return f"its library is unreadable ({err.strerror})"
    if actual != record.library_record.sha256:
        return "its library does not match the sha256 recorded at build time"
    return None


def mapped_libraries() -> set[str]:
    """Paths of the shared libraries mapped by this user's live processes."""
    mapped: set[str] = set()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as fh:
                for line in fh:
                    if line.rstrip().endswith(".so"):
                        mapped.add(line.split(None, 5)[-1].strip())
        except OSError:
            continue
    return mapped


def remove(entry: CacheEntry) -> None:
    """Delete a variant: renamed aside first, so no reader sees it half-deleted."""
    trash = entry.path.parent / f".trash-{uuid.uuid4().hex[:8]}"
    try:
        os.replace(entry.path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def evict(
    max_bytes: float, keep: set[Path] | None = None, root: Path | None = None
) -> list[CacheEntry]:
    """Remove least recently used variants until the cache fits in ``max_bytes``."""
    all_entries = entries(root)
    total = sum(e.size_bytes for e in all_entries)
    if total <= max_bytes:
        return []
    protected = {p.resolve() for p in keep or set()}
    in_use = mapped_libraries()
    evicted = []
    for entry in sorted(all_entries, key=lambda e: e.last_used):
        if total <= max_bytes:
            break
        if entry.path.resolve() in protected or str(entry.library) in in_use:
            continue
        remove(entry)
        total -= entry.size_bytes
        evicted.append(entry)
    if evicted:
        logger.info(
            "evicted %d cached module(s), %.1f MB, to stay under %.3g GB",
            len(evicted),
            sum(e.size_bytes for e in evicted) / 1e6,
            max_bytes / 1e9,
        )
    if total > max_bytes:
        logger.warning(
            "JIT cache still holds %.3g GB > %.3g GB: the rest is in use",
            total / 1e9,
            max_bytes / 1e9,
        )
    return evicted


def clear(pattern: str | None = None, root: Path | None = None) -> list[CacheEntry]:
    """Remove every variant whose module name matches ``pattern`` (wildcards; all if None)."""
    removed = []
    for entry in entries(root):
        if pattern is None or fnmatch.fnmatchcase(entry.uri, pattern):
            remove(entry)
            removed.append(entry)
    return removed
