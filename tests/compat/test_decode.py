"""Decode and cascade as the reference library's callers use them: signatures, call forms,
the attributes engines read, CUDA-graph buffer semantics and the split-KV options, all on
the CPU up to the launch (a stand-in module records what would be launched).

Reference signatures read from flashinfer-ai/flashinfer: flashinfer/decode.py at
002752ae3615318e75b95e2eeb716242233c0fdd, flashinfer/cascade.py at
01c897d7075594003c411c0aa5e3befdf0bcae94.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import flashinfer
from flashinfer.attention_args import score_params
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper as Wrapper
from flashinfer.decode import fast_decode_plan
from flashinfer.jit.decode import BATCH_DECODE_ARGS
from tests.ops.test_decode import CpuPlan, cpu_plan  # noqa: F401 - the fixture

from .signature import assert_signature

LOG2E = 1.4426950408889634

SIGNATURES = {
    "single_decode_with_kv_cache": (
        flashinfer.single_decode_with_kv_cache,
        "(q, k, v, kv_layout='NHD', pos_encoding_mode='NONE', use_tensor_cores=False, "
        "q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, "
        "sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False)",
    ),
    "__init__": (
        Wrapper.__init__,
        "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, "
        "use_tensor_cores=False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, "
        "paged_kv_last_page_len_buffer=None, backend='auto', jit_args=None)",
    ),
    "plan": (
        Wrapper.plan,
        "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, "
        "page_size, *deprecated_positional_args, **kwargs)",
    ),
    "plan keywords": (
        Wrapper._plan_impl,
        "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, "
        "page_size, *, pos_encoding_mode='NONE', window_left=-1, window_right=0, "
        "logits_soft_cap=None, q_data_type='float16', kv_data_type=None, o_data_type=None, "
        "data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, "
        "block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False, "
        "q_len_per_req=1)",
    ),
    "run": (
        Wrapper.run,
        "(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, "
        "lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, "
        "q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None)",
    ),
    "forward": (
        Wrapper.forward,
        "(self, q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, "
        "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, "
        "rope_theta=None)",
    ),
    "forward_return_lse": (
        Wrapper.forward_return_lse,
        "(self, q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, "
        "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, "
        "rope_theta=None)",
    ),
    "reset_workspace_buffer": (
        Wrapper.reset_workspace_buffer,
        "(self, float_workspace_buffer, int_workspace_buffer)",
    ),
    "end_forward": (Wrapper.end_forward, "(self)"),
    "CUDAGraph wrapper": (
        flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__,
        "(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, "
        "kv_layout='NHD', use_tensor_cores=False)",
    ),
    "fast_decode_plan": (
        fast_decode_plan,
        "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, "
        "page_size, pos_encoding_mode='NONE', window_left=-1, logits_soft_cap=None, "
        "q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, "
        "rope_theta=None, non_blocking=True, fixed_split_size=None, disable_split_kv=False, "
        "q_len_per_req=1, global_override_indptr_cpu=None)",
    ),
    "merge_state": (flashinfer.merge_state, "(v_a, s_a, v_b, s_b)"),
    "merge_state_in_place": (
        flashinfer.merge_state_in_place,
        "(v, s, v_other, s_other, mask=None)",
    ),
    "merge_states": (flashinfer.merge_states, "(v, s)"),
}


@pytest.mark.parametrize("name", SIGNATURES)
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(*SIGNATURES[name])


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


# two requests of 21 and 16 tokens, pages of 16, 8 query heads over 2 KV heads, head_dim 128
TABLE = (_i32([0, 2, 3]), _i32([4, 1, 0]), _i32([5, 16]))
SHAPE = (8, 2, 128, 16)


def _wrapper(**kwargs) -> Wrapper:  # noqa: ANN003
    return Wrapper(torch.empty(1 << 20, dtype=torch.uint8), **kwargs)


def _cache() -> tuple[torch.Tensor, torch.Tensor]:
    return _bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)


def test_plan_accepts_the_deprecated_positional_order(cpu_plan: CpuPlan) -> None:
    w = _wrapper()
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        # pos_encoding_mode, window_left, logits_soft_cap, q_data_type
        w.plan(*TABLE, *SHAPE, "NONE", 40, 30.0, torch.bfloat16)
    assert (w._window_left, w._logits_soft_cap, w._cached_q_data_type) == (40, 30.0, torch.bfloat16)
    with pytest.raises(TypeError, match="multiple values for argument 'window_left'"):
        w.plan(*TABLE, *SHAPE, "NONE", 40, window_left=3)
    with pytest.raises(TypeError, match="at most 16 optional positional arguments"):
        w.plan(*TABLE, *SHAPE, *([None] * 17))
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        w.plan(*TABLE, *SHAPE, no_such_option=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keyword form warns nothing
        w.begin_forward(
            *TABLE,
            *SHAPE,
            data_type="bfloat16",
            non_blocking=False,
            block_tables=torch.zeros(2, 2, dtype=torch.int32),
        )
    assert w._cached_q_data_type == torch.bfloat16 and w._window_left == -1


# vLLM's fast_plan_decode passes plan()'s options positionally in the order of the release it
# pins: before o_data_type (vllm-project/vllm at 5314c90d: 10 of them; at 00a817ad: 14, up to
# disable_split_kv) and after it (its current form: 15).
BEFORE_O_DTYPE = ("NONE", 40, 30.0, torch.bfloat16, torch.bfloat16, None, 0.2, None, None, True)
TODAYS_ORDER = ("NONE", 40, 30.0, torch.bfloat16, torch.bfloat16, None, None, 0.2, None, None)


@pytest.mark.parametrize(
    "options",
    [
        BEFORE_O_DTYPE,
        (*BEFORE_O_DTYPE, None, None, 1, False),
        (*TODAYS_ORDER, True, None, None, 1, False),
        TODAYS_ORDER[:7],
    ],
    ids=["vllm-5314c90d", "vllm-00a817ad", "vllm-current", "todays-7"],
)
def test_plan_binds_each_positional_order_vllm_passes(cpu_plan: CpuPlan, options) -> None:
    w = _wrapper()
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        w.plan(*TABLE, *SHAPE, *options)
    sm_scale = None if len(options) == 7 else 0.2
    assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (40, 30.0, sm_scale)
    assert (w._cached_q_data_type, w._cached_kv_data_type) == (torch.bfloat16, torch.bfloat16)
    w.run(_bf16(2, 8, 128), _cache())
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["window_left"] == 40
    assert launch["score_scale"] == pytest.approx((sm_scale or 128**-0.5) / 30.0)
    if len(options) > 10:  # fixed_split_size=1 page: chunks of 16 tokens
        assert w._plan_info.schedule.chunk_size == 16


PLAN_BAD = [
    ("window_right must be 0", ValueError, dict(window_right=5)),
    ("q_len_per_req=2 needs use_tensor_cores=True", ValueError, dict(q_len_per_req=2)),
    (
        "o_data_type torch.float16 differs from q_data_type torch.bfloat16",
        TypeError,
        dict(o_data_type=torch.float16),
    ),
    (
        "kv_data_type torch.float32 is not a supported dtype; supported: torch.bfloat16, "
        "torch.float8_e4m3fn, torch.float8_e5m2",
        TypeError,
        dict(kv_data_type=torch.float32),
    ),
    ("fixed_split_size must be >= 1", ValueError, dict(fixed_split_size=0)),
    ("disable_split_kv must be a bool", TypeError, dict(disable_split_kv=None)),
    ("non_blocking must be a bool", TypeError, dict(non_blocking=1)),
    ("seq_lens has 3 elements, expected 2", ValueError, dict(seq_lens=_i32([1, 2, 3]))),
    ("rope_scale must be > 0.0", ValueError, dict(rope_scale=-1.0)),
]


@pytest.mark.parametrize("message,error,kwargs", PLAN_BAD, ids=[b[0][:30] for b in PLAN_BAD])
def test_plan_rejects_each_unsupported_keyword_value(
    cpu_plan: CpuPlan, message, error, kwargs
) -> None:
    with pytest.raises(error, match=message):
        _wrapper().plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, **kwargs)
    assert cpu_plan.uploads == []


def test_split_options_reach_the_schedule(cpu_plan: CpuPlan) -> None:
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, fixed_split_size=1)  # 1 page = 16 tokens
    assert cpu_plan.uploads[-1][:2] == [3, 16]  # 21 tokens -> 2 chunks, 16 -> 1
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, fixed_split_size=1, disable_split_kv=True)
    assert cpu_plan.uploads[-1][:2] == [2, 1]
    w.plan(
        *TABLE, *SHAPE, q_data_type=torch.bfloat16, fixed_split_size=1, seq_lens=_i32([40, 16])
    )  # the schedule follows seq_lens: 40 -> 3 chunks
    assert cpu_plan.uploads[-1][:2] == [4, 16]


def _launch_args(launch: tuple) -> dict:
    """A recorded batch_decode launch by the binding's argument names."""
    assert len(launch) == len(BATCH_DECODE_ARGS)
    return dict(zip(BATCH_DECODE_ARGS, launch))


