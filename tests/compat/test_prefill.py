"""Prefill as the reference library's callers use it: signatures, positional and keyword
call forms, the deprecated aliases and the documented examples, on the CPU up to the launch
(a stand-in module records what would be launched).

Reference signatures read from flashinfer-ai/flashinfer: flashinfer/prefill.py at
002920bf8256465171c95d76519ea1cf35244865 (the same parameter lists as at
c91093d3abf362c0e9f8296c0290ac249d2eddf6, which lacked ``workspace_size`` and the ragged
``plan``'s trailing cuDNN arguments).
"""

from __future__ import annotations

import functools

import pytest
import torch

import flashinfer
from flashinfer import prefill as prefill_api
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper as Paged
from flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper as Ragged
from tests.ops.test_prefill import CpuPrefill, cpu_prefill  # noqa: F401 - the fixture

from .signature import assert_signature

_SINGLE_HEAD = (
    "(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, "
    "custom_mask=None, packed_custom_mask=None, causal=False, kv_layout='NHD', "
    "pos_encoding_mode='NONE', use_fp16_qk_reduction=False, sm_scale=None, "
    "window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, "
    "backend='auto', "
)
_SCORE_OVERRIDES = "causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
_PAGED_FORWARD = (
    "(self, q, paged_kv_cache, " + _SCORE_OVERRIDES + "k_scale=None, "
    "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, "
    "rope_scale=None, rope_theta=None)"
)
_RAGGED_FORWARD = (
    "(self, q, k, v, " + _SCORE_OVERRIDES + "window_left=-1, "
    "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)"
)

SIGNATURES = {
    "single_prefill_with_kv_cache": (
        flashinfer.prefill.single_prefill_with_kv_cache,
        _SINGLE_HEAD + "return_lse=False, kv_cache_sf=None, k_scale=None, v_scale=None)",
    ),
    # functools.partial(..., return_lse=True): the keyword and the parameters after it
    # become keyword-only, in the reference's partial too
    "single_prefill_with_kv_cache_return_lse": (
        flashinfer.prefill.single_prefill_with_kv_cache_return_lse,
        _SINGLE_HEAD + "*, return_lse=True, kv_cache_sf=None, k_scale=None, v_scale=None)",
    ),
    "paged __init__": (
        Paged.__init__,
        "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, "
        "qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None, "
        "paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None, "
        "backend='auto', jit_args=None, jit_kwargs=None)",
    ),
    "paged plan": (
        Paged.plan,
        "(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, "
        "num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, "
        "custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode='NONE', "
        "use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, "
        "rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, "
        "o_data_type=None, non_blocking=True, prefix_len_ptr=None, "
        "token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, "
        "seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None, "
        "max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False)",
    ),
    "paged run": (
        Paged.run,
        "(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, "
        "out=None, lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, "
        "kv_cache_sf=None, skip_softmax_threshold_scale_factor=None)",
    ),
    "paged forward": (Paged.forward, _PAGED_FORWARD),
    "paged forward_return_lse": (Paged.forward_return_lse, _PAGED_FORWARD),
    "paged reset_workspace_buffer": (
        Paged.reset_workspace_buffer,
        "(self, float_workspace_buffer, int_workspace_buffer)",
    ),
    "paged end_forward": (Paged.end_forward, "(self)"),
    "ragged __init__": (
        Ragged.__init__,
        "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, "
        "qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, "
        "backend='auto', jit_args=None, jit_kwargs=None)",
    ),
    "ragged plan": (
        Ragged.plan,
        "(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, "
        "head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False, "
        "pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "q_data_type='float16', kv_data_type=None, o_data_type=None, non_blocking=True, "
        "prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, "
        "max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False, "
        "seq_lens=None, seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None, "
        "v_indptr=None, o_indptr=None)",
    ),
    "ragged run": (
        Ragged.run,
        "(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, "
        "out=None, lse=None, return_lse=False, enable_pdl=None, kv_cache_sf=None)",
    ),
    "ragged forward": (Ragged.forward, _RAGGED_FORWARD),
    "ragged forward_return_lse": (Ragged.forward_return_lse, _RAGGED_FORWARD),
    "ragged reset_workspace_buffer": (
        Ragged.reset_workspace_buffer,
        "(self, float_workspace_buffer, int_workspace_buffer)",
    ),
    "ragged end_forward": (Ragged.end_forward, "(self)"),
}


