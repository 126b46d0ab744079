"""Building an emulated module (a kernel TU plus the emulator engine, one shared library)
and calling into it: the buffers a launch may read, the cp.async landing mode, the error.

A static ``__shared__`` variable compiles, under the emulator's headers, to a function's
static variable, one per CTA as CTAs run one after another; so that each CTA starts with
it poisoned, as with the dynamic shared memory, the build copies every source and header
declaring one with a call registering it after each declaration (see ``_register_statics``).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, TypeVar

import torch

from flashinfer.jit.toolchain import current_toolchain

EMU_DIR = Path(__file__).resolve().parent
REPO_ROOT = EMU_DIR.parent.parent
T = TypeVar("T")


# `__shared__ <type> <name>[<extents>];`, one declaration a statement
_STATIC_SHARED = re.compile(r"\b__shared__\s+([^;{}()]*?)\b(\w+)\s*((?:\[[^\]]*\])*)\s*;")


# Under sanitizers (see sanitized()): plain loads and stores outside an allocation, signed
# overflow, overlong shifts and misaligned accesses then fail the process with a report
# naming file and line (-g1: line tables only)
SANITIZER_FLAGS = (
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g1",
)


@functools.cache
def sanitized() -> bool:
    """Whether this process runs under AddressSanitizer (its runtime preloaded, as
    tests/emu/sanitizers.py starts it); libraries built here are then instrumented."""
    return hasattr(ctypes.CDLL(None), "__asan_init")


def _sanitizer_flags() -> tuple[str, ...]:
    return SANITIZER_FLAGS if sanitized() else ()


# The race check (tests/emu/simt.cc): a kernel TU's loads and stores call the engine's
# hooks, which stand in for ThreadSanitizer's runtime (never linked). Not under the
# sanitizers, which cannot be combined with it.
RACE_CHECK_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0")


# A kernel TU's loads and stores as wide as its source writes them (the memory profile,
# tests/emu/profile.py, counts them a lane at a time), and its lines named (-g1: line tables)
KERNEL_FLAGS = ("-fno-tree-vectorize", "-fno-store-merging", "-fno-tree-sra", "-g1")


def _race_check_flags() -> tuple[str, ...]:
    return () if sanitized() else RACE_CHECK_FLAGS


def _compile(source: Path, obj: Path, flags: list[str]) -> list[str]:
    """The host compiler's command compiling ``source`` to ``obj``."""
    cxx = str(current_toolchain().cxx)
    return [
        cxx,
        "-std=c++17",
        "-O2",
        "-fPIC",
        *_sanitizer_flags(),
        *flags,
        "-c",
        str(source),
        "-o",
        str(obj),
    ]