def test_every_cache_form_and_run_keyword(cpu_plan: CpuPlan) -> None:
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, sm_scale=0.5)
    q = _bf16(2, 8, 128)
    k, v = _cache()
    forms = [(k, v), [k, v], torch.stack([k, v], dim=1)]
    for form in forms:
        out = w.run(q, form)
        assert out.shape == q.shape and bool((out == 1).all())
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["k_cache"].shape == (5, 16, 2, 128) and not launch["hnd"]
    assert launch["score_scale"] == pytest.approx(0.5 * LOG2E) and launch["score_cap"] == 0.0
    assert launch["kv_indptr"] is w._paged_kv_indptr_buf and launch["window_left"] == -1

    out, lse = w.run(
        q, (k, v), q_scale=2.0, k_scale=3.0, v_scale=0.25, return_lse=True, enable_pdl=False
    )
    launch = _launch_args(cpu_plan.launches[-1])
    assert (
        launch["score_scale"] == pytest.approx(0.5 * 6.0 * LOG2E) and launch["enable_pdl"] is False
    )
    assert bool((out == 0.25).all()) and lse.shape == (2, 8) and lse.dtype == torch.float32
    out, lse = w.run_return_lse(q, (k, v))
    assert lse is _launch_args(cpu_plan.launches[-1])["lse"]

    w._sm_scale = 0.125  # engines set planned parameters directly; run() reads them
    w.run(q, (k, v), window_left=-1)
    assert _launch_args(cpu_plan.launches[-1])["score_scale"] == pytest.approx(0.125 * LOG2E)
    w.forward(q, (k, v), sm_scale=0.3, logits_soft_cap=20.0, window_left=7)
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["score_scale"] == pytest.approx(0.3 / 20.0)
    assert launch["score_cap"] == pytest.approx(20.0 * LOG2E) and launch["window_left"] == 7
    out, lse = w.forward_return_lse(q, torch.stack([k, v], dim=1))
    assert lse.shape == (2, 8) and w._window_left == -1
    w.end_forward()

    bad = [
        ("window_left=3 differs from the planned -1", ValueError, dict(window_left=3)),
        ("sinks is not supported", ValueError, dict(sinks=torch.zeros(8))),
        ("kv_cache_sf is not supported", ValueError, dict(kv_cache_sf=(k, v))),
        ("v_scale must be a float", TypeError, dict(v_scale="2")),
        ("enable_pdl must be a bool or None", TypeError, dict(enable_pdl=1)),
    ]
    launches = len(cpu_plan.launches)
    for message, error, kwargs in bad:
        with pytest.raises(error, match=message):
            w.run(q, (k, v), **kwargs)
    with pytest.raises(ValueError, match="extra positional arguments"):
        w.run(q, (k, v), torch.zeros(1))
    with pytest.raises(ValueError, match="q_len_per_req=2, but plan\\(\\) used 1; the CUDA-core"):
        w.run(torch.cat([q, q]), (k, v))
    with pytest.warns(DeprecationWarning, match="q_len_per_req"):
        w.run(q, (k, v), q_len_per_req=1)
    assert len(cpu_plan.launches) == launches + 1


