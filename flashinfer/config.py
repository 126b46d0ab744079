"""Every environment variable flashinfer reads, typed, in one place.

Values are read from ``os.environ`` on each access (a dict lookup), so tests and
long-running programs can change them between calls. Parsing errors raise
``ValueError`` naming the variable.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")


def _parse_positive_int(raw: str) -> int:
    value = int(raw.strip())
    if value < 1:
        raise ValueError("expected a positive integer")
    return value


def _parse_flags(raw: str) -> tuple[str, ...]:
    return tuple(shlex.split(raw))


def _parse_optional_str(raw: str) -> str | None:
    return raw.strip() or None


# The reference's documents name 0, 1, 3 and 5; 2 logs as 1 and 4 as 3; 10 (dumps) is ours.
API_LOG_LEVELS = {
    0: "off",
    1: "names",
    2: "as 1",
    3: "inputs/outputs",
    4: "as 3",
    5: "statistics",
    10: "dumps",
}
DEBUG_PRINTER_LEVELS = {0: "off", 1: "save", 2: "print", 3: "kernel names only"}


def _level_parser(levels: dict[int, str]) -> Callable[[str], int]:
    """Parses an integer level that must be one of ``levels`` (level: description)."""
    valid = ", ".join(f"{k} ({v})" if v else str(k) for k, v in levels.items())

    def parse(raw: str) -> int:
        text = raw.strip() or "0"
        level = int(text) if text.isdigit() else None
        if level not in levels:
            raise ValueError(f"expected one of {valid}")
        return level

    return parse


def _parse_non_negative_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError("expected a number >= 0")
    return value


def _parse_positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


_REPOSITORY_SCHEMES = ("http", "https", "file")


def _parse_repository(raw: str) -> str | None:
    """A module repository's base URL; an absolute path stands for its ``file://`` URL (the
    reference takes a local path too). Other schemes and relative paths are refused."""
    text = raw.strip()
    if not text:
        return None
    if os.path.isabs(text):
        return Path(text).as_uri()
    scheme, _, rest = text.partition("://")
    if scheme.lower() not in _REPOSITORY_SCHEMES or not rest:
        raise ValueError("expected an http://, https:// or file:// URL, or an absolute path")
    if scheme.lower() != "file" and not rest.split("/", 1)[0]:
        raise ValueError("the URL names no host")
    return text


def _parse_optional_dir(raw: str) -> Path | None:
    return _absolute_path(raw.strip()) if raw.strip() else None


def _parse_name_patterns(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


# A prefill kernel tiling's name (flashinfer.jit.prefill.PrefillTiling.name)
TILING_NAME = re.compile(r"m(\d+)kv(\d+)(?:c(\d+))?(p?)")
_TILING = re.compile(rf"(\d+):{TILING_NAME.pattern}")


def _parse_prefill_tilings(raw: str) -> tuple[tuple[int, int, int, int, bool], ...]:
    """Comma-separated ``head_dim:m<tiles>kv<tokens>[c<ctas>][p]`` entries (``128:m2kv32``,
    ``64:m1kv64c2``, ``128:m1kv64p``), as ``(head_dim, m_tiles, tile_kv, ctas, overlap)``
    (ctas 1 when left out; overlap: the ``p``); flashinfer.jit.prefill checks the values."""
    found = []
    for entry in raw.replace(" ", "").split(","):
        if not entry:
            continue
        match = _TILING.fullmatch(entry)
        if match is None:
            raise ValueError(
                "expected head_dim:m<tiles>kv<tokens>[c<ctas>][p] entries such as 128:m2kv32, "
                f"got {entry!r}"
            )
        head_dim, m_tiles, tile_kv = (int(g) for g in match.groups()[:3])
        found.append((head_dim, m_tiles, tile_kv, int(match[4] or 1), match[5] == "p"))
    return tuple(found)


def _default_workspace() -> Path:
    return Path.home() / ".cache" / "flashinfer"


@functools.cache
def _absolute_text(raw: str) -> str:
    """``raw`` made absolute against the working directory of its first use, so a later
    ``chdir`` cannot move the workspace of a running process."""
    return os.path.abspath(os.path.expanduser(raw))


@functools.cache
def _absolute_path(raw: str) -> Path:
    return Path(_absolute_text(raw))


def _workspace_text(raw: str | None) -> str:
    text = (raw or "").strip()
    return _absolute_text(text) if text else str(_default_workspace())


def _parse_workspace(raw: str) -> Path:
    return Path(_workspace_text(raw))


def _parse_log_level(raw: str) -> int:
    name = raw.strip().upper()
    level = logging.getLevelName(name)
    if isinstance(level, int):
        return level
    if name.isdigit():
        return int(name)
    raise ValueError("expected DEBUG, INFO, WARNING, ERROR or CRITICAL")


def _environ_bytes() -> dict[bytes, bytes] | None:
    """CPython's bytes dict behind ``os.environ`` on POSIX (None elsewhere): looking an
    unset name up there costs a dict miss, where ``os.environ.get`` raises and catches a
    KeyError per unset name (a tenth of a warm module load, which reads ~40 settings)."""
    data = getattr(os.environ, "_data", None)
    return data if os.name == "posix" and isinstance(data, dict) else None


def _getenv(name: str) -> str | None:
    """``os.environ.get(name)``, faster for unset names (see _environ_bytes)."""
    data = _environ_bytes()
    if data is None:
        return os.environ.get(name)
    raw = data.get(name.encode())
    return None if raw is None else os.fsdecode(raw)


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """A typed environment variable; a descriptor on :class:`Config`."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def raw(self) -> str | None:
        return _getenv(self.name)

    def read(self) -> T:
        raw = _getenv(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as err:
            raise ValueError(f"invalid value {raw!r} for {self.name}: {err}") from None

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.read()


class Config:
    """Typed view of the ``FLASHINFER_*`` environment (see docs/jit.md)."""

    workspace_base = EnvVar(
        "FLASHINFER_WORKSPACE_BASE",
        _default_workspace(),
        _parse_workspace,
        "root of the JIT workspace (generated sources, cached modules, locks); "
        "relative: from the first use's working dir; empty: the default",
    )
    cuda_arch_list = EnvVar(
        "FLASHINFER_CUDA_ARCH_LIST",
        None,
        _parse_optional_str,
        'target archs, e.g. "8.0 9.0a 10.0a"; default: the visible GPUs',
    )
    jit_verbose = EnvVar(
        "FLASHINFER_JIT_VERBOSE", False, _parse_bool, "show ninja/compiler commands and output"
    )
    jit_debug = EnvVar("FLASHINFER_JIT_DEBUG", False, _parse_bool, "device debug build: -g -G -O0")
    jit_lineinfo = EnvVar("FLASHINFER_JIT_LINEINFO", False, _parse_bool, "nvcc -lineinfo")
    nvcc = EnvVar(
        "FLASHINFER_NVCC",
        None,
        _parse_optional_str,
        "the CUDA compiler; default: $CUDA_HOME/bin/nvcc when CUDA_HOME is set, else nvcc on PATH",
    )
    cxx = EnvVar("CXX", "c++", str, "the host C++ compiler")
    search_path = EnvVar("PATH", "", str, "where compilers are looked up")
    cuda_home = EnvVar(
        "CUDA_HOME", None, _parse_optional_str, "CUDA toolkit root; default: found from nvcc"
    )
    nvcc_launcher = EnvVar(
        "FLASHINFER_NVCC_LAUNCHER", (), _parse_flags, "prefix for nvcc commands (ccache, sccache)"
    )
    cxx_launcher = EnvVar(
        "FLASHINFER_CXX_LAUNCHER", (), _parse_flags, "prefix for host compiler commands"
    )
    extra_cflags = EnvVar("FLASHINFER_EXTRA_CFLAGS", (), _parse_flags, "extra host compiler flags")
    extra_cudaflags = EnvVar("FLASHINFER_EXTRA_CUDAFLAGS", (), _parse_flags, "extra nvcc flags")
    extra_ldflags = EnvVar("FLASHINFER_EXTRA_LDFLAGS", (), _parse_flags, "extra linker flags")
    nvcc_threads = EnvVar("FLASHINFER_NVCC_THREADS", 1, _parse_positive_int, "nvcc --threads")
    max_jobs = EnvVar(
        "MAX_JOBS", None, _parse_positive_int, "ninja -j; default from cores and memory"
    )
    jit_lock_timeout = EnvVar(
        "FLASHINFER_JIT_LOCK_TIMEOUT",
        900.0,
        _parse_non_negative_float,
        "seconds to wait for another process's build before building privately",
    )
    aot_dir = EnvVar(
        "FLASHINFER_AOT_DIR",
        (),
        lambda raw: tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()),
        "read-only precompiled module dirs searched before the JIT cache (os.pathsep list)",
    )
    cache_max_gb = EnvVar(
        "FLASHINFER_CACHE_MAX_GB",
        None,
        lambda raw: _parse_non_negative_float(raw) if raw.strip() else None,
        "evict least recently used modules past this size after a build (default: no limit)",
    )
    disable_version_check = EnvVar(
        "FLASHINFER_DISABLE_VERSION_CHECK",
        False,
        _parse_bool,
        "use AOT layer modules built by another flashinfer version (mixing versions on purpose)",
    )
    disable_jit = EnvVar(
        "FLASHINFER_DISABLE_JIT", False, _parse_bool, "never compile; a missing module is an error"
    )
    cubins_repository = EnvVar(
        "FLASHINFER_CUBINS_REPOSITORY",
        None,
        _parse_repository,
        "base URL of a module repository (what precompile --out writes, served as-is): a module "
        "missing locally is downloaded from it before compiling; default: none",
    )
    cubin_dir = EnvVar(
        "FLASHINFER_CUBIN_DIR",
        None,
        _parse_optional_dir,
        "where downloaded modules are kept (an AOT layer); default: <workspace>/cubins",
    )
    cubin_checksum_disabled = EnvVar(
        "FLASHINFER_CUBIN_CHECKSUM_DISABLED",
        False,
        _parse_bool,
        "skip the size and sha256 checks of downloads against the repository index",
    )
    cubin_download_threads = EnvVar(
        "FLASHINFER_CUBIN_DOWNLOAD_THREADS",
        4,
        _parse_positive_int,
        "parallel downloads of `flashinfer artifacts download`",
    )
    cubin_download_timeout = EnvVar(
        "FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT",
        30.0,
        _parse_positive_float,
        "seconds a repository may take to connect or to send more data before a download fails",
    )
    no_download = EnvVar(
        "FLASHINFER_NO_DOWNLOAD",
        False,
        _parse_bool,
        "never contact the module repository (modules missing locally compile)",
    )
    logging_level = EnvVar(
        "FLASHINFER_LOGGING_LEVEL",
        logging.INFO,
        _parse_log_level,
        "level of the flashinfer loggers",
    )

    api_log_level = EnvVar(
        "FLASHINFER_LOGLEVEL",
        0,
        _level_parser(API_LOG_LEVELS),
        "API logging: 0 off, 1 names, 3 inputs/outputs, 5 statistics (2, 4 log as 1, 3), "
        "10 dumps (read at import)",
    )
    api_log_dest = EnvVar(
        "FLASHINFER_LOGDEST", "stdout", str, "stdout, stderr or a file path (%i -> pid)"
    )
    dump_dir = EnvVar(
        "FLASHINFER_DUMP_DIR", Path("flashinfer_dumps"), Path, "level-10 dump directory"
    )
    dump_include = EnvVar(
        "FLASHINFER_DUMP_INCLUDE", (), _parse_name_patterns, "dump only these APIs (wildcards)"
    )
    dump_exclude = EnvVar(
        "FLASHINFER_DUMP_EXCLUDE", (), _parse_name_patterns, "never dump these APIs (wildcards)"
    )
    dump_max_count = EnvVar(
        "FLASHINFER_DUMP_MAX_COUNT", 1000, _parse_positive_int, "stop dumping after N calls"
    )
    dump_max_size_gb = EnvVar(
        "FLASHINFER_DUMP_MAX_SIZE_GB",
        20.0,
        _parse_non_negative_float,
        "stop dumping past this many GB",
    )
    dump_safetensors = EnvVar(
        "FLASHINFER_DUMP_SAFETENSORS", False, _parse_bool, "dump .safetensors instead of .pt"
    )
    trace_dump = EnvVar(
        "FLASHINFER_TRACE_DUMP",
        False,
        _parse_bool,
        "write each decorated API's fi_trace definition JSON on its first call per const-axis "
        "values (read at import)",
    )
    trace_dump_dir = EnvVar(
        "FLASHINFER_TRACE_DUMP_DIR", Path("."), Path, "where FLASHINFER_TRACE_DUMP writes"
    )

    debug_printer = EnvVar(
        "FLASHINFER_DEBUG_PRINTER",
        0,
        _level_parser(DEBUG_PRINTER_LEVELS),
        "kernel-launch printer: 0 off, 1 save, 2 print, 3 kernel names (read at module load)",
    )
    debug_printer_kernels = EnvVar(
        "FLASHINFER_DEBUG_PRINTER_KERNELS",
        (),
        _parse_name_patterns,
        "only these kernels: <module>.<function> or <function>, case-insensitive",
    )
    debug_printer_dir = EnvVar(
        "FLASHINFER_DEBUG_PRINTER_DIR", Path("flashinfer_debug"), Path, "where level 1 saves"
    )
    jit_device_print = EnvVar(
        "FLASHINFER_JIT_DEVICE_PRINT",
        False,
        _parse_bool,
        "compile the device printf helpers of flashinfer/debug.cuh in (separate build dir)",
    )
    prefill_tiling = EnvVar(
        "FLASHINFER_PREFILL_TILING",
        (),
        _parse_prefill_tilings,
        "prefill kernel CTA shapes to try instead of the defaults, e.g. 128:m2kv32, "
        "64:m1kv64c2 or 128:m1kv64p (tuning; "
        "read when a process first loads that head_dim's module)",
    )

    _validated: tuple[str | None, ...] | None = None

    @classmethod
    def variables(cls) -> list[EnvVar[Any]]:
        return [v for v in vars(cls).values() if isinstance(v, EnvVar)]

    def snapshot(self) -> tuple[str | None, ...]:
        """The raw value of every variable (None: unset), in a fixed order: what decides
        every setting, for caches keyed by the environment."""
        data = _environ_bytes()
        if data is None:
            return tuple([os.environ.get(name) for name in _NAMES])
        raws = [data.get(key) for key in _ENCODED_NAMES]
        return tuple([None if raw is None else os.fsdecode(raw) for raw in raws])

    def workspace_text(self, snapshot: tuple[str | None, ...]) -> str:
        """``workspace_base`` as a str, from a :meth:`snapshot`: the warm path's way, which
        avoids pathlib and a second read of the environment (tens of us each, first used)."""
        return _workspace_text(snapshot[_WORKSPACE_INDEX])

    def problems(self) -> list[str]:
        """One message per variable whose value does not parse."""
        found = []
        for var in _VARIABLES:
            try:
                var.read()
            except ValueError as err:
                found.append(str(err))
        return found

    def validate(self) -> None:
        """Raise ValueError naming every invalid variable.

        Called where settings are first used (module loads, the CLI), so a process that
        only hits the cache hears of a bad value as one that builds does. The environment
        last found valid is remembered, which keeps repeated calls to a few dict lookups.
        """
        snapshot = self.snapshot()
        if snapshot == self._validated:
            return
        found = self.problems()
        if found:
            raise ValueError("; ".join(found))
        self._validated = snapshot


_VARIABLES = Config.variables()
_NAMES = [var.name for var in _VARIABLES]
_ENCODED_NAMES = [name.encode() for name in _NAMES]  # keys of _environ_bytes()
_WORKSPACE_INDEX = _NAMES.index(Config.workspace_base.name)
config = Config()
