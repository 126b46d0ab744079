"""Where things live: package data (read-only) and the writable workspace."""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from pathlib import Path

from ..config import config
from ..version import __version__

logger = logging.getLogger("flashinfer.jit")

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_REPO_ROOT = _PACKAGE_DIR.parent


def _data_dir(name: str) -> Path:
    """``flashinfer/data/<name>`` (a copy in wheels, a symlink in editable installs),
    else the source checkout's ``<name>`` (running from a plain clone on PYTHONPATH)."""
    packaged = _PACKAGE_DIR / "data" / name
    if packaged.is_dir():
        return packaged
    return _REPO_ROOT / name


FLASHINFER_CSRC_DIR = _data_dir("csrc")
FLASHINFER_INCLUDE_DIR = _data_dir("include")


@functools.cache
def _writable_base(base: Path) -> Path:
    """``base`` when it can be created and written, else a per-user temp dir (one warning
    per process). ``os.access`` also reports read-only filesystems, for root too."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK | os.X_OK):
            return base
        problem = "not writable"
    except OSError as err:
        problem = err.strerror or str(err)
    fallback = Path(tempfile.gettempdir()) / f"flashinfer-{os.getuid()}"
    logger.warning("JIT workspace %s is unusable (%s); using %s instead "
                   "(set FLASHINFER_WORKSPACE_BASE to choose)", base, problem, fallback)
    return fallback


def workspace_dir() -> Path:
    """Versioned workspace root: ``$FLASHINFER_WORKSPACE_BASE/<version>``."""
    return _writable_base(config.workspace_base) / __version__


def generated_dir(uri: str) -> Path:
    return workspace_dir() / "generated" / uri


def cached_ops_dir() -> Path:
    return workspace_dir() / "cached_ops"


def lock_path(uri: str) -> Path:
    return workspace_dir() / "locks" / f"{uri}.lock"