def test_page_size_one_caches_may_leave_the_page_dim_out(cpu_plan: CpuPlan) -> None:
    for layout in ("NHD", "HND"):
        w = _wrapper(kv_layout=layout)
        w.plan(
            _i32([0, 3, 4]),
            _i32([0, 1, 2, 3]),
            _i32([1, 1]),
            8,
            2,
            128,
            1,
            q_data_type=torch.bfloat16,
        )
        k3, v3 = _bf16(4, 2, 128), _bf16(4, 2, 128)
        for form in ((k3, v3), torch.stack([k3, v3], dim=1)):
            w.run(_bf16(2, 8, 128), form)
            k_cache = _launch_args(cpu_plan.launches[-1])["k_cache"]
            assert k_cache.shape == ((4, 1, 2, 128) if layout == "NHD" else (4, 2, 1, 128))
            assert (
                k_cache.data_ptr() == k3.data_ptr()
                or k_cache.untyped_storage().data_ptr() == form.untyped_storage().data_ptr()
            )  # a view, never a copy


def test_attributes_engines_read(cpu_plan: CpuPlan) -> None:
    w = _wrapper()
    assert not w.is_cuda_graph_enabled and not w.use_tensor_cores and w._fixed_batch_size == 0
    w.plan(*TABLE, *SHAPE, q_data_type="bfloat16", sm_scale=0.2, logits_soft_cap=5.0, window_left=9)
    assert (w._sm_scale, w._logits_soft_cap, w._window_left) == (0.2, 5.0, 9)
    assert w._cached_module.module is cpu_plan
    # no soft cap is stored as 0.0, as the reference's plan stores it (vLLM asserts
    # `_logits_soft_cap == (logits_soft_cap or 0.0)` before every decode)
    w.plan(*TABLE, *SHAPE, logits_soft_cap=None, q_data_type=torch.bfloat16)
    assert w._logits_soft_cap == 0.0 and isinstance(w._logits_soft_cap, float)
    fast_decode_plan(w, *TABLE, *SHAPE, q_data_type=torch.bfloat16)
    assert w._logits_soft_cap == 0.0
    assert torch.equal(w._paged_kv_indptr_buf, TABLE[0])
    assert torch.equal(w._paged_kv_indices_buf, TABLE[1])
    assert torch.equal(w._paged_kv_last_page_len_buf, TABLE[2])
    assert w._paged_kv_indptr_buf.dtype == torch.int32
    assert w._int_workspace_buffer.nbytes == 8 << 20
    assert w._pin_memory_int_workspace_buffer.nbytes == 8 << 20
    assert w._float_workspace_buffer.nbytes == 1 << 20 and w.device == torch.device("cpu")
    assert Wrapper(
        torch.empty(1024, dtype=torch.uint8), backend="fa2", use_tensor_cores=True
    ).use_tensor_cores
    with pytest.raises(ValueError, match="backend 'trtllm-gen' is not available"):
        _wrapper(backend="trtllm-gen")
    with pytest.raises(ValueError, match="jit_args"):
        _wrapper(jit_args=["custom"])


