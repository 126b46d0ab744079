"""The emulator's own checks: each rule a kernel can break (tests/emu/faults.cu) fails the
launch with its cause, and well-behaved kernels compute what CUDA specifies: a cp.async round
trip through shared memory, collectives of part of a warp, shuffle modes and widths, matches
and reductions, and a static __shared__ array that starts each CTA poisoned."""

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
    HALF_WARPS,
    SHUFFLE_MODES,
    STATIC_SHARED,
    SHUFFLE_OUTSIDE_MASK,
    MATCH_REDUCE,
    FINISH_WITHOUT_ME,
) = range(13)


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
        [src, out],
        FaultLaunch(fault, src.data_ptr(), offset, out.data_ptr(), shared_bytes),
    )
    return src, out


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("faults", [EMU_DIR / "faults.cu"], [])


def test_a_well_behaved_kernel_runs() -> None:
    src, out = _launch(NONE)
    # thread t wrote what thread t + 1 copied in: the barrier published every copy
    assert torch.equal(out.view(64, 16), torch.roll(src.view(64, 16), -1, 0))


def _words(fault: int) -> list[list[int]]:
    """Each thread's three result words (of the last CTA to store them)."""
    _, out = _launch(fault)
    return out.view(64, 16)[:, :12].contiguous().view(torch.int32).view(64, 3).tolist()


def test_half_warps_meet_in_different_collectives() -> None:
    words = _words(HALF_WARPS)
    upper = sum(1 << lane for lane in range(16, 32) if lane % 3 == 0)
    for t in range(64):
        assert words[t][0] == (t ^ 1 if t % 32 < 16 else upper), t


def test_shuffle_modes_and_widths() -> None:
    for t, (index, down, up) in enumerate(_words(SHUFFLE_MODES)):
        assert index == (t & ~7) + 3
        assert down == (t + 5 if t % 16 + 5 < 16 else t)
        assert up == (t - 2 if t % 32 >= 2 else t)


def _unsigned_words(fault: int) -> list[list[int]]:
    return [[w % 2**32 for w in words] for words in _words(fault)]


def test_matches_reductions_and_64_bit_shuffles() -> None:
    for t, (match, total, pair) in enumerate(_unsigned_words(MATCH_REDUCE)):
        warp = t // 32
        assert match == sum(1 << lane for lane in range(32) if lane % 3 == t % 32 % 3)
        assert total == sum(range(32 * warp, 32 * warp + 32))
        assert pair == (t ^ 1) | ((t ^ 1) + 7) << 16


def test_a_lane_waits_while_the_lanes_it_names_finish_another_collective() -> None:
    """Odd lanes reach the closing ballot while the even lanes still match among themselves
    (a mask leaving the odd ones out): legal, as on a GPU."""
    for t, (members, peers, after) in enumerate(_unsigned_words(FINISH_WITHOUT_ME)):
        assert members == 0x55555555 and after == 0xFFFFFFFF
        assert peers == (0 if t % 2 else 0x11111111 << (t % 4))


def test_static_shared_memory_starts_every_cta_poisoned() -> None:
    for t, (before, neighbour, _) in enumerate(_words(STATIC_SHARED)):
        assert before == -1  # 0xffffffff, not what the first CTA stored
        assert neighbour == (t + 1) % 64 + 1000  # the second CTA's own stores


@pytest.mark.parametrize(
    "fault,offset,shared_bytes,message",
    [
        (DIVERGE, 0, 1024, "this one is in __ballot_sync (mask 0xffffffff), lane 0 in __shfl_xor"),
        (DEADLOCK, 0, 1024, "deadlock, 32 threads wait in __syncthreads"),
        (COPY_PAST_BUFFER, 16, 1024, "outside every registered buffer"),
        (COPY_PAST_BUFFER, 4, 1024, "cp.async reads 16 bytes at"),
        (UNALIGNED_LDMATRIX, 0, 1024, "ldmatrix row at shared offset 8: not 16-byte aligned"),
        (EXIT_IN_COLLECTIVE, 0, 1024, "thread 3: exits while other lanes of warp 0 wait"),
        (NONE, 0, 60 * 1024, "61440 bytes of dynamic shared memory (the kernel allows 49152"),
        (STORE_PAST_SHARED, 1024, 1024, "shared memory written 0 bytes past the launch's 1024"),
        (SHUFFLE_OUTSIDE_MASK, 0, 1024, "lane 0 reads lane 16, which the mask 0x0000ffff leaves"),
    ],
)
def test_each_fault_fails_the_launch_with_its_cause(
    fault: int, offset: int, shared_bytes: int, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _launch(fault, offset, shared_bytes)
