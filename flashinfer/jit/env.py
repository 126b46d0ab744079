"""Where things live: package data (read-only) and the writable workspace."""

from __future__ import annotations

from pathlib import Path

from ..config import config
from ..version import __version__

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


def workspace_dir() -> Path:
    """Versioned workspace root: ``$FLASHINFER_WORKSPACE_BASE/<version>``."""
    return config.workspace_base / __version__


def generated_dir(uri: str) -> Path:
    return workspace_dir() / "generated" / uri


def cached_ops_dir() -> Path:
    return workspace_dir() / "cached_ops"


def lock_path(uri: str) -> Path:
    return workspace_dir() / "locks" / f"{uri}.lock"
