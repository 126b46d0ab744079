"""The sampling kernels' own source, run on the CPU by the emulator (tests/emu), through the
real APIs and binding: softmax, top-k/top-p renormalization and logit masking against the
exact references; every sampler's tokens against the host model of the exponential race
over its allowed set (the same Philox words, so each token is named exactly, not only in
distribution); the counter layout at offsets in and across Philox blocks, per-row seed and
offset tensors, rows crowding whole warps into one histogram bin (warp-aggregated adds and
the carry between a bin's two 32-bit words), top-p's independence of the row's scale, 64-bit
indices and top-k, signed zeros, degenerate rows and out-of-range parameters. The checks are
tests/ops/test_sampling.py's, at sizes the emulator runs in seconds; its GPU tests run them
at GPU sizes."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest
import torch

from flashinfer import sampling as sampling_api
from flashinfer.jit.sampling import gen_sampling_module
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.emu.profile import PROFILED
from tests.ops import test_sampling as checks
from tests.ops.test_sampling import SAMPLER_IDS, SAMPLERS, Allowed, Api

OUTPUTS = {
    "softmax": ("out",),
    "sampling_from_probs": ("out", "valid"),
    "sampling_from_logits": ("out",),
    "renorm_probs": ("out",),
    "top_k_mask_logits": ("out",),
}
CPU = "cpu"


@functools.cache
def _module(dtype: torch.dtype, reverse: bool) -> EmulatedModule:
    return EmulatedModule(gen_sampling_module(dtype), OUTPUTS, reverse=reverse)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """emulate(reverse=False): the sampling APIs then run the emulated modules (a CTA's
    threads last first with ``reverse``) on CPU tensors; returns their device."""

    def install(reverse: bool = False) -> str:
        monkeypatch.setattr(sampling_api, "get_sampling_module", lambda d: _module(d, reverse))
        return CPU

    with on_cpu_tensors(monkeypatch, sampling_api):
        yield install


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 4097])
def test_softmax_matches_torch(emulate, dtype: torch.dtype, vocab: int) -> None:
    checks.check_softmax(emulate(), dtype, vocab)


@pytest.mark.parametrize("vocab", [10, 1000, 4097])
def test_top_k_renorm_and_mask_match_the_reference(emulate, vocab: int) -> None:
    checks.check_top_k_renorm_and_mask(emulate(reverse=vocab == 1000), vocab)


def test_top_k_keeps_ties_with_the_kth(emulate) -> None:
    checks.check_top_k_keeps_ties(emulate())


@pytest.mark.parametrize("vocab", [10, 1000, 4097])
def test_top_p_renorm_matches_the_reference(emulate, vocab: int) -> None:
    checks.check_top_p_renorm(emulate(reverse=vocab == 4097), vocab)


@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=SAMPLER_IDS)
@pytest.mark.parametrize("vocab", [3, 4097])
def test_every_token_lies_in_the_allowed_set(
    emulate, name: str, api: Api, kwargs: dict, allowed: Allowed, vocab: int
) -> None:
    checks.check_tokens_in_allowed_set(emulate(), api, kwargs, allowed, vocab, batch=8, draws=2)


@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=SAMPLER_IDS)
@pytest.mark.parametrize("offset", [6, 2**64 - 3])
def test_filtered_tokens_follow_the_race(
    emulate, name: str, api: Api, kwargs: dict, allowed: Allowed, offset: int
) -> None:
    checks.check_filtered_tokens_follow_the_race(emulate(), api, kwargs, allowed, offset)


def test_per_request_parameters_apply_row_by_row(emulate) -> None:
    checks.check_per_request_parameters(emulate(), draws=3)


@pytest.mark.parametrize("vocab", [33, 4099])
@pytest.mark.parametrize("shift", [0, 1])
def test_crowded_histogram_bins_select_exact_sets(emulate, vocab: int, shift: int) -> None:
    checks.check_crowded_histogram_bins(emulate(reverse=shift == 1), vocab, shift)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_tokens_follow_the_race(emulate, dtype: torch.dtype) -> None:
    checks.check_logits_tokens_follow_the_race(emulate(), dtype)


def test_top_k_top_p_from_logits_is_softmax_then_probs(emulate) -> None:
    checks.check_logits_filters_are_softmax_then_probs(emulate(), batch=4)


def test_same_seed_same_tokens_and_generators_advance(emulate) -> None:
    checks.check_same_seed_same_tokens(emulate(), batch=8, vocab=2000)


def test_degenerate_rows(emulate) -> None:
    checks.check_degenerate_rows(emulate())


def test_indices_map_outputs_to_rows_and_out_of_range_yields_minus_one(emulate) -> None:
    checks.check_indices_map_outputs_to_rows(emulate())


def test_check_nan_raises(emulate) -> None:
    checks.check_nan_raises(emulate())


@pytest.mark.parametrize("offset", checks.OFFSETS)
def test_tokens_follow_the_documented_counter_layout(emulate, offset: int) -> None:
    checks.check_counter_layout(emulate(), offset)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_seed_and_offset_tensors_per_row_and_shared(emulate, dtype: torch.dtype) -> None:
    checks.check_seed_and_offset_tensors(emulate(), dtype)


@pytest.mark.parametrize("scale", checks.POWER_SCALES)
def test_top_p_set_does_not_depend_on_the_rows_scale(emulate, scale: float) -> None:
    checks.check_top_p_set_is_scale_free(emulate(), scale, batch=4, vocab=4000)


@pytest.mark.parametrize("scale", checks.SCALES)
def test_top_p_matches_the_reference_at_any_row_scale(emulate, scale: float) -> None:
    checks.check_top_p_at_any_scale(emulate(), scale, batch=4, vocab=4000)


def test_wide_indices_and_top_k_are_not_narrowed(emulate) -> None:
    checks.check_wide_indices_and_top_k(emulate())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_signed_zeros_tie_in_the_key_order(emulate, dtype: torch.dtype) -> None:
    checks.check_signed_zeros_tie(emulate(), dtype)


def test_return_valid_flags_rows_with_nothing_to_draw(emulate) -> None:
    checks.check_return_valid(emulate())


def test_16_and_64_bit_inputs(emulate) -> None:
    checks.check_16_and_64_bit_inputs(emulate())


def test_softmax_temperature_zero_or_inf_is_uniform_over_finite_logits(emulate) -> None:
    checks.check_temperature_zero_or_inf(emulate())


def test_out_of_range_parameters_follow_the_documented_meaning(emulate) -> None:
    checks.check_out_of_range_parameters(emulate())


@PROFILED
def test_shared_memory_without_bank_conflicts_and_loads_of_whole_sectors(emulate) -> None:
    """The memory profile (tests/emu/profile.py) of top-k then top-p sampling over rows of
    4096 (the vector path): the histograms' clearing and scans, the block reductions and the
    shared results take the fewest wavefronts (the bins' atomic adds, whose banks follow the
    data, are not counted), and the rows' loads read whole 32-byte sectors."""
    device = emulate()
    probs = torch.rand(4, 4096, generator=torch.Generator().manual_seed(5))
    with _module(torch.float32, False).profiling() as profile:
        tokens = sampling_api.top_k_top_p_sampling_from_probs(probs, 40, 0.8, seed=1, offset=0)
    assert tokens.device.type == device and ((tokens >= 0) & (tokens < 4096)).all()
    kinds = ("shared load", "shared store", "global load")
    assert {s.kind for s in profile.in_file("sampling.cuh")} >= set(kinds)
    assert not profile.excessive(("sampling.cuh", "vec.cuh"), kinds), profile.table()
