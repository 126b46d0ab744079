"""Content checks of libraries this process did not build (AOT layers, downloads).

Such a library is recorded with its size and sha256 only (its layer is read-only and may be
copied anywhere). It is checked as a cached library is (``LibraryRecord.check``: the size
by a stat, the bytes by a hash when the stat identity is unknown); the (mtime, inode) a hash
confirmed are kept in a memo in the workspace, so later loads of the same file stay a stat
and a small read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import env
from .fileutil import atomic_write_text
from .manifest import LibraryRecord


def _memo_path(library: Path) -> Path:
    key = hashlib.sha256(str(library.resolve()).encode()).hexdigest()[:32]
    return env.workspace_dir() / "verified" / key


def _memo(path: Path) -> LibraryRecord | None:
    try:
        size, mtime_ns, inode, sha = path.read_text().split()
        return LibraryRecord(int(size), int(mtime_ns), int(inode), sha)
    except (OSError, ValueError):
        return None


def library_problem(library: Path, size: int, sha256: str, *, rehash: bool = False) -> str | None:
    """Why ``library`` is not the recorded file, or None. ``rehash`` ignores the memo."""
    memo = _memo_path(library)
    known = None if rehash else _memo(memo)
    if known is None or (known.size, known.sha256) != (size, sha256):
        known = LibraryRecord(size, -1, -1, sha256)  # no stat identity: hash the bytes
    problem, confirmed = known.check(library)
    if problem is None and confirmed is not known:
        try:
            atomic_write_text(
                memo, f"{confirmed.size} {confirmed.mtime_ns} {confirmed.inode} {confirmed.sha256}"
            )
        except OSError:
            pass  # a read-only workspace: hash again next time
    return problem
