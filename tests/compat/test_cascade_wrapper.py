"""MultiLevelCascadeAttentionWrapper as the reference library's callers use it: signatures,
aliases, the attributes engines read, positional plan() arguments and the documented
example, on the CPU up to the launch (stand-in modules compute what the kernels would).

Reference signatures read from flashinfer-ai/flashinfer: flashinfer/cascade.py at
01c897d7075594003c411c0aa5e3befdf0bcae94.
"""

from __future__ import annotations

import torch

import flashinfer
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper as Cascade
from tests.ops.test_cascade_wrapper import (  # noqa: F401 - the fixtures
    CascadeBatch,
    CpuAttention,
    cpu_attention,
    expected_output,
)
from tests.ops.test_prefill import cpu_prefill  # noqa: F401 - the fixture cpu_attention uses

from .signature import assert_signature


def test_signatures_match_the_reference() -> None:
    assert_signature(
        Cascade.__init__,
        "(self, num_levels, float_workspace_buffer, kv_layout='NHD', "
        "use_cuda_graph=False, qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None, "
        "paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None)",
    )
    assert_signature(
        Cascade.plan,
        "(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, "
        "paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, "
        "causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
        "sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, "
        "rope_theta=None, q_data_type='float16', kv_data_type=None)",
    )
    assert_signature(Cascade.run, "(self, q, paged_kv_cache)")
    assert_signature(Cascade.forward, "(self, q, paged_kv_cache)")
    assert_signature(
        Cascade.reset_workspace_buffer, "(self, float_workspace_buffer, int_workspace_buffers)"
    )
    assert_signature(Cascade.prewarm_paged_kv_stride_variant, "(self, variant='independent')")


def test_aliases_are_the_references() -> None:
    assert Cascade.begin_forward is Cascade.plan
    assert Cascade.forward is Cascade.run


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_the_example_of_the_reference(cpu_attention: CpuAttention) -> None:
    """The reference docstring's example (smaller, two layers): a decode step of 7 requests
    over a shared prefix of full pages and each request's own pages, float16 by default."""
    num_layers, num_qo_heads, num_kv_heads, head_dim, page_size = 2, 16, 4, 128, 16
    batch_size, shared_kv_num_pages, unique_kv_num_pages = 7, 6, 20
    total_num_pages = shared_kv_num_pages + unique_kv_num_pages
    wrapper = Cascade(2, torch.empty(16 << 20, dtype=torch.uint8), "NHD")
    shared_kv_page_indices = torch.arange(shared_kv_num_pages).int()
    shared_kv_page_indptr = _i32([0, shared_kv_num_pages])
    unique_kv_page_indices = torch.arange(shared_kv_num_pages, total_num_pages).int()
    unique_kv_page_indptr = _i32([0, 3, 5, 9, 10, 13, 16, 20])
    shared_kv_last_page_len = _i32([page_size])
    unique_kv_last_page_len = _i32([1, 7, 14, 4, 3, 1, 16])
    kv_cache_at_layer = [
        torch.randn(total_num_pages, 2, page_size, num_kv_heads, head_dim, dtype=torch.float16)
        for _ in range(num_layers)
    ]
    qo_indptr_arr = [_i32([0, batch_size]), torch.arange(batch_size + 1, dtype=torch.int32)]
    wrapper.plan(
        qo_indptr_arr,
        [shared_kv_page_indptr, unique_kv_page_indptr],
        [shared_kv_page_indices, unique_kv_page_indices],
        [shared_kv_last_page_len, unique_kv_last_page_len],
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
    )
    outputs = []
    for i in range(num_layers):
        q = torch.randn(batch_size, num_qo_heads, head_dim).half()
        outputs.append((q, wrapper.run(q, kv_cache_at_layer[i])))
    assert outputs[0][1].shape == (7, 16, 128) and outputs[0][1].dtype == torch.float16

    ends = unique_kv_page_indptr.tolist()
    segments = [
        [
            (shared_kv_page_indices, shared_kv_num_pages * page_size),
            (
                unique_kv_page_indices[ends[b] : ends[b + 1]],
                (ends[b + 1] - ends[b] - 1) * page_size + int(unique_kv_last_page_len[b]),
            ),
        ]
        for b in range(batch_size)
    ]
    batch = CascadeBatch([1] * batch_size, [], segments)
    for (q, out), cache in zip(outputs, kv_cache_at_layer):
        expected = expected_output(batch, q, cache[:, 0], cache[:, 1], causal=False)
        torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=1e-2)


def test_plan_binds_every_option_positionally(cpu_attention: CpuAttention) -> None:
    wrapper = flashinfer.cascade.MultiLevelCascadeAttentionWrapper(
        2, torch.empty(1 << 20, dtype=torch.uint8), "HND", False, None, None, None, None
    )
    tables = (
        [_i32([0, 3]), _i32([0, 1, 3])],
        [_i32([0, 2]), _i32([0, 1, 2])],
        [_i32([0, 1]), _i32([2, 3])],
        [_i32([16]), _i32([5, 9])],
    )
    # causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
    # logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type
    wrapper.begin_forward(
        *tables,
        8,
        2,
        64,
        16,
        True,
        "NONE",
        False,
        0.5,
        9,
        30.0,
        1.0,
        1e4,
        "bfloat16",
        torch.bfloat16,
    )
    first, last = wrapper._batch_prefill_wrappers
    assert (first._causal, last._causal) == (False, True)
    for level in (first, last):
        assert (level._sm_scale, level._window_left, level._logits_soft_cap) == (0.5, 9, 30.0)
        assert (level._rope_scale, level._rope_theta) == (1.0, 1e4)
        assert level._cached_q_data_type == torch.bfloat16 and level._kv_layout == "HND"
    assert (wrapper._num_levels, wrapper._kv_layout, wrapper._use_cuda_graph) == (2, "HND", False)
    assert not wrapper.is_cuda_graph_enabled
    q = torch.randn(3, 8, 64, dtype=torch.bfloat16)
    cache = torch.randn(4, 2, 2, 16, 64, dtype=torch.bfloat16)  # HND pages
    assert wrapper.forward(q, cache).shape == (3, 8, 64)
    assert wrapper.run(q, (cache[:, 0], cache[:, 1])).shape == (3, 8, 64)
    wrapper.prewarm_paged_kv_stride_variant()
