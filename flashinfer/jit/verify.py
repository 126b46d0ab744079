"""Content checks of libraries this process did not build (AOT layers, downloads).

Such a library is recorded with its size and sha256. Loading checks the size (a stat);
the first load of each copy also hashes it and leaves a memo keyed by its (size, mtime,
inode) in the workspace, so later loads of the same file stay a stat and a small read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import env
from .fileutil import atomic_write_text, sha256_file


def _memo_path(library: Path) -> Path:
    key = hashlib.sha256(str(library.resolve()).encode()).hexdigest()[:32]
    return env.workspace_dir() / "verified" / key


def library_problem(library: Path, size: int, sha256: str, *, rehash: bool = False) -> str | None:
    """Why ``library`` is not the recorded file, or None. ``rehash`` ignores the memo."""
    try:
        st = os.stat(library)
    except OSError as err:
        return f"{library} is unreadable ({err.strerror})"
    if st.st_size != size:
        return f"{library} has {st.st_size} bytes, the record says {size}"
    stamp = f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {sha256}"
    memo = _memo_path(library)
    if not rehash:
        try:
            if memo.read_text() == stamp:
                return None
        except OSError:
            pass
    if sha256_file(library) != sha256:
        return f"{library} does not match its recorded sha256"
    try:
        atomic_write_text(memo, stamp)
    except OSError:
        pass  # a read-only workspace: hash again next time
    return None
