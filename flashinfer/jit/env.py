"""Where things live: package data (read-only) and the writable workspace."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

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


class WorkspaceError(RuntimeError):
    """A part of the JIT workspace cannot be written where a build or render needs it."""


def _problem(base: Path) -> str | None:
    """Why ``base`` cannot hold a workspace, or None. ``os.access`` also reports
    read-only filesystems, for root too."""
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    if not os.access(base, os.W_OK | os.X_OK):
        return "read-only"
    return None


@functools.cache
def _writable_base(base: Path) -> Path:
    """``base`` when it can be created and written, else a per-user temp dir (one warning
    per process)."""
    problem = _problem(base)
    if problem is None:
        return base
    fallback = Path(tempfile.gettempdir()) / f"flashinfer-{os.getuid()}"
    if (base / __version__).is_dir() and os.access(base / __version__, os.R_OK | os.X_OK):
        logger.warning(
            "JIT workspace %s is %s: modules built there are loaded from it, new "
            "ones compile into %s (set FLASHINFER_WORKSPACE_BASE to choose)",
            base,
            problem,
            fallback,
        )
    else:
        logger.warning(
            "JIT workspace %s is unusable (%s); using %s instead "
            "(set FLASHINFER_WORKSPACE_BASE to choose)",
            base,
            problem,
            fallback,
        )
    return fallback


def configured_workspace() -> Path:
    """``$FLASHINFER_WORKSPACE_BASE/<version>`` as configured (not created, no fallback)."""
    return config.workspace_base / __version__


def workspace_dir() -> Path:
    """Versioned workspace root, where this process writes: ``$FLASHINFER_WORKSPACE_BASE/
    <version>``, or the fallback when that cannot be written."""
    return _writable_base(config.workspace_base) / __version__


def read_only_workspace() -> Path | None:
    """The configured versioned workspace when it cannot be written but can be read: its
    built modules still load (identities do not depend on the workspace path)."""
    base = config.workspace_base
    if _writable_base(base) == base:
        return None
    versioned = base / __version__
    return versioned if versioned.is_dir() else None


@contextlib.contextmanager
def writing_workspace(action: str) -> Iterator[None]:
    """Turn an OSError on a workspace path into one WorkspaceError that names the path
    and what to do (errors on other paths pass through)."""
    try:
        yield
    except OSError as err:
        path = str(err.filename or "")
        base = str(config.workspace_base)
        if not path.startswith((base, str(workspace_dir()))):
            raise
        reason = err.strerror or type(err).__name__
        raise WorkspaceError(
            f"cannot {action}: {path}: {reason}. Make the JIT workspace writable (remove "
            f"anything in the way, fix permissions) or set FLASHINFER_WORKSPACE_BASE to "
            f"another dir"
        ) from err


def gen_src_dir() -> Path:
    return workspace_dir() / "generated"


def generated_dir(uri: str) -> Path:
    return gen_src_dir() / uri


def cached_ops_dir() -> Path:
    return workspace_dir() / "cached_ops"


def _aot_dir() -> Path:
    """The first FLASHINFER_AOT_DIR layer; none configured: the reference's fallback
    location, ``flashinfer/data/aot`` (which need not exist)."""
    layers = config.aot_dir
    return layers[0] if layers else _PACKAGE_DIR / "data" / "aot"


# The reference's ``jit_env`` names, for code written against it. They depend on the
# environment (and resolving the workspace may create it), so they are computed on access.
_DIR_NAMES: dict[str, Callable[[], Path]] = {
    "FLASHINFER_WORKSPACE_DIR": workspace_dir,
    "FLASHINFER_GEN_SRC_DIR": gen_src_dir,
    "FLASHINFER_JIT_DIR": cached_ops_dir,
    "FLASHINFER_AOT_DIR": _aot_dir,
}


def __getattr__(name: str) -> Path:
    if name in _DIR_NAMES:
        return _DIR_NAMES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_DIR_NAMES])


def cubin_dir() -> Path:
    """Where modules downloaded from FLASHINFER_CUBINS_REPOSITORY are published (an AOT
    layer; see remote.py): in the writable workspace unless FLASHINFER_CUBIN_DIR is set."""
    explicit = config.cubin_dir
    return explicit if explicit is not None else workspace_dir() / "cubins"


def lock_path(uri: str) -> Path:
    return workspace_dir() / "locks" / f"{uri}.lock"