@pytest.mark.parametrize("name", SIGNATURES)
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(*SIGNATURES[name])


@pytest.mark.parametrize("wrapper", [Paged, Ragged])
def test_aliases_are_the_references(wrapper: type) -> None:
    assert wrapper.begin_forward is wrapper.plan
    method = wrapper.__dict__["run_return_lse"]
    assert isinstance(method, functools.partialmethod)
    assert method.func is wrapper.__dict__["run"] and method.keywords == {"return_lse": True}


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


def _causal_masks(qo_lens: list[int], kv_lens: list[int]) -> torch.Tensor:
    """The reference's documented custom mask: per request, the bottom-right causal mask
    ``tril(ones(qo_len, kv_len), diagonal=kv_len - qo_len)``, flattened and concatenated."""
    return torch.cat(
        [
            torch.tril(torch.full((q, k), True), diagonal=k - q).flatten()
            for q, k in zip(qo_lens, kv_lens)
        ]
    )


def test_the_paged_example_of_the_reference(cpu_prefill: CpuPrefill) -> None:
    """The reference docstring's example (smaller), with the default float16 q_data_type."""
    num_qo_heads, num_kv_heads, head_dim, page_size, max_num_pages = 16, 4, 128, 16, 32
    qo_indptr = _i32([0, 9, 11, 17, 20])
    paged_kv_indices = torch.arange(max_num_pages).int()
    paged_kv_indptr = _i32([0, 5, 7, 20, 32])
    paged_kv_last_page_len = _i32([1, 7, 14, 16])
    kv_cache = _half(max_num_pages, 2, page_size, num_kv_heads, head_dim)
    wrapper = Paged(torch.zeros(16 << 20, dtype=torch.uint8), "NHD")
    wrapper.plan(
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=True,
    )
    q = _half(20, num_qo_heads, head_dim)
    out = wrapper.run(q, kv_cache)
    assert out.shape == (20, num_qo_heads, head_dim) and out.dtype == torch.float16
    assert cpu_prefill.launches[-1]["causal"] is True

    kv_lens = [
        (e - s - 1) * page_size + last
        for s, e, last in zip(
            paged_kv_indptr.tolist(), paged_kv_indptr[1:].tolist(), paged_kv_last_page_len.tolist()
        )
    ]
    mask = _causal_masks([9, 2, 6, 3], kv_lens)
    wrapper.plan(
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        custom_mask=mask,
    )
    out_custom = wrapper.run(q, kv_cache)
    assert out_custom.shape == out.shape
    launch = cpu_prefill.launches[-1]
    assert launch["custom_mask"] is not None and launch["causal"] is False