def test_wrappers_sharing_a_float_workspace_keep_schedules_apart(cpu_plan: CpuPlan) -> None:
    """The schedule lives in each wrapper's own int workspace (the reference's layout), so
    another wrapper's plan() over the same float workspace cannot overwrite it."""
    shared = torch.empty(1 << 20, dtype=torch.uint8)
    a, b = Wrapper(shared), Wrapper(shared)
    a.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    b.plan(_i32([0, 1]), _i32([3]), _i32([2]), *SHAPE, q_data_type=torch.bfloat16)

    def inside(view: torch.Tensor, buffer: torch.Tensor) -> bool:
        start = buffer.data_ptr()
        return start <= view.data_ptr() < start + buffer.nbytes

    for w in (a, b):
        assert inside(w._plan_info.plan_words, w._int_workspace_buffer)
        assert not inside(w._plan_info.plan_words, shared)
    assert a._int_workspace_buffer.data_ptr() != b._int_workspace_buffer.data_ptr()


def _graph_wrapper(batch: int = 2, pages: int = 8) -> Wrapper:
    return Wrapper(
        torch.empty(64 << 20, dtype=torch.uint8),
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.full((batch + 1,), -7, dtype=torch.int32),
        paged_kv_indices_buffer=torch.full((pages,), -7, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.full((batch,), -7, dtype=torch.int32),
    )


def test_cuda_graph_plan_copies_into_the_fixed_buffers(cpu_plan: CpuPlan) -> None:
    w = _graph_wrapper()
    buffers = (w._paged_kv_indptr_buf, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf)
    w.plan(TABLE[0].long(), TABLE[1].long(), TABLE[2].long(), *SHAPE, q_data_type=torch.bfloat16)
    assert (
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
    ) == buffers  # the same tensors: captured addresses
    assert buffers[0].tolist() == [0, 2, 3] and buffers[2].tolist() == [5, 16]
    assert buffers[1].tolist() == [4, 1, 0, -7, -7, -7, -7, -7]
    first = cpu_plan.uploads[-1]
    w.plan(_i32([0, 1, 2]), _i32([7, 6]), _i32([1, 1]), *SHAPE, q_data_type=torch.bfloat16)
    assert len(cpu_plan.uploads[-1]) == len(first)  # fixed capacities: a fixed plan size
    w.run(_bf16(2, 8, 128), _cache())
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["kv_indptr"] is buffers[0] and launch["kv_indices"] is buffers[1]
    assert launch["grid_work"] == launch["work_capacity"]


def test_fast_decode_plan_reads_only_indptr_and_copies_nothing(cpu_plan: CpuPlan) -> None:
    w = _graph_wrapper()
    w.begin_forward = fast_decode_plan.__get__(w)  # how engines install it
    w._paged_kv_indptr_buf.copy_(TABLE[0])
    w._paged_kv_indices_buf[:3].copy_(TABLE[1])
    w._paged_kv_last_page_len_buf.copy_(TABLE[2])
    poisoned_last = torch.full((2,), 99, dtype=torch.int32)  # would fail plan()'s range check
    w.begin_forward(
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        poisoned_last,
        *SHAPE,
        q_data_type=torch.bfloat16,
        global_override_indptr_cpu=TABLE[0],
    )
    assert w._paged_kv_last_page_len_buf.tolist() == [5, 16]  # untouched
    plain = _wrapper()
    indptr, indices, last = TABLE
    fast_decode_plan(plain, indptr, indices, last, *SHAPE, data_type=torch.bfloat16)
    assert plain._paged_kv_indptr_buf is indptr and plain._paged_kv_indices_buf is indices
    assert plain._cached_q_data_type == torch.bfloat16
    with pytest.raises(ValueError, match="global_override_indptr_cpu has 2 elements, expected 3"):
        fast_decode_plan(plain, *TABLE, *SHAPE, global_override_indptr_cpu=_i32([0, 2]))
    with pytest.raises(TypeError, match="fast_decode_plan needs a BatchDecodeWithPagedKV"):
        fast_decode_plan(object(), *TABLE, *SHAPE)


def _decode_plan_args(w: Wrapper, indptr_host, batch, dtype=torch.bfloat16, window=-1, cap=0.0):  # noqa: ANN001
    """The reference's CUDA-core module plan arguments, as SGLang's earlier fast_decode_plan
    (and vLLM's at 5314c90d, for a wrapper without tensor cores) pass them."""
    return [
        w._float_workspace_buffer,
        w._int_workspace_buffer,
        w._pin_memory_int_workspace_buffer,
        indptr_host,
        batch,
        *SHAPE[:2],
        SHAPE[3],
        w.is_cuda_graph_enabled,
        window,
        cap,
        SHAPE[2],
        SHAPE[2],
        torch.empty(0, dtype=dtype),
        torch.empty(0, dtype=dtype),
    ]


def test_the_cached_modules_plan_replans_as_sglang_calls_it(cpu_plan: CpuPlan) -> None:
    """A CUDA-graph wrapper re-planned through ``_cached_module.plan`` after the engine wrote
    the page-table buffers: the host indptr's requests by whole pages (the kernel reads
    the real lengths), nothing copied into the buffers, the window and cap given, the
    last plan()'s sm_scale; run() launches the new plan record it returns."""
    w = _graph_wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, sm_scale=0.2)
    first = w._plan_info
    indptr, indices = _i32([0, 3, 4]), _i32([7, 6, 5, 4])
    w._paged_kv_indptr_buf.copy_(indptr)
    w._paged_kv_indices_buf[:4].copy_(indices)
    w._paged_kv_last_page_len_buf.copy_(_i32([2, 9]))
    plan_info = w._cached_module.plan(*_decode_plan_args(w, indptr, 2, window=20, cap=5.0))
    assert plan_info is w._plan_info and plan_info is not first
    words = cpu_plan.uploads[-1]
    assert w._paged_kv_indptr_buf.tolist() == [0, 3, 4]  # the engine's, untouched
    assert w._paged_kv_last_page_len_buf.tolist() == [2, 9]
    assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (20, 5.0, 0.2)
    w.run(_bf16(2, 8, 128), _cache())
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["plan"] is plan_info.plan_words and launch["window_left"] == 20
    assert launch["score_scale"] == pytest.approx(0.2 / 5.0)
    assert launch["kv_last_page_len"] is w._paged_kv_last_page_len_buf
    full_pages = _graph_wrapper()  # plan() of the same pages, each full
    full_pages.plan(
        indptr, indices, _i32([16, 16]), *SHAPE, q_data_type=torch.bfloat16, window_left=20
    )
    assert cpu_plan.uploads[-1] == words

    w._cached_module.plan(*_decode_plan_args(w, indptr, 2, dtype=torch.float16))
    assert cpu_plan.modules[-1][0] == torch.float16 and w._cached_q_data_type == torch.float16
    args = _decode_plan_args(w, indptr, 2)
    with pytest.raises(TypeError, match="the reference's 15 positional decode-plan arguments"):
        w._cached_module.plan(*args[:14])
    with pytest.raises(TypeError, match="empty_kv_data must be a tensor"):
        w._cached_module.plan(*args[:14], "bfloat16")
    with pytest.raises(ValueError, match="batch_size is 3, the page-table buffers hold 2"):
        w._cached_module.plan(*_decode_plan_args(w, _i32([0, 1, 2, 3]), 3))
    with pytest.raises(ValueError, match="kv_indptr has 2 elements, expected 3"):
        w._cached_module.plan(*_decode_plan_args(w, _i32([0, 1]), 2))
    with pytest.raises(ValueError, match="head_dim_qk \\(128\\) and head_dim_vo \\(64\\) differ"):
        w._cached_module.plan(*args[:12], 64, *args[13:])


