"""The emulator's own checks: each rule a kernel can break (tests/emu/faults.cu) fails the
launch with its cause, and a well-behaved cp.async round trip through shared memory runs."""

from __future__ import annotations

import ctypes
import functools

import pytest
import torch

from tests.emu.engine import EMU_DIR, EmulatedLaunch, build_library

(
    NONE,
    DIVERGE,
    DEADLOCK,
    COPY_PAST_BUFFER,
    UNALIGNED_LDMATRIX,
    EXIT_IN_COLLECTIVE,
    STORE_PAST_SHARED,
) = range(7)


class FaultLaunch(ctypes.Structure):
    _fields_ = [
        ("fault", ctypes.c_int),
        ("src", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("shared_bytes", ctypes.c_int64),
    ]


def _launch(
    fault: int, offset: int = 0, shared_bytes: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(0, 256, (1024,), dtype=torch.uint8)
    out = torch.zeros(1024, dtype=torch.uint8)
    launch = EmulatedLaunch(_library(), land_at_issue=False)
    launch(
        "emu_fault",
        FaultLaunch(fault, src.data_ptr(), offset, out.data_ptr(), shared_bytes),
        [src, out],
    )
    return src, out


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("faults", [EMU_DIR / "faults.cu"], [])


def test_a_well_behaved_kernel_runs() -> None:
    src, out = _launch(NONE)
    # thread t wrote what thread t + 1 copied in: the barrier published every copy
    assert torch.equal(out.view(64, 16), torch.roll(src.view(64, 16), -1, 0))


@pytest.mark.parametrize(
    "fault,offset,shared_bytes,message",
    [
        (DIVERGE, 0, 1024, "diverge: this one is in __ballot_sync, others in __shfl_xor_sync"),
        (DEADLOCK, 0, 1024, "deadlock, 32 threads wait in __syncthreads"),
        (COPY_PAST_BUFFER, 16, 1024, "outside every registered buffer"),
        (COPY_PAST_BUFFER, 4, 1024, "cp.async reads 16 bytes at"),
        (UNALIGNED_LDMATRIX, 0, 1024, "ldmatrix row at shared offset 8: not 16-byte aligned"),
        (EXIT_IN_COLLECTIVE, 0, 1024, "thread 3: exits while other lanes of warp 0 wait"),
        (NONE, 0, 60 * 1024, "61440 bytes of dynamic shared memory (the kernel allows 49152"),
        (STORE_PAST_SHARED, 1024, 1024, "shared memory written 0 bytes past the launch's 1024"),
    ],
)
def test_each_fault_fails_the_launch_with_its_cause(
    fault: int, offset: int, shared_bytes: int, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _launch(fault, offset, shared_bytes)
