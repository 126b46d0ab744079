"""The compilers and libraries a build uses, and their identities for the cache key.

Probing a compiler's version spawns a process (~10-50 ms), so results are kept in
``<workspace>/toolchain.json`` keyed by the binary's resolved path, size and mtime:
a process that loads cached modules never runs a compiler.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import config
from . import env
from .arch import CudaArch
from .fileutil import atomic_write_text


class ToolchainError(RuntimeError):
    """A compiler or tool the JIT needs is missing or broken."""


def _which(program: str, variable: str) -> Path:
    found = shutil.which(program)
    if found is None:
        where = "" if os.sep in program else " on PATH"
        raise ToolchainError(f"{program!r} not found{where} (set {variable} to choose another)")
    return Path(found)


def _which_nvcc(program: str) -> Path:
    from_cuda_home = not config.nvcc and config.cuda_home is not None
    return _which(
        program, "FLASHINFER_NVCC or fix CUDA_HOME" if from_cuda_home else "FLASHINFER_NVCC"
    )


@functools.cache
def _probe_cache_path() -> Path:
    return env.workspace_dir() / "toolchain.json"


def _probe_version(binary: Path) -> str:
    """First line(s) of ``<binary> --version``, cached on disk by path, size and mtime."""
    real = binary.resolve()
    st = real.stat()
    return _probe_version_cached(real, st.st_size, st.st_mtime_ns, binary)


@functools.cache
def _probe_version_cached(real: Path, size: int, mtime_ns: int, binary: Path) -> str:
    key = f"{real}|{size}|{mtime_ns}"
    cache_file = _probe_cache_path()
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    try:
        proc = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise ToolchainError(f"cannot run {binary} --version: {err}") from err
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    version = " | ".join(lines[-2:]) if "nvcc" in real.name else lines[0]
    cache[key] = version
    try:
        atomic_write_text(cache_file, json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only workspace only costs a probe per process
    return version


def nvcc_name() -> str:
    """The nvcc FLASHINFER_NVCC names; unset: ``$CUDA_HOME/bin/nvcc`` when CUDA_HOME is set
    (the compiler of the toolkit whose headers builds use), else ``nvcc`` on PATH."""
    if config.nvcc:
        return config.nvcc
    if config.cuda_home:
        return str(Path(config.cuda_home) / "bin" / "nvcc")
    return "nvcc"


def _cuda_home(nvcc: Path) -> Path:
    if config.cuda_home:
        return Path(config.cuda_home)
    # nvcc may be a wrapper script (as /usr/local/bin/nvcc is here): check for headers.
    for candidate in (nvcc.resolve().parent.parent, Path("/usr/local/cuda")):
        if (candidate / "include" / "cuda_runtime_api.h").is_file():
            return candidate
    raise ToolchainError(
        f"cannot find the CUDA toolkit for {nvcc} (no include/cuda_runtime_api.h); set CUDA_HOME"
    )


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    cxx: Path
    cuda_home: Path
    tvm_ffi_include_dirs: tuple[Path, ...]
    tvm_ffi_lib_dir: Path
    tvm_ffi_version: str

    @property
    def cuda_include_dir(self) -> Path:
        return self.cuda_home / "include"

    @property
    def cuda_lib_dir(self) -> Path:
        for name in ("lib64", "lib", "targets/x86_64-linux/lib"):
            if (self.cuda_home / name / "libcudart.so").exists():
                return self.cuda_home / name
        return self.cuda_home / "lib64"

    def nvcc_version(self) -> str:
        return _probe_version(self.nvcc)

    def cxx_version(self) -> str:
        return _probe_version(self.cxx)


def find_ninja() -> Path:
    """The ninja binary: the PyPI package's, else PATH's. Needed only to build."""
    try:
        import ninja

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return candidate
    except (ImportError, AttributeError):
        pass
    return _which("ninja", "PATH")


def _tvm_ffi_paths() -> tuple[tuple[Path, ...], Path]:
    """tvm-ffi's include dirs and library dir: beside the installed package when they are
    there (a few stats), else through tvm_ffi.libinfo's search (about a millisecond)."""
    import tvm_ffi

    root = Path(tvm_ffi.__file__).parent
    include, lib = root / "include", root / "lib"
    if (
        (include / "tvm" / "ffi").is_dir()
        and (include / "dlpack").is_dir()
        and (lib / "libtvm_ffi.so").is_file()
    ):
        return (include,), lib
    from tvm_ffi import libinfo

    include_dirs = tuple(
        dict.fromkeys(
            Path(p) for p in (libinfo.find_include_path(), libinfo.find_dlpack_include_path())
        )
    )
    return include_dirs, Path(libinfo.find_libtvm_ffi()).parent


