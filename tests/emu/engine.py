"""Building an emulated module (a kernel TU plus the emulator engine, one shared library)
and calling into it: the buffers a launch may read, the cp.async landing mode, the error."""

from __future__ import annotations

import ctypes
import functools
import subprocess
import tempfile
from pathlib import Path

import torch

from flashinfer.jit.toolchain import current_toolchain

EMU_DIR = Path(__file__).resolve().parent
REPO_ROOT = EMU_DIR.parent.parent


@functools.cache
def _build_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="flashinfer-emu-"))


def build_library(name: str, sources: list[Path], include_dirs: list[Path]) -> ctypes.CDLL:
    """``sources`` (CUDA TUs compiled as C++) with the engine, as library ``name``. The
    emulator's headers come first on the include path, so they stand in for CUDA's and for
    the few of ours that issue PTX."""
    output = _build_dir() / f"{name}.so"
    if not output.exists():
        includes = [EMU_DIR / "include", REPO_ROOT / "include", REPO_ROOT / "csrc", *include_dirs]
        command = [
            str(current_toolchain().cxx),
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            "-D__CUDACC__",  # as nvcc compiles a kernel TU (its configs check it)
            "-fno-strict-aliasing",  # kernels store 16-bit pairs through 32-bit pointers
            "-Wno-unknown-pragmas",  # #pragma unroll
            *(f"-I{d}" for d in includes),
            "-x",
            "c++",
            *(str(s) for s in sources),
            str(EMU_DIR / "simt.cc"),
            "-o",
            str(output),
        ]
        subprocess.run(command, check=True)
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

    def __call__(self, entry: str, argument: ctypes.Structure, buffers: list[torch.Tensor]) -> None:
        self.library.simt_reset(self.schedule)
        for t in buffers:
            self.library.simt_add_buffer(*extent(t))
        status = getattr(self.library, entry)(ctypes.byref(argument))
        if status != 0:
            raise RuntimeError(
                f"emulated {entry} failed ({status}): {self.library.simt_error().decode()}"
            )
