"""The RoPE kernel's own source, run on the CPU by the emulator (tests/emu), through the real
APIs and binding, against the complex-rotation reference: NeoX and interleaved pairs, partial
rotary dims (the rest copied), in place and out of place, int32 and int64 positions, ragged
batches, Llama 3.1's smoothed frequencies, and the cos/sin cache with a position past its
rows (NaN, never a read past it). The checks are tests/ops/test_rope.py's, which its GPU
tests also run."""

from __future__ import annotations

import functools
from typing import Iterator

import pytest
import torch

from flashinfer import rope as rope_api
from flashinfer.jit.rope import gen_rope_module
from tests.emu.module import EmulatedModule, emulating
from tests.ops import test_rope as checks

OUTPUTS = {
    name: ("q_out", "k_out")
    for name in ("apply_rope_pos_ids", "apply_llama31_rope_pos_ids", "apply_rope_cos_sin_cache")
}


@functools.cache
def _module(dtype: torch.dtype) -> EmulatedModule:
    return EmulatedModule(gen_rope_module(dtype), OUTPUTS)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """CPU: the RoPE APIs then run the emulated modules on CPU tensors."""
    with emulating(monkeypatch, rope_api, "get_rope_module", _module) as cpu:
        yield cpu


# (dtype, interleave, head_dim, rotary_dim, inplace, positions' dtype)
CASES = [
    (torch.float16, False, 64, 64, False, torch.int64),
    (torch.bfloat16, True, 128, 128, True, torch.int32),
    (torch.float32, False, 128, 64, True, torch.int64),
    (torch.float16, True, 256, 96, False, torch.int32),
    (torch.bfloat16, False, 256, 96, True, torch.int64),
]


@pytest.mark.parametrize(
    "dtype,interleave,head_dim,rotary_dim,inplace,pos_dtype",
    CASES,
    ids=[f"{str(c[0])[6:]}-{'gptj' if c[1] else 'neox'}-{c[2]}/{c[3]}-{c[4]}" for c in CASES],
)
def test_rope_pos_ids_matches_the_complex_reference(
    device: str,
    dtype: torch.dtype,
    interleave: bool,
    head_dim: int,
    rotary_dim: int,
    inplace: bool,
    pos_dtype: torch.dtype,
) -> None:
    checks.check_rope_pos_ids(device, dtype, interleave, head_dim, rotary_dim, inplace, pos_dtype)


@pytest.mark.parametrize("interleave", [False, True])
def test_ragged_batches_and_llama31(device: str, interleave: bool) -> None:
    checks.check_ragged_batches_and_llama31(device, interleave)


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_and_out_of_range_positions(device: str, is_neox: bool) -> None:
    checks.check_cos_sin_cache(device, is_neox)