@functools.cache
def _resolve(
    nvcc_program: str, cxx_name: str, cuda_home: str | None, search_path: str
) -> Toolchain:
    del cuda_home, search_path  # cache key only: they change what the lookups find
    import tvm_ffi

    nvcc = _which_nvcc(nvcc_program)
    include_dirs, lib_dir = _tvm_ffi_paths()
    return Toolchain(
        nvcc=nvcc,
        cxx=_which(cxx_name, "CXX"),
        cuda_home=_cuda_home(nvcc),
        tvm_ffi_include_dirs=include_dirs,
        tvm_ffi_lib_dir=lib_dir,
        tvm_ffi_version=tvm_ffi.__version__,
    )


def current_toolchain() -> Toolchain:
    """The tools the current environment selects (resolved once per distinct setting)."""
    return _resolve(nvcc_name(), config.cxx, config.cuda_home, config.search_path)


def default_max_jobs() -> int:
    """ninja -j: MAX_JOBS, else one job per core, capped by available memory at
    ~2 GiB per job (what one nvcc of a template-heavy kernel TU can take)."""
    if config.max_jobs is not None:
        return config.max_jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        available_gib = int(info["MemAvailable"].split()[0]) / (1024 * 1024)
        by_memory = max(1, int(available_gib // 2))
    except (OSError, KeyError, ValueError):
        by_memory = cores or 1
    return max(1, min(cores or 1, by_memory))


def find_nvcc() -> Path:
    """The CUDA compiler builds use (:func:`nvcc_name`), looked up as builds look it up."""
    return _which_nvcc(nvcc_name())


def find_cxx() -> Path:
    """The host compiler CXX names, on its own: judging it needs no nvcc."""
    return _which(config.cxx, "CXX")


def find_cuda_home(nvcc: Path) -> Path:
    """The toolkit root builds pair with ``nvcc``: CUDA_HOME as given, else found beside it."""
    return _cuda_home(nvcc)


def tool_version(binary: Path) -> str:
    """``binary --version``, condensed and cached as the cache key's probe caches it."""
    return _probe_version(binary)


def nvcc_release(nvcc: Path) -> tuple[int, int] | None:
    """(major, minor) of ``nvcc``'s CUDA release, or None when its banner names none."""
    match = re.search(r"release (\d+)\.(\d+)", tool_version(nvcc))
    return (int(match[1]), int(match[2])) if match else None


@functools.cache
def _listed_gpu_archs(real: Path, size: int, mtime_ns: int) -> frozenset[tuple[int, int]]:
    del size, mtime_ns  # cache key only: a reinstalled nvcc is asked again
    try:
        proc = subprocess.run(
            [str(real), "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise ToolchainError(f"cannot run {real} --list-gpu-arch: {err}") from err
    found = re.findall(r"^compute_(\d+)[a-z]?$", proc.stdout, re.MULTILINE)
    archs = frozenset((int(digits[:-1]), int(digits[-1])) for digits in found)
    if not archs:
        raise ToolchainError(f"{real} --list-gpu-arch names no compute_XX arch")
    return archs


def nvcc_supported_archs(nvcc: Path | None = None) -> frozenset[tuple[int, int]]:
    """(major, minor) of every GPU arch ``nvcc --list-gpu-arch`` can compile for
    (``compute_90`` -> ``(9, 0)``), so an arch list can be refused before a build fails
    with nvcc's "Unsupported gpu architecture".

    ``nvcc``: the compiler to ask; default: the one FLASHINFER_NVCC selects. Asked once per
    binary (path, size, mtime) and process, about 10 ms. nvcc lists base archs only: whether
    an ``a``/``f`` variant exists is :func:`nvcc_arch_problem`'s business. Raises
    :class:`ToolchainError` when nvcc is missing or cannot answer.
    """
    binary = (nvcc or find_nvcc()).resolve()
    try:
        st = binary.stat()
    except OSError as err:
        raise ToolchainError(f"cannot read {binary}: {err.strerror or err}") from err
    return _listed_gpu_archs(binary, st.st_size, st.st_mtime_ns)


def nvcc_arch_problem(arch: CudaArch, nvcc: Path | None = None) -> str | None:
    """Why ``nvcc`` (default: FLASHINFER_NVCC's) cannot build ``arch``, or None when it can.

    Base archs come from :func:`nvcc_supported_archs`; arch-specific ``a`` variants exist
    from 9.0 on, family ``f`` variants from 10.0 on with CUDA 12.9 or newer.
    """
    binary = nvcc or find_nvcc()
    supported = nvcc_supported_archs(binary)
    release = nvcc_release(binary)
    name = f"nvcc {release[0]}.{release[1]}" if release else f"{binary}"
    if (arch.major, arch.minor) not in supported:
        listed = ", ".join(f"{major}.{minor}" for major, minor in sorted(supported))
        return f"{name} cannot build arch {arch}; it supports {listed}"
    if arch.suffix == "a" and arch.major < 9:
        return f"arch {arch} does not exist: arch-specific ('a') targets start at 9.0a"
    if arch.suffix == "f" and (arch.major < 10 or (release is not None and release < (12, 9))):
        return (
            f"{name} cannot build arch {arch}: family ('f') targets start at 10.0f "
            "and need CUDA 12.9 or newer"
        )
    return None