def test_the_cached_modules_plan_takes_the_buffers_an_engine_assigned(cpu_plan: CpuPlan) -> None:
    """Without CUDA graphs SGLang's earlier fast_decode_plan assigns the page-table tensors
    to the wrapper's buffers, then calls ``_cached_module.plan``: run() reads those."""
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    indptr, indices, last = _i32([0, 1, 3]), _i32([2, 3, 4]), _i32([16, 1])
    w._paged_kv_indptr_buf, w._paged_kv_indices_buf = indptr, indices
    w._paged_kv_last_page_len_buf = last
    w._cached_module.plan(*_decode_plan_args(w, indptr, 2))
    w.run(_bf16(2, 8, 128), _cache())
    launch = _launch_args(cpu_plan.launches[-1])
    assert launch["kv_indptr"] is indptr and launch["kv_indices"] is indices
    assert launch["kv_last_page_len"] is last


def test_reset_workspace_buffer_needs_a_new_plan(cpu_plan: CpuPlan) -> None:
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    float_ws, int_ws = torch.empty(2 << 20, dtype=torch.uint8), torch.empty(4096, dtype=torch.uint8)
    w.reset_workspace_buffer(float_ws, int_ws)
    assert w._float_workspace_buffer is float_ws and w._int_workspace_buffer is int_ws
    assert w._pin_memory_int_workspace_buffer.nbytes == 4096
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        w.run(_bf16(2, 8, 128), _cache())
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    assert w._plan_info.plan_words.data_ptr() == int_ws.data_ptr()
    with pytest.raises(ValueError, match="int_workspace_buffer must be a contiguous 1-D"):
        w.reset_workspace_buffer(float_ws, torch.empty(4, 4))


def test_single_decode_and_merge_call_forms_reach_the_device_check() -> None:
    q, k = _bf16(8, 128), _bf16(10, 2, 128)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flashinfer.single_decode_with_kv_cache(
            q, k, k, "NHD", "NONE", False, 1.0, 1.0, 1.0, -1, None, None, 1.0, 1e4, True
        )
    v, s = _bf16(4, 2, 64), torch.zeros(4, 2, dtype=torch.float16)  # cast like the reference
    with pytest.raises(ValueError, match="v_a must be a CUDA tensor"):
        flashinfer.merge_state(v, s, v, s)
    with pytest.raises(ValueError, match="v must be a CUDA tensor"):
        flashinfer.merge_state_in_place(v, s, v, s, mask=None)
    assert math.isclose(score_params(128, None, None)[0], LOG2E / math.sqrt(128))
