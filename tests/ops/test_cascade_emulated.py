"""The state-merging kernels (include/flashinfer/cascade.cuh, the cascade module behind
merge_state, merge_state_in_place and merge_states) run on the CPU by the emulator
(tests/emu), against the softmax merge formula in base 2: empty states, the in-place merge
under a mask, five states at once, and NaN states, which must stay NaN. The checks are
tests/ops/test_decode.py's, which its GPU tests also run."""

from __future__ import annotations

import functools
from typing import Iterator

import pytest
import torch

from flashinfer import cascade as cascade_api
from flashinfer.jit.decode import gen_cascade_module
from tests.emu.module import EmulatedModule, emulating
from tests.ops.test_decode import (
    check_merge_state,
    check_merging_empty_shapes,
    check_merging_nan_states,
)

OUTPUTS = {"merge_state": ("v_out", "s_out"), "merge_states": ("v_out", "s_out")}


@functools.cache
def _module(dtype: torch.dtype) -> EmulatedModule:
    return EmulatedModule(gen_cascade_module(dtype), OUTPUTS)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """CPU: the merge APIs then run the emulated modules on CPU tensors."""
    with emulating(monkeypatch, cascade_api, "get_cascade_module", _module) as cpu:
        yield cpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_state_matches_the_softmax_merge_formula(device: str, dtype: torch.dtype) -> None:
    check_merge_state(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merging_nan_states(device: str, dtype: torch.dtype) -> None:
    check_merging_nan_states(device, dtype)


def test_merging_empty_shapes(device: str) -> None:
    check_merging_empty_shapes(device)