def _run_all(commands: list[list[str]]) -> None:
    """Runs the compile ``commands`` side by side, one a core (a library's binding TU, its
    kernel TU and the engine take about as long as the slowest alone)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for done in pool.map(lambda c: subprocess.run(c, check=False), commands):
            done.check_returncode()


@functools.cache
def _build_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="flashinfer-emu-"))


def _register_statics(text: str, origin: Path) -> str:
    """``text`` with ``simt::shared_declared(&name, sizeof(name))`` after each static
    ``__shared__`` declaration, which must fit on its line (a statement, so declarations at
    namespace scope and ``extern __shared__`` arrays are refused: kernels take dynamic shared
    memory from ``flashinfer::dynamic_shared()``). Comments are left alone."""
    lines = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        code, slashes, comment = line.partition("//")
        if "__shared__" not in code:
            lines.append(line)
            continue
        where = f"{origin}:{number}"
        if re.search(r"\bextern\s+__shared__\b", code):
            raise ValueError(f"{where}: `extern __shared__`; use flashinfer::dynamic_shared()")
        code, count = _STATIC_SHARED.subn(
            lambda m: f"{m.group(0)} ::simt::shared_declared(&{m.group(2)}, sizeof({m.group(2)}));",
            code,
        )
        if count != len(re.findall(r"\b__shared__\b", code)):
            raise ValueError(f"{where}: a __shared__ declaration the emulator cannot register")
        lines.append(code + slashes + comment)
    return "".join(lines)


def _with_statics_registered(files: list[Path], root: Path) -> list[Path]:
    """Each of ``files`` declaring a static ``__shared__`` variable copied under ``root``
    (to its path relative to the repository, or its name) with the registrations added;
    the others as they are."""
    result = []
    for f in files:
        text = f.read_text()
        if "__shared__" not in text:
            result.append(f)
            continue
        relative = f.relative_to(REPO_ROOT) if f.is_relative_to(REPO_ROOT) else Path(f.name)
        copy = root / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(_register_statics(text, f))
        result.append(copy)
    return result


def build_library(
    name: str,
    sources: list[Path],
    include_dirs: list[Path],
    host_sources: tuple[Path, ...] = (),
    host_flags: tuple[str, ...] = (),
    link_flags: tuple[str, ...] = (),
) -> ctypes.CDLL:
    """``sources`` (CUDA TUs compiled as C++) and ``host_sources`` (host TUs, compiled with
    ``host_flags``) with the engine, as library ``name`` (linked with ``link_flags``). The
    emulator's headers come first on the include path, so they stand in for CUDA's and for
    the few of ours that issue PTX; then ours with static shared memory registered."""
    build = _build_dir()
    output = build / f"{name}.so"
    if not output.exists():
        # our headers with static shared memory, rewritten, shadow the originals; the
        # emulator's stand-ins (never rewritten) shadow both
        rewritten = build / f"{name}-src"
        stand_ins = {p.relative_to(EMU_DIR / "include") for p in (EMU_DIR / "include").rglob("*")}
        headers = [
            h
            for h in sorted((REPO_ROOT / "include" / "flashinfer").glob("*"))
            if h.relative_to(REPO_ROOT / "include") not in stand_ins
        ]
        _with_statics_registered(headers, rewritten)
        includes = [
            EMU_DIR / "include",
            rewritten / "include",
            REPO_ROOT / "include",
            REPO_ROOT / "csrc",
            *include_dirs,
        ]
        include_flags = [f"-I{d}" for d in includes]
        kernel = [
            *_race_check_flags(),
            *KERNEL_FLAGS,
            "-D__CUDACC__",  # as nvcc compiles a kernel TU (its configs check it)
            "-fno-strict-aliasing",  # kernels store 16-bit pairs through 32-bit pointers
            "-Wno-unknown-pragmas",  # #pragma unroll
            "-x",
            "c++",
        ]
        units = [
            *((s, kernel) for s in _with_statics_registered(sources, rewritten / "sources")),
            *((s, list(host_flags)) for s in host_sources),
        ]
        objects = [build / f"{name}-{i}.o" for i in range(len(units))]
        commands = [
            _compile(source, obj, [*include_flags, *flags])
            for (source, flags), obj in zip(units, objects)
        ]
        engine = [build / "simt.o", build / "profile.o"]
        for obj in engine:  # the same in every library (only the emulator's headers)
            if not obj.exists():
                source = EMU_DIR / obj.with_suffix(".cc").name
                commands.append(_compile(source, obj, [f"-I{EMU_DIR / 'include'}"]))
        _run_all(commands)
        cxx = str(current_toolchain().cxx)
        link = [*map(str, [*objects, *engine]), *_sanitizer_flags(), *link_flags]
        subprocess.run([cxx, "-shared", *link, "-o", str(output)], check=True)
    library = ctypes.CDLL(str(output))
    library.simt_error.restype = ctypes.c_char_p
    library.simt_reset.argtypes = [ctypes.c_int]
    library.simt_add_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return library


def extent(t: torch.Tensor) -> tuple[int, int]:
    """The first byte address of ``t`` and the bytes up to its last element's end."""
    if t.numel() == 0:
        return t.data_ptr(), 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), (last + 1) * t.element_size()


class EmulatedLaunch:
    """One launch through ``library``: registers the buffers it may read (cp.async and
    page-table loads outside them fail the launch), resets the sticky error, and raises
    the emulator's message if the launch fails. ``land_at_issue``: cp.async copies land
    when issued, not at their wait; ``reverse``: a CTA's threads run last first (a write
    another thread reads before a barrier publishes it shows in one order or the other)."""

    def __init__(self, library: ctypes.CDLL, land_at_issue: bool, reverse: bool = False) -> None:
        self.library = library
        self.schedule = int(land_at_issue) | int(reverse) << 1

    def _prepare(self, buffers: list[torch.Tensor]) -> None:
        self.library.simt_reset(self.schedule)
        for t in buffers:
            self.library.simt_add_buffer(*extent(t))

    def __call__(
        self, entry: str, buffers: list[torch.Tensor], *arguments: ctypes.Structure
    ) -> None:
        """Calls the C entry point ``entry(&arguments[0], ...)``, which returns a
        cudaError_t."""
        self._prepare(buffers)
        status = getattr(self.library, entry)(*(ctypes.byref(a) for a in arguments))
        if status != 0:
            raise RuntimeError(
                f"emulated {entry} failed ({status}): {self.library.simt_error().decode()}"
            )

    def call(self, buffers: list[torch.Tensor], function: Callable[[], T]) -> T:
        """``function()``, a call into the library that reports failures itself (a tvm-ffi
        binding raises with the emulator's message)."""
        self._prepare(buffers)
        return function()
