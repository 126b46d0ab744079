"""Launching tests/emu/faults.cu's kernel: two CTAs of 64 threads, each breaking CUDA's rules
one way (``Fault``) or computing what the emulator must get right."""

from __future__ import annotations

import ctypes
import enum
import functools

import torch

from .engine import EMU_DIR, EmulatedLaunch, build_library


class Fault(enum.IntEnum):
    """faults.cu's ``Fault``, in its order."""

    NONE = 0
    DIVERGE = enum.auto()
    DEADLOCK = enum.auto()
    COPY_PAST_BUFFER = enum.auto()
    UNALIGNED_LDMATRIX = enum.auto()
    EXIT_IN_COLLECTIVE = enum.auto()
    STORE_PAST_SHARED = enum.auto()
    HALF_WARPS = enum.auto()
    SHUFFLE_MODES = enum.auto()
    STATIC_SHARED = enum.auto()
    SHUFFLE_OUTSIDE_MASK = enum.auto()
    MATCH_REDUCE = enum.auto()
    FINISH_WITHOUT_ME = enum.auto()
    LOAD_PAST_BUFFER = enum.auto()
    LOAD_PAST_STATIC_SHARED = enum.auto()
    SIGNED_OVERFLOW = enum.auto()
    RACE_ACROSS_WARPS = enum.auto()
    RACE_WITHIN_WARP = enum.auto()
    RACE_IN_FLIGHT_COPY = enum.auto()
    RACE_STATIC_SHARED = enum.auto()
    RACE_ATOMIC_AND_LOAD = enum.auto()
    RACE_LDMATRIX = enum.auto()
    RACE_GLOBAL_IN_CTA = enum.auto()
    RACE_GLOBAL_ACROSS_CTAS = enum.auto()
    ATOMICS = enum.auto()


class _FaultLaunch(ctypes.Structure):
    _fields_ = [
        ("fault", ctypes.c_int),
        ("src", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("shared_bytes", ctypes.c_int64),
    ]


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("faults", [EMU_DIR / "faults.cu"], [])


def launch_fault(
    fault: Fault, offset: int = 0, shared_bytes: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's 1024-byte random ``src`` and the second CTA's 1024 bytes of ``out`` after
    a launch with ``fault``."""
    src = torch.randint(0, 256, (1024,), dtype=torch.uint8)
    out = torch.zeros(2048, dtype=torch.uint8)
    launch = EmulatedLaunch(_library(), land_at_issue=False)
    launch(
        "emu_fault",
        [src, out],
        _FaultLaunch(fault, src.data_ptr(), offset, out.data_ptr(), shared_bytes),
    )
    return src, out[1024:]
