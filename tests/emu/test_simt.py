"""The emulator's own checks: each rule a kernel can break (tests/emu/faults.cu) fails the
launch with its cause, shared-memory races among them (the race check, off under the
sanitizers), and well-behaved kernels compute what CUDA specifies: a cp.async round trip
through shared memory, collectives of part of a warp, shuffle modes and widths, matches and
reductions, atomics of every warp, and a static __shared__ array that starts each CTA
poisoned."""

from __future__ import annotations

import pytest
import torch

from tests.emu.engine import sanitized
from tests.emu.faults import Fault, launch_fault

race_check = pytest.mark.skipif(sanitized(), reason="the race check is off under the sanitizers")


def test_a_well_behaved_kernel_runs() -> None:
    src, out = launch_fault(Fault.NONE)
    # thread t wrote what thread t + 1 copied in: the barrier published every copy
    assert torch.equal(out.view(64, 16), torch.roll(src.view(64, 16), -1, 0))


def _words(fault: Fault) -> list[list[int]]:
    """Each thread's three result words (the second CTA's)."""
    _, out = launch_fault(fault)
    return out.view(64, 16)[:, :12].contiguous().view(torch.int32).view(64, 3).tolist()


def test_half_warps_meet_in_different_collectives() -> None:
    words = _words(Fault.HALF_WARPS)
    upper = sum(1 << lane for lane in range(16, 32) if lane % 3 == 0)
    for t in range(64):
        assert words[t][0] == (t ^ 1 if t % 32 < 16 else upper), t


def test_shuffle_modes_and_widths() -> None:
    for t, (index, down, up) in enumerate(_words(Fault.SHUFFLE_MODES)):
        assert index == (t & ~7) + 3
        assert down == (t + 5 if t % 16 + 5 < 16 else t)
        assert up == (t - 2 if t % 32 >= 2 else t)


def _unsigned_words(fault: Fault) -> list[list[int]]:
    return [[w % 2**32 for w in words] for words in _words(fault)]


def test_matches_reductions_and_64_bit_shuffles() -> None:
    for t, (match, total, pair) in enumerate(_unsigned_words(Fault.MATCH_REDUCE)):
        warp = t // 32
        assert match == sum(1 << lane for lane in range(32) if lane % 3 == t % 32 % 3)
        assert total == sum(range(32 * warp, 32 * warp + 32))
        assert pair == (t ^ 1) | ((t ^ 1) + 7) << 16


def test_a_lane_waits_while_the_lanes_it_names_finish_another_collective() -> None:
    """Odd lanes reach the closing ballot while the even lanes still match among themselves
    (a mask leaving the odd ones out): legal, as on a GPU."""
    for t, (members, peers, after) in enumerate(_unsigned_words(Fault.FINISH_WITHOUT_ME)):
        assert members == 0x55555555 and after == 0xFFFFFFFF
        assert peers == (0 if t % 2 else 0x11111111 << (t % 4))


@race_check
def test_atomics_of_every_warp_are_no_race() -> None:
    for t, (total, _, _) in enumerate(_words(Fault.ATOMICS)):
        assert total == sum(range(1, 65)), t


def test_static_shared_memory_starts_every_cta_poisoned() -> None:
    for t, (before, neighbour, _) in enumerate(_words(Fault.STATIC_SHARED)):
        assert before == -1  # 0xffffffff, not what the first CTA stored
        assert neighbour == (t + 1) % 64 + 1000  # the second CTA's own stores


@pytest.mark.parametrize(
    "fault,offset,shared_bytes,message",
    [
        (Fault.DIVERGE, 0, 1024, "one is in __ballot_sync (mask 0xffffffff), lane 0 in __shfl_xor"),
        (Fault.DEADLOCK, 0, 1024, "deadlock, 32 threads wait in __syncthreads"),
        (Fault.COPY_PAST_BUFFER, 16, 1024, "outside every registered buffer"),
        (Fault.COPY_PAST_BUFFER, 4, 1024, "cp.async reads 16 bytes at"),
        (Fault.UNALIGNED_LDMATRIX, 0, 1024, "ldmatrix row at shared offset 8: not 16-byte aligned"),
        (Fault.EXIT_IN_COLLECTIVE, 0, 1024, "thread 3: exits while other lanes of warp 0 wait"),
        (Fault.NONE, 0, 60 * 1024, "61440 bytes of dynamic shared memory (the kernel allows 49152"),
        (Fault.STORE_PAST_SHARED, 1024, 1024, "memory written 0 bytes past the launch's 1024"),
        (Fault.SHUFFLE_OUTSIDE_MASK, 0, 1024, "reads lane 16, which the mask 0x0000ffff leaves"),
    ],
)
def test_each_fault_fails_the_launch_with_its_cause(
    fault: Fault, offset: int, shared_bytes: int, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch_fault(fault, offset, shared_bytes)


@race_check
@pytest.mark.parametrize(
    "fault,message",
    [
        (Fault.RACE_ACROSS_WARPS, "thread 32's store writes shared offset 32, which thread 0 read"),
        (Fault.RACE_WITHIN_WARP, "thread 1's store writes shared offset 1, which thread 0 read"),
        (
            Fault.RACE_IN_FLIGHT_COPY,
            "thread 0's load reads shared offset 0, which thread 0's cp.async may still be "
            r"writing \(its group not yet waited for\)",
        ),
        (
            Fault.RACE_STATIC_SHARED,
            "thread 31's load reads byte 252 of a static __shared__ variable at 0x[0-9a-f]+, "
            "which thread 63 wrote",
        ),
        (
            Fault.RACE_ATOMIC_AND_LOAD,
            "thread 0's atomic writes byte 0 of a static __shared__ variable at 0x[0-9a-f]+, "
            "which thread 63 read",
        ),
        (Fault.RACE_LDMATRIX, "thread 32's store writes shared offset 0, which thread 0 read"),
        (
            Fault.RACE_GLOBAL_IN_CTA,
            "thread 32's store writes byte 524 of buffer 1, which thread 0 read",
        ),
        (
            Fault.RACE_GLOBAL_ACROSS_CTAS,
            r"thread 63's load reads byte 1008 of buffer 1, which block \(0, 0, 0\) wrote in "
            "this launch",
        ),
    ],
    ids=lambda case: case.name if isinstance(case, Fault) else "",
)
def test_each_race_fails_the_launch_naming_both_threads(fault: Fault, message: str) -> None:
    with pytest.raises(RuntimeError, match=r"block \([0-9, ]+\) thread [0-9]+: race: " + message):
        launch_fault(fault)