def test_the_ragged_example_of_the_reference(cpu_prefill: CpuPrefill) -> None:
    num_qo_heads, num_kv_heads, head_dim = 16, 4, 128
    qo_indptr = _i32([0, 33, 44, 55, 66, 77, 88, 100])
    kv_indptr = qo_indptr.clone()
    wrapper = Ragged(torch.empty(16 << 20, dtype=torch.uint8), "NHD")
    wrapper.plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, causal=True)
    q, k, v = _half(100, num_qo_heads, head_dim), _half(100, 4, 128), _half(100, 4, 128)
    out = wrapper.run(q, k, v)
    assert out.shape == (100, num_qo_heads, head_dim)
    lens = [33, 11, 11, 11, 11, 11, 12]
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        custom_mask=_causal_masks(lens, lens),
    )
    wrapper.run(q, k, v)
    assert cpu_prefill.launches[-1]["custom_mask"].numel() == sum((n * n + 7) // 8 for n in lens)


def test_plan_binds_every_optional_argument_positionally(cpu_prefill: CpuPrefill) -> None:
    table = (_i32([0, 3, 5]), _i32([0, 2, 3]), _i32([4, 1, 0]), _i32([5, 16]))
    paged = Paged(torch.empty(1 << 20, dtype=torch.uint8))
    # head_dim_vo, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
    # use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
    # q_data_type, kv_data_type, o_data_type, non_blocking, prefix_len_ptr,
    # token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr, seq_lens, seq_lens_q,
    # block_tables, max_token_per_sequence, max_sequence_kv, fixed_split_size, disable_split_kv
    paged.plan(
        *table,
        8,
        2,
        128,
        16,
        128,
        None,
        None,
        True,
        "NONE",
        False,
        0.5,
        9,
        30.0,
        1.0,
        1e4,
        "bfloat16",
        "bfloat16",
        torch.bfloat16,
        False,
        None,
        None,
        0,
        None,
        _i32([21, 16]),
        None,
        torch.zeros(2, 2, dtype=torch.int32),
        3,
        21,
        1,
        True,
    )
    assert (paged._causal, paged._sm_scale, paged._window_left, paged._logits_soft_cap) == (
        True,
        0.5,
        9,
        30.0,
    )
    assert paged._cached_q_data_type == torch.bfloat16 and cpu_prefill.uploads[-1][:2] == [2, 1]
    assert (paged._max_q_len, paged._max_kv_len) == (3, 21)
    ragged = Ragged(torch.empty(1 << 20, dtype=torch.uint8))
    # ... the ragged order: window_left before logits_soft_cap and sm_scale, the split
    # options before seq_lens, then v_indptr and o_indptr
    ragged.plan(
        _i32([0, 3, 5]),
        _i32([0, 21, 37]),
        8,
        2,
        128,
        None,
        None,
        None,
        False,
        "NONE",
        False,
        4,
        0.0,
        0.25,
        None,
        None,
        "float16",
        None,
        None,
        True,
        None,
        None,
        0,
        None,
        None,
        False,
        None,
        None,
        None,
        None,
        None,
        None,
    )
    assert (ragged._window_left, ragged._sm_scale, ragged._causal) == (4, 0.25, False)


def test_deprecated_forms_bind(cpu_prefill: CpuPrefill) -> None:
    ragged = Ragged(torch.empty(1 << 20, dtype=torch.uint8))
    ragged.begin_forward(_i32([0, 3, 5]), _i32([0, 21, 37]), 8, 2, 128)
    q, k = _half(5, 8, 128), _half(37, 2, 128)
    # causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
    # sm_scale, rope_scale, rope_theta
    ragged.forward(q, k, k, True, "NONE", False, -1, None, 0.1, 1.0, 1e4)
    out, lse = ragged.forward_return_lse(q, k, k, False)
    assert lse.shape == (5, 8) and ragged.run_return_lse(q, k, k)[1].shape == (5, 8)
    ragged.end_forward()
    paged = Paged(torch.empty(1 << 20, dtype=torch.uint8))
    paged.begin_forward(
        _i32([0, 3, 5]), _i32([0, 2, 3]), _i32([4, 1, 0]), _i32([5, 16]), 8, 2, 128, 16
    )
    cache = _half(5, 2, 16, 2, 128)
    # ... with k_scale and v_scale after use_fp16_qk_reduction
    paged.forward(q, cache, True, "NONE", False, 1.0, 1.0, -1, None, None, None, None)
    out, lse = paged.forward_return_lse(q, (cache[:, 0], cache[:, 1]), False)
    assert out.shape == q.shape and lse.shape == (5, 8)
    paged.end_forward()


def test_single_prefill_call_forms_reach_the_device_check() -> None:
    q, k = _half(5, 8, 128), _half(10, 2, 128)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashinfer.prefill.single_prefill_with_kv_cache(
            q,
            k,
            k,
            None,
            None,
            None,
            torch.float16,
            None,
            None,
            True,
            "NHD",
            "NONE",
            False,
            0.5,
            -1,
            None,
            1.0,
            1e4,
            "auto",
            True,
            None,
            1.0,
            1.0,
        )
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        prefill_api.single_prefill_with_kv_cache_return_lse(
            q, k, k, custom_mask=torch.ones(5, 10, dtype=torch.bool), backend="fa2"
        )
