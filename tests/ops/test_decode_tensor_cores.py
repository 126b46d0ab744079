"""Tensor-core decode (``use_tensor_cores=True``): batch decode planned and launched as a
prefill of one query token per request, and single decode as a single prefill of one token.
On the CPU, up to the launch (stand-in modules record it): the prefill schedule plan()
uploads, the arguments run() launches batch_prefill with, CUDA-graph buffers and
fast_decode_plan, and bad arguments raised before anything is launched. On the GPU: against
the CUDA-core decode kernel and a float64 reference, with outputs poisoned by NaN."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer
from flashinfer import decode as decode_api
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper, fast_decode_plan
from flashinfer.decode_schedule import kv_lengths
from flashinfer.prefill_schedule import TILE_ROWS, pack_schedule, plan_length, plan_prefill_schedule
from flashinfer.testing import reference
from tests.ops.attention_error import assert_output_close
from tests.ops.test_decode import check_batch_decode, lse_tolerance, tolerance
from tests.ops.test_prefill import BATCH_ARGS, MAX_CTAS, CpuPrefill, _bf16, _i32, cpu_prefill  # noqa: F401 - cpu_prefill is a fixture used by cpu_tc

LOG2E = 1.4426950408889634
NAN = float("nan")

# two requests of 21 and 16 tokens, pages of 16, 8 query heads over 2 KV heads, head_dim 128
TABLE = (
    torch.tensor([0, 2, 3], dtype=torch.int32),
    torch.tensor([4, 1, 0], dtype=torch.int32),
    torch.tensor([5, 16], dtype=torch.int32),
)
SHAPE = (8, 2, 128, 16)


@pytest.fixture
def cpu_tc(cpu_prefill: CpuPrefill, monkeypatch: pytest.MonkeyPatch) -> CpuPrefill:
    """The prefill path on the CPU (tests/ops/test_prefill.py's cpu_prefill); the CUDA-core
    decode kernel must never be reached in tensor-core mode."""

    def refuse(*args):  # noqa: ANN002, ANN202
        raise AssertionError("tensor-core decode reached the CUDA-core decode kernel")

    monkeypatch.setattr(decode_api, "get_decode_module", refuse)
    monkeypatch.setattr(decode_api, "_max_ctas", refuse)
    return cpu_prefill


def _wrapper(workspace: int = 1 << 20, **kwargs) -> BatchDecodeWithPagedKVCacheWrapper:  # noqa: ANN003
    return BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(workspace, dtype=torch.uint8), use_tensor_cores=True, **kwargs
    )


def _graph_wrapper(batch: int = 2, pages: int = 8) -> BatchDecodeWithPagedKVCacheWrapper:
    return _wrapper(
        64 << 20,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.full((batch + 1,), -7, dtype=torch.int32),
        paged_kv_indices_buffer=torch.full((pages,), -7, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.full((batch,), -7, dtype=torch.int32),
    )


def _cache() -> tuple[torch.Tensor, torch.Tensor]:
    return _bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)


def _expected_words(kv_lens: list[int], group: int = 4, heads: int = 2, **kwargs) -> list[int]:
    """The prefill schedule of one query token per request, packed at its own size."""
    qo_indptr = list(range(len(kv_lens) + 1))
    schedule = plan_prefill_schedule(qo_indptr, kv_lens, group, heads, MAX_CTAS, **kwargs)
    return pack_schedule(schedule, schedule.num_work, schedule.num_merge)


# -- plan ---------------------------------------------------------------------------------------


def test_the_mode_is_reported_and_shares_this_wrappers_buffers(cpu_tc: CpuPrefill) -> None:
    assert (
        _wrapper().use_tensor_cores
        and not BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(1024, dtype=torch.uint8)
        ).use_tensor_cores
    )
    w = _wrapper()
    assert w._int_workspace_buffer.nbytes == 8 << 20  # one int workspace, as the reference
    assert w._pin_memory_int_workspace_buffer.nbytes == 8 << 20
    assert w._prefill._int_workspace_buffer is w._int_workspace_buffer
    g = _graph_wrapper()
    assert g.use_tensor_cores and g.is_cuda_graph_enabled and g._fixed_batch_size == 2
    inner = g._prefill
    assert inner._paged_kv_indptr_buf is g._paged_kv_indptr_buf
    assert inner._paged_kv_indices_buf is g._paged_kv_indices_buf
    assert inner._paged_kv_last_page_len_buf is g._paged_kv_last_page_len_buf
    assert inner._qo_indptr_buf.tolist() == [0, 1, 2] and inner._qo_indptr_buf.dtype == torch.int32
    cuda_graph = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8),
        _i32([0, 0]),
        _i32([0]),
        _i32([1]),
        use_tensor_cores=True,
    )
    assert cuda_graph.use_tensor_cores and cuda_graph.is_cuda_graph_enabled


def test_plan_uploads_a_prefill_schedule_of_one_token_per_request(cpu_tc: CpuPrefill) -> None:
    w = _wrapper()
    w.plan(
        *TABLE, *SHAPE, q_data_type=torch.bfloat16, sm_scale=0.2, logits_soft_cap=5.0, window_left=9
    )
    assert cpu_tc.uploads == [_expected_words([21, 16])]
    plan = w._plan_info
    assert (plan.batch, plan.total_q, plan.num_qo_heads, plan.num_kv_heads) == (2, 2, 8, 2)
    assert (plan.head_dim, plan.page_size, plan.dtype) == (128, 16, torch.bfloat16)
    assert plan.plan_words.data_ptr() == w._int_workspace_buffer.data_ptr()
    # the attributes engines read, as in CUDA-core mode
    assert (w._sm_scale, w._logits_soft_cap, w._window_left) == (0.2, 5.0, 9)
    assert w._cached_module.module is cpu_tc and w._batch_size == 2
    assert w._cached_module.batch_prefill == cpu_tc.batch_prefill  # the module's functions
    assert w._backend == "fa2"  # "auto" resolved, as the reference's tensor-core plan() does
    assert w._paged_kv_indptr_buf is TABLE[0] and w._paged_kv_indices_buf is TABLE[1]
    assert w._paged_kv_last_page_len_buf is TABLE[2]
    assert (
        w._cached_q_data_type == w._cached_kv_data_type == w._cached_o_data_type == torch.bfloat16
    )
    assert "work_items=2" in repr(w)

    long_table = (_i32([0, 63, 64]), torch.arange(64, dtype=torch.int32), _i32([7, 16]))
    w.plan(*long_table, *SHAPE, q_data_type=torch.bfloat16)  # 999 keys split across the GPU
    lens = kv_lengths([0, 63, 64], [7, 16], 16)
    assert lens == [999, 16] and cpu_tc.uploads[-1] == _expected_words(lens)
    assert cpu_tc.uploads[-1][:2] == [5, 256]  # 4 chunks of request 0, request 1 whole
    plan = w._plan_info
    assert (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity) == (5, 1, 4)
    assert plan.schedule.merge_row == (0,)  # token 0 of request 0 merges its 4 chunks
    assert plan.tmp_v.data_ptr() == w._float_workspace_buffer.data_ptr()
    assert plan.tmp_v.numel() == 4 * 8 * 128  # 4 tmp rows x 8 heads x head_dim
    w.plan(*long_table, *SHAPE, q_data_type=torch.bfloat16, fixed_split_size=8)  # pages
    assert cpu_tc.uploads[-1] == _expected_words(lens, fixed_chunk=128)
    w.plan(*long_table, *SHAPE, q_data_type=torch.bfloat16, disable_split_kv=True)
    assert cpu_tc.uploads[-1][:2] == [2, 1]
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, seq_lens=_i32([3000, 16]))
    assert cpu_tc.uploads[-1] == _expected_words([3000, 16])  # seq_lens steer the schedule


def test_groups_past_the_cuda_core_limit_plan_with_tensor_cores(cpu_tc: CpuPrefill) -> None:
    """A GQA group of two tiles' rows fills two tiles per token; the CUDA-core kernel (a
    thread block per group) refuses it."""
    group = 2 * TILE_ROWS
    with pytest.raises(ValueError, match=f"GQA group size {group} is too large"):
        decode_api._check_heads(group, 1, 128)
    w = _wrapper()
    w.plan(*TABLE, group, 1, 128, 16, q_data_type=torch.bfloat16)
    assert cpu_tc.uploads[-1] == _expected_words([21, 16], group=group, heads=1)
    assert w._plan_info.schedule.work_q_tile == (0, 1, 0, 1)


PLAN_BAD = [
    (
        "q_len_per_req=17 needs every request's KV length >= q_len_per_req .*request 1 has 16",
        ValueError,
        dict(q_len_per_req=17),
    ),
    ("q_len_per_req must be >= 1", ValueError, dict(q_len_per_req=0)),
    ("window_right must be 0", ValueError, dict(window_right=1)),
    ("head_dim must be one of 64, 128, 256, got 96", ValueError, dict(head_dim=96)),
    ("must be a multiple of num_kv_heads", ValueError, dict(num_kv_heads=3)),
    ("num_qo_heads must be <= 65535", ValueError, dict(num_qo_heads=65536, num_kv_heads=1)),
    (
        "kv_data_type torch.float16 differs from q_data_type",
        TypeError,
        dict(kv_data_type="float16"),
    ),
    (
        "last_page_len\\[0\\] is 17, must be in \\[1, page_size=16\\]",
        ValueError,
        dict(last_page_len=_i32([17, 1])),
    ),
    ("logits_soft_cap must be >= 0.0", ValueError, dict(logits_soft_cap=-1.0)),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("fixed_split_size must be >= 1", ValueError, dict(fixed_split_size=0)),
]


@pytest.mark.parametrize("message,error,overrides", PLAN_BAD, ids=[b[0][:40] for b in PLAN_BAD])
def test_plan_bad_arguments(cpu_tc, message, error, overrides) -> None:
    args = dict(
        indptr=TABLE[0],
        indices=TABLE[1],
        last_page_len=TABLE[2],
        num_qo_heads=8,
        num_kv_heads=2,
        head_dim=128,
        page_size=16,
        q_data_type=torch.bfloat16,
    )
    args.update(overrides)
    w = _wrapper()
    with pytest.raises(error, match=message):
        w.plan(**args)
    assert cpu_tc.uploads == [] and w._plan_info is None


def test_a_workspace_too_small_is_reported_before_anything_changes(cpu_tc: CpuPrefill) -> None:
    w = _wrapper(16384)
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)  # no split: no tmp rows
    before = w._plan_info
    with pytest.raises(ValueError, match="float_workspace_buffer has 16384 bytes; this plan needs"):
        w.plan(
            _i32([0, 300]),
            torch.arange(300, dtype=torch.int32),
            _i32([16]),
            *SHAPE,
            q_data_type=torch.bfloat16,
        )
    assert w._plan_info is before and len(cpu_tc.uploads) == 1


# -- run ----------------------------------------------------------------------------------------


def test_run_launches_batch_prefill_with_the_decode_arguments(cpu_tc: CpuPrefill) -> None:
    w = _wrapper(kv_layout="HND")
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, sm_scale=0.5, window_left=7)
    q = _bf16(2, 8, 128)
    k, v = _bf16(5, 2, 16, 128), _bf16(5, 2, 16, 128)
    out = w.run(q, torch.stack([k, v], dim=1))
    launch = cpu_tc.launches[-1]
    plan = w._plan_info
    assert out is launch["out"] and out.shape == q.shape and bool((out == 1).all())
    assert launch["q"] is q and launch["hnd"] and launch["k"].shape == (5, 2, 16, 128)
    assert torch.equal(launch["k"], k) and torch.equal(launch["v"], v)
    assert launch["qo_indptr"].tolist() == [0, 1, 2]  # one query token per request
    assert launch["qo_indptr"].dtype == torch.int32
    assert launch["kv_indptr"] is w._paged_kv_indptr_buf
    assert launch["kv_indices"] is w._paged_kv_indices_buf
    assert launch["kv_last_page_len"] is w._paged_kv_last_page_len_buf
    assert launch["custom_mask"] is None and launch["mask_indptr"] is None
    assert launch["plan"] is plan.plan_words and launch["tmp_v"] is plan.tmp_v
    assert launch["tmp_lse"] is plan.tmp_lse and launch["lse"] is None
    assert (launch["grid_work"], launch["grid_merge"]) == (2, 0)
    assert launch["causal"] is False and launch["window_left"] == 7
    assert launch["score_scale"] == pytest.approx(0.5 * LOG2E) and launch["score_cap"] == 0.0
    assert launch["enable_pdl"] is False  # not on a CPU device

    out, lse = w.run(
        q,
        (k, v),
        q_scale=2.0,
        k_scale=3.0,
        v_scale=0.5,
        return_lse=True,
        window_left=7,
        enable_pdl=True,
    )
    launch = cpu_tc.launches[-1]
    assert launch["score_scale"] == pytest.approx(0.5 * 6.0 * LOG2E)
    assert bool((out == 0.5).all()) and lse is launch["lse"] and lse.shape == (2, 8)
    assert lse.dtype == torch.float32
    given_out, given_lse = torch.empty_like(q), torch.empty(2, 8)
    got, got_lse = w.run_return_lse(q, (k, v), out=given_out, lse=given_lse)
    assert got is given_out and got_lse is given_lse and launch is not cpu_tc.launches[-1]

    w._sm_scale, w._logits_soft_cap, w._window_left = 0.125, 10.0, 3  # engines set these
    w.run(q, (k, v))
    launch = cpu_tc.launches[-1]
    assert launch["score_scale"] == pytest.approx(0.125 / 10.0)
    assert launch["score_cap"] == pytest.approx(10.0 * LOG2E) and launch["window_left"] == 3
    w.forward(q, (k, v), sm_scale=0.25, window_left=-1)  # forward overrides them too
    launch = cpu_tc.launches[-1]
    assert launch["score_scale"] == pytest.approx(0.25 * LOG2E) and launch["window_left"] == -1
    assert launch["score_cap"] == 0.0
    _, lse = w.forward_return_lse(q, (k, v))
    assert cpu_tc.launches[-1]["lse"] is lse
    w._window_left = 1.5
    with pytest.raises(TypeError, match="window_left must be an int"):
        w.run(q, (k, v))


def test_page_size_one_caches_may_leave_the_page_dim_out(cpu_tc: CpuPrefill) -> None:
    w = _wrapper()
    w.plan(
        _i32([0, 3, 4]), _i32([0, 1, 2, 3]), _i32([1, 1]), 8, 2, 128, 1, q_data_type=torch.bfloat16
    )
    assert cpu_tc.uploads[-1] == _expected_words([3, 1])
    k3, v3 = _bf16(4, 2, 128), _bf16(4, 2, 128)
    w.run(_bf16(2, 8, 128), (k3, v3))
    assert cpu_tc.launches[-1]["k"].shape == (4, 1, 2, 128)


RUN_BAD = [
    (
        "q has shape \\(3, 8, 128\\); plan\\(\\) was for \\(2, 8, 128\\)",
        ValueError,
        dict(q=_bf16(3, 8, 128)),
    ),
    (
        "q has dtype torch.float16; plan\\(\\) was for torch.bfloat16",
        TypeError,
        dict(q=torch.randn(2, 8, 128, dtype=torch.float16)),
    ),
    (
        "q's strides must be multiples of 8 elements",
        ValueError,
        dict(q=_bf16(2, 8, 130)[..., :128]),
    ),
    (
        "paged_kv_cache\\[0\\] has shape \\(5, 2, 16, 128\\); plan\\(\\) was for pages of "
        "\\(16, 2, 128\\)",
        ValueError,
        dict(cache=(_bf16(5, 2, 16, 128), _bf16(5, 2, 16, 128))),
    ),
    (
        "paged_kv_cache\\[1\\] has dtype torch.float16",
        TypeError,
        dict(cache=(_bf16(5, 16, 2, 128), torch.zeros(5, 16, 2, 128, dtype=torch.float16))),
    ),
    (
        "paged_kv_cache\\[0\\] must be 16-byte aligned",
        ValueError,
        dict(cache=(_bf16(5 * 16 * 2 * 128 + 1)[1:].view(5, 16, 2, 128), _bf16(5, 16, 2, 128))),
    ),
    (
        "out has shape \\(2, 8, 64\\), expected \\(2, 8, 128\\)",
        ValueError,
        dict(out=_bf16(2, 8, 64)),
    ),
    ("lse has dtype torch.bfloat16, expected torch.float32", TypeError, dict(lse=_bf16(2, 8))),
    ("return_lse must be a bool", TypeError, dict(return_lse=None)),
    ("sinks is not supported", ValueError, dict(sinks=torch.zeros(8))),
    ("window_left=5 differs from the planned -1", ValueError, dict(window_left=5)),
    (
        "q.shape\\[0\\] \\(2\\) is not batch_size \\* q_len_per_req \\(2 \\* 2\\)",
        ValueError,
        dict(q_len_per_req=2),
    ),
    (
        "q implies q_len_per_req=3, but plan\\(\\) used 1; re-plan",
        ValueError,
        dict(q=_bf16(6, 8, 128)),
    ),
    (
        "q implies q_len_per_req=3, but plan\\(\\) used 1",
        ValueError,
        dict(q=_bf16(6, 8, 128), q_len_per_req=3),
    ),
    ("extra positional arguments", ValueError, dict(args=(1,))),
    ("v_scale must be finite", ValueError, dict(v_scale=NAN)),
    ("k_scale must be > 0.0", ValueError, dict(k_scale=0.0)),
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("message,error,overrides", RUN_BAD, ids=[b[0][:40] for b in RUN_BAD])
def test_run_bad_arguments(cpu_tc, message, error, overrides) -> None:
    w = _wrapper()
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        w.run(_bf16(2, 8, 128), _cache())
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    call = dict(q=_bf16(2, 8, 128), cache=_cache())
    call.update(overrides)
    with pytest.raises(error, match=message):
        w.run(call.pop("q"), call.pop("cache"), *call.pop("args", ()), **call)
    assert cpu_tc.launches == []


def model_batch_prefill(launch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """What batch_prefill computes from its arguments (paged KV, no custom mask), in float64:
    scores in log2 units (``score_cap * tanh(q.k * score_scale)`` with a cap), bottom-right
    causal and window masks, base-2 LSE. Returns (out, lse) of every query row."""
    qo_indptr, kv_indptr = launch["qo_indptr"].tolist(), launch["kv_indptr"].tolist()
    k_cache, v_cache = launch["k"], launch["v"]
    if launch["hnd"]:
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    q = launch["q"].double()
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    for b in range(len(qo_indptr) - 1):
        pages = launch["kv_indices"][kv_indptr[b] : kv_indptr[b + 1]].long()
        kv_len = (
            0
            if pages.numel() == 0
            else ((pages.numel() - 1) * k_cache.shape[1] + int(launch["kv_last_page_len"][b]))
        )
        k = k_cache[pages].flatten(0, 1)[:kv_len].double()
        v = v_cache[pages].flatten(0, 1)[:kv_len].double()
        qo_len = qo_indptr[b + 1] - qo_indptr[b]
        for t in range(qo_len):
            row = qo_indptr[b] + t
            group = q.shape[1] // k.shape[1]
            scores = torch.einsum("hd,lhd->hl", q[row], k.repeat_interleave(group, 1))
            scores = scores * launch["score_scale"]
            if launch["score_cap"]:
                scores = launch["score_cap"] * torch.tanh(scores)
            last = t + kv_len - qo_len
            keys = torch.arange(kv_len)
            visible = keys <= last if launch["causal"] else torch.ones(kv_len, dtype=torch.bool)
            if launch["window_left"] >= 0:
                visible &= keys >= last - launch["window_left"]
            if not visible.any():
                continue
            scores = scores[:, visible]
            lse[row] = torch.logsumexp(scores * math.log(2), -1) / math.log(2)
            weights = torch.exp2(scores - lse[row][:, None])
            out[row] = torch.einsum("hl,lhd->hd", weights, v[visible].repeat_interleave(group, 1))
    return out, lse


@pytest.mark.parametrize("layout,q_len", [("NHD", 1), ("HND", 1), ("NHD", 3), ("HND", 2)])
def test_the_launch_computes_decode_attention(cpu_tc, monkeypatch, layout, q_len) -> None:
    """The launch arguments, read as batch_prefill reads them (a float64 model standing in
    for the kernel), give the decode reference: q_len_per_req query rows per request, the
    last one seeing all its keys and the earlier ones causally fewer (or its window), the
    scales and the soft cap."""

    def batch_prefill(*args) -> None:  # noqa: ANN002
        launch = dict(zip(BATCH_ARGS, args))
        out, lse = model_batch_prefill(launch)
        launch["out"].copy_(out)
        if launch["lse"] is not None:
            launch["lse"].copy_(lse)

    monkeypatch.setattr(cpu_tc, "batch_prefill", batch_prefill)
    lens = [1, 40, 0, 17] if q_len == 1 else [q_len, 40, q_len + 1, 17]
    page_size, heads, kv_heads, dim = 16, 8, 2, 64
    pages = [-(-n // page_size) for n in lens]
    indptr = _i32([0, *torch.tensor(pages).cumsum(0).tolist()])
    indices = torch.randperm(sum(pages) + 2)[: sum(pages)].to(torch.int32)
    last = _i32([n - (p - 1) * page_size if p else 1 for n, p in zip(lens, pages)])
    shape = (
        (sum(pages) + 2, page_size, kv_heads, dim)
        if layout == "NHD"
        else (sum(pages) + 2, kv_heads, page_size, dim)
    )
    k_cache, v_cache = torch.randn(shape).to(torch.bfloat16), torch.randn(shape).to(torch.bfloat16)
    q = _bf16(len(lens) * q_len, heads, dim)
    w = _wrapper(kv_layout=layout)
    for sm_scale, cap, window in ((None, None, -1), (0.3, 20.0, -1), (None, None, 5)):
        w.plan(
            indptr,
            indices,
            last,
            heads,
            kv_heads,
            dim,
            page_size,
            q_data_type=torch.bfloat16,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
            q_len_per_req=q_len,
        )
        out, lse = w.run(q, (k_cache, v_cache), q_scale=2.0, v_scale=0.5, return_lse=True)
        assert out.shape == q.shape and lse.shape == q.shape[:2]
        nhd = (
            (k_cache, v_cache)
            if layout == "NHD"
            else (k_cache.transpose(1, 2), v_cache.transpose(1, 2))
        )
        for b, n in enumerate(lens):
            ids = indices[indptr[b] : indptr[b + 1]].long()
            k, v = (c[ids].flatten(0, 1)[:n] for c in nhd)
            rows = slice(b * q_len, (b + 1) * q_len)
            want, want_lse = reference.attention(
                q[rows], k, v, True, (sm_scale or dim**-0.5) * 2.0, window, cap
            )
            torch.testing.assert_close(out[rows].double(), want * 0.5, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(lse[rows].double(), want_lse, atol=1e-5, rtol=1e-5)


def test_q_len_per_req_plans_a_causal_prefill_of_that_many_tokens(cpu_tc: CpuPrefill) -> None:
    """Speculative decoding's draft tokens: q_len_per_req rows per request, causal (the
    reference's semantics); q's rows must match the plan; fast_decode_plan takes it too."""
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, q_len_per_req=3)
    schedule = plan_prefill_schedule([0, 3, 6], [21, 16], 4, 2, MAX_CTAS, causal=True)
    assert cpu_tc.uploads == [pack_schedule(schedule, schedule.num_work, schedule.num_merge)]
    plan = w._plan_info
    assert (plan.batch, plan.total_q, w._q_len_per_req) == (2, 6, 3)
    q = _bf16(6, 8, 128)
    out, lse = w.run(q, _cache(), return_lse=True)
    launch = cpu_tc.launches[-1]
    assert launch["qo_indptr"].tolist() == [0, 3, 6] and launch["causal"] is True
    assert out.shape == (6, 8, 128) and lse.shape == (6, 8)
    with pytest.warns(DeprecationWarning, match="q_len_per_req"):
        w.run(q, _cache(), q_len_per_req=3)
    for rows in (2, 4):
        with pytest.raises(
            ValueError, match=f"q implies q_len_per_req={rows // 2}, but plan\\(\\) used 3"
        ):
            w.run(_bf16(rows, 8, 128), _cache())
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)  # one token per request again
    w.run(_bf16(2, 8, 128), _cache())
    assert cpu_tc.launches[-1]["qo_indptr"].tolist() == [0, 1, 2]
    assert cpu_tc.launches[-1]["causal"] is False

    fast_decode_plan(w, *TABLE, *SHAPE, q_data_type=torch.bfloat16, q_len_per_req=2)
    full_pages = [32, 16]  # last_page_len is never read on the host
    schedule = plan_prefill_schedule([0, 2, 4], full_pages, 4, 2, MAX_CTAS, causal=True)
    assert cpu_tc.uploads[-1] == pack_schedule(schedule, schedule.num_work, schedule.num_merge)
    w.run(_bf16(4, 8, 128), _cache())
    assert cpu_tc.launches[-1]["qo_indptr"].tolist() == [0, 2, 4]


def test_cuda_graph_mode_fixes_q_len_per_req_at_the_first_plan(cpu_tc: CpuPrefill) -> None:
    w = _graph_wrapper()
    qo_indptr = w._prefill._qo_indptr_buf
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, q_len_per_req=2)
    assert w._prefill._qo_indptr_buf is qo_indptr and qo_indptr.tolist() == [0, 2, 4]
    w.run(_bf16(4, 8, 128), _cache())
    launch = cpu_tc.launches[-1]
    assert launch["qo_indptr"] is qo_indptr and launch["causal"] is True
    fixed = "q_len_per_req is fixed by the first plan\\(\\) \\(2\\); got 1"
    with pytest.raises(ValueError, match=fixed):
        w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    assert qo_indptr.tolist() == [0, 2, 4] and w._q_len_per_req == 2
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, q_len_per_req=2)  # the same: fine
    assert len(cpu_tc.uploads) == 2


def test_reset_workspace_buffer_moves_the_next_plan(cpu_tc: CpuPrefill) -> None:
    w = _wrapper()
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16)
    new_float = torch.empty(1 << 20, dtype=torch.uint8)
    new_int = torch.empty(1 << 16, dtype=torch.uint8)
    w.reset_workspace_buffer(new_float, new_int)
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        w.run(_bf16(2, 8, 128), _cache())
    w.plan(
        _i32([0, 63, 64]),
        torch.arange(64, dtype=torch.int32),
        _i32([7, 16]),
        *SHAPE,
        q_data_type=torch.bfloat16,
    )
    plan = w._plan_info
    assert plan.plan_words.data_ptr() == new_int.data_ptr()
    assert plan.tmp_v.data_ptr() == new_float.data_ptr() and plan.tmp_capacity == 4
    w.run(_bf16(2, 8, 128), _cache())
    assert cpu_tc.launches[-1]["tmp_lse"].data_ptr() >= new_float.data_ptr()


# -- CUDA-graph mode and fast_decode_plan --------------------------------------------------------


def test_cuda_graph_plan_copies_into_the_fixed_buffers(cpu_tc: CpuPrefill) -> None:
    w = _graph_wrapper()
    buffers = (
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
        w._prefill._qo_indptr_buf,
    )
    w.plan(TABLE[0].long(), TABLE[1].long(), TABLE[2].long(), *SHAPE, q_data_type=torch.bfloat16)
    assert (
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
        w._prefill._qo_indptr_buf,
    ) == buffers  # the same tensors: captured addresses
    assert buffers[0].tolist() == [0, 2, 3] and buffers[2].tolist() == [5, 16]
    assert buffers[1].tolist() == [4, 1, 0, -7, -7, -7, -7, -7]
    assert buffers[3].tolist() == [0, 1, 2]
    plan = w._plan_info
    # the first plan fixes the capacities: the whole GPU's CTAs, a merge row per request, the
    # tmp rows (8 heads x (128 + 1) floats) the 64 MiB float workspace holds
    fit = ((64 << 20) - 512) // (4 * 8 * 129)
    assert (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity) == (MAX_CTAS, 2, fit)
    first = cpu_tc.uploads[-1]
    assert len(first) == plan_length(MAX_CTAS, 2)
    w.plan(
        _i32([0, 7, 8]),
        torch.arange(8, dtype=torch.int32),
        _i32([16, 1]),
        *SHAPE,
        q_data_type=torch.bfloat16,
    )  # 112 keys: a new schedule in the same capacity
    assert len(cpu_tc.uploads[-1]) == len(first)
    assert buffers[1].tolist() == list(range(8))
    w.run(_bf16(2, 8, 128), _cache())
    launch = cpu_tc.launches[-1]
    assert launch["qo_indptr"] is buffers[3] and launch["kv_indptr"] is buffers[0]
    assert launch["kv_indices"] is buffers[1] and launch["kv_last_page_len"] is buffers[2]
    assert launch["grid_work"] == launch["work_capacity"] == MAX_CTAS
    assert launch["grid_merge"] == launch["merge_capacity"] == 2
    assert launch["plan"].data_ptr() == plan.plan_words.data_ptr()
    for indptr, last in (([0, 1, 2, 3], [1, 1, 1]), ([0, 1], [1])):
        with pytest.raises(ValueError, match="batch size is fixed to the buffers' 2"):
            w.plan(_i32(indptr), _i32([0, 0, 0]), _i32(last), *SHAPE, q_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match="9 page indices exceed the CUDA-graph buffer's 8"):
        w.plan(
            *TABLE[:1],
            torch.arange(9, dtype=torch.int32),
            TABLE[2],
            *SHAPE,
            q_data_type=torch.bfloat16,
        )


def test_fast_decode_plan_schedules_whole_pages_and_copies_nothing(cpu_tc: CpuPrefill) -> None:
    w = _graph_wrapper(pages=64)
    w._paged_kv_indptr_buf.copy_(_i32([0, 63, 64]))  # engines write the buffers themselves
    w._paged_kv_indices_buf.copy_(torch.arange(64, dtype=torch.int32))
    w._paged_kv_last_page_len_buf.copy_(_i32([7, 3]))
    w.begin_forward = fast_decode_plan.__get__(w)
    w.begin_forward(
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
        *SHAPE,
        q_data_type=torch.bfloat16,
        global_override_indptr_cpu=_i32([0, 63, 64]),
    )
    full_pages = [63 * 16, 16]  # last_page_len is never read on the host
    assert cpu_tc.uploads[-1] == pack_schedule(
        plan_prefill_schedule([0, 1, 2], full_pages, 4, 2, MAX_CTAS), MAX_CTAS, 2
    )
    assert w._paged_kv_last_page_len_buf.tolist() == [7, 3]  # untouched
    w.run(_bf16(2, 8, 128), _cache())
    assert cpu_tc.launches[-1]["kv_last_page_len"] is w._paged_kv_last_page_len_buf

    plain = _wrapper()
    indptr, indices, last = _i32([0, 2, 3]), _i32([4, 1, 0]), _i32([5, 16])
    fast_decode_plan(plain, indptr, indices, last, *SHAPE, q_data_type=torch.bfloat16)
    assert cpu_tc.uploads[-1] == _expected_words([32, 16])
    assert plain._paged_kv_indptr_buf is indptr and plain._paged_kv_last_page_len_buf is last


def _reference_plan_args(
    w: BatchDecodeWithPagedKVCacheWrapper,
    kv_indptr,
    kv_lens,
    arity: int = 20,  # noqa: ANN001
) -> list:
    """The arguments engines pass the reference's module plan (one query token per request,
    not causal), in the form of the reference release they pin: 15 (no window), 16
    (window_left, unlimited), 18 (fa2's split options), 19 (num_colocated_ctas), 20
    (uniform_q_len)."""
    batch = len(kv_lens)
    args = [
        w._float_workspace_buffer,
        w._int_workspace_buffer,
        w._pin_memory_int_workspace_buffer,
        decode_api._get_range_buf(batch + 1, "cpu"),
        _i32(kv_indptr),
        _i32(kv_lens),
        batch,
        batch,
        *SHAPE[:2],
        SHAPE[3],
        w.is_cuda_graph_enabled,
        SHAPE[2],
        SHAPE[2],
        False,
        -1,
        -1,
        False,
        0,
        0,
    ]
    return args[:arity]


def test_the_cached_modules_plan_replans_as_vllm_calls_it(cpu_tc: CpuPrefill) -> None:
    """vLLM's fast_plan_decode: the first call plans; later ones write the page-table buffers
    themselves and call ``_cached_module.plan`` with the reference's tensor-core plan
    arguments, storing what it returns as ``_plan_info``. That re-plans this wrapper from the
    host indptr and KV lengths given, copies nothing into the buffers, keeps the score
    parameters, and run() launches on the new schedule."""
    w = _graph_wrapper(pages=64)
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, sm_scale=0.2, window_left=-1)
    first = w._plan_info
    w._paged_kv_indptr_buf.copy_(_i32([0, 63, 64]))
    w._paged_kv_indices_buf.copy_(torch.arange(64, dtype=torch.int32))
    w._paged_kv_last_page_len_buf.copy_(_i32([7, 3]))
    plan_info = w._cached_module.plan(*_reference_plan_args(w, [0, 63, 64], [999, 3]))
    assert plan_info is w._plan_info and plan_info is not first
    assert plan_info.schedule == plan_prefill_schedule([0, 1, 2], [999, 3], 4, 2, MAX_CTAS)
    assert plan_info.work_capacity == first.work_capacity  # the captured grid's
    assert cpu_tc.uploads[-1][: len(cpu_tc.uploads[0])] != cpu_tc.uploads[0]
    assert w._paged_kv_indptr_buf.tolist() == [0, 63, 64]  # untouched: the engine's
    assert w._paged_kv_last_page_len_buf.tolist() == [7, 3]
    assert (w._sm_scale, w._logits_soft_cap, w._cached_q_data_type) == (0.2, 0.0, torch.bfloat16)
    w.run(_bf16(2, 8, 128), _cache())
    launch = cpu_tc.launches[-1]
    assert launch["plan"] is plan_info.plan_words and launch["grid_work"] == first.grid_work
    assert launch["score_scale"] == pytest.approx(0.2 * LOG2E)

    args = _reference_plan_args(w, [0, 2, 3], [21, 16])
    with pytest.raises(TypeError, match="the reference's 15, 16, 18, 19 or 20 positional"):
        w._cached_module.plan(*args[:17])
    with pytest.raises(ValueError, match="num_colocated_ctas must be 0, got 2"):
        w._cached_module.plan(*args[:18], 2)
    with pytest.raises(ValueError, match="uniform_q_len=3 with 1 query tokens a request"):
        w._cached_module.plan(*args[:19], 3)
    with pytest.raises(ValueError, match="causal=True with 1 query tokens a request"):
        w._cached_module.plan(*args[:14], True, *args[15:])
    with pytest.raises(ValueError, match="head_dim_qk \\(128\\) and head_dim_vo \\(64\\) differ"):
        w._cached_module.plan(*args[:13], 64, *args[14:])
    with pytest.raises(ValueError, match="batch_size is 3, the page-table buffers hold 2"):
        w._cached_module.plan(*_reference_plan_args(w, [0, 1, 2, 3], [5, 6, 7]))
    with pytest.raises(ValueError, match="kv_indptr has 4 elements, expected 3"):
        w._cached_module.plan(*_reference_plan_args(w, [0, 1, 2, 3], [5, 6]))
    three_lengths = _reference_plan_args(w, [0, 1, 2], [5, 6, 7])
    three_lengths[6:8] = [2, 2]  # total_num_rows, batch_size
    with pytest.raises(ValueError, match="seq_lens has 3 elements, expected 2"):
        w._cached_module.plan(*three_lengths)


@pytest.mark.parametrize("arity", [15, 16, 18, 19, 20])
def test_the_cached_modules_plan_takes_every_form_of_the_reference(cpu_tc, arity) -> None:
    """Each release's positional form schedules the same requests; the oldest (15, no
    window_left) keeps the window of the last plan(), which vLLM sets as _window_left."""
    w = _graph_wrapper(pages=64)
    w.plan(*TABLE, *SHAPE, q_data_type=torch.bfloat16, window_left=40)
    args = _reference_plan_args(w, [0, 2, 3], [21, 16], arity)
    if arity >= 16:
        args[15] = 40
    plan_info = w._cached_module.plan(*args)
    assert plan_info is w._plan_info and w._window_left == 40
    assert plan_info.schedule == plan_prefill_schedule([0, 1, 2], [21, 16], 4, 2, MAX_CTAS)
    w.run(_bf16(2, 8, 128), _cache())
    assert cpu_tc.launches[-1]["plan"] is plan_info.plan_words
    assert cpu_tc.launches[-1]["window_left"] == 40


# -- single decode ------------------------------------------------------------------------------


def test_single_decode_runs_a_single_prefill_of_one_token(cpu_tc: CpuPrefill) -> None:
    q, k, v = _bf16(8, 128), _bf16(10, 2, 128), _bf16(10, 2, 128)
    out, lse = flashinfer.single_decode_with_kv_cache(
        q,
        k,
        v,
        use_tensor_cores=True,
        q_scale=2.0,
        k_scale=3.0,
        v_scale=0.5,
        sm_scale=0.1,
        window_left=4,
        return_lse=True,
    )
    launch = cpu_tc.launches[-1]
    assert launch["q"].shape == (1, 8, 128) and torch.equal(launch["q"][0], q)
    assert launch["k"] is k and launch["v"] is v and not launch["hnd"]
    assert launch["causal"] is False and launch["window_left"] == 4
    assert launch["custom_mask"] is None and launch["num_chunks"] == 1
    assert launch["score_scale"] == pytest.approx(0.1 * 6.0 * LOG2E)
    assert out.shape == (8, 128) and out.dtype == torch.bfloat16 and bool((out == 0.5).all())
    assert lse.shape == (8,) and lse.dtype == torch.float32
    out = flashinfer.single_decode_with_kv_cache(
        q,
        k.transpose(0, 1).contiguous(),
        v.transpose(0, 1).contiguous(),
        kv_layout="HND",
        use_tensor_cores=True,
        logits_soft_cap=30.0,
    )
    launch = cpu_tc.launches[-1]
    assert out.shape == (8, 128) and launch["hnd"] and launch["lse"] is None
    assert launch["score_scale"] == pytest.approx(128**-0.5 / 30.0)
    assert launch["score_cap"] == pytest.approx(30.0 * LOG2E)
    # a group the CUDA-core kernel refuses (256 heads of 128 dims per thread block)
    flashinfer.single_decode_with_kv_cache(
        _bf16(256, 128), k[:, :1], v[:, :1], use_tensor_cores=True
    )
    assert cpu_tc.launches[-1]["q"].shape == (1, 256, 128)


SINGLE_BAD = [
    ("q must be 2-D", ValueError, dict(q=_bf16(1, 8, 128))),
    (
        "num_qo_heads \\(8\\) must be a multiple of num_kv_heads \\(3, k.shape\\[1\\] with "
        "kv_layout='NHD'\\)",
        ValueError,
        dict(k=_bf16(10, 3, 128), v=_bf16(10, 3, 128)),
    ),
    ("q_scale must be > 0.0", ValueError, dict(q_scale=0.0)),
    ("k must be 16-byte aligned", ValueError, dict(k=_bf16(2561)[1:].view(10, 2, 128))),
    ("window_left must be >= -1", ValueError, dict(window_left=-2)),
]


@pytest.mark.parametrize("message,error,overrides", SINGLE_BAD, ids=[b[0][:40] for b in SINGLE_BAD])
def test_single_decode_bad_arguments(cpu_tc, message, error, overrides) -> None:
    args = dict(q=_bf16(8, 128), k=_bf16(10, 2, 128), v=_bf16(10, 2, 128), use_tensor_cores=True)
    args.update(overrides)
    with pytest.raises(error, match=message):
        flashinfer.single_decode_with_kv_cache(**args)
    assert cpu_tc.launches == []


# -- GPU: numerics ------------------------------------------------------------------------------


LSE_TOLERANCE = lse_tolerance(tensor_cores=True)


def _paged(
    lens: list[int],
    page_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    layout: str,
    seed: int,
):  # noqa: ANN202
    """Per-request K/V and a NaN-poisoned paged cache holding them over shuffled pages (with
    spare pages): (ks, vs, k_cache, v_cache, indptr, indices, last_page_len), the table on
    the host."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // page_size) for n in lens]
    num_pages = sum(pages) + 3
    indices = torch.randperm(num_pages, generator=gen)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor(
        [0, *torch.tensor(pages, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32
    )
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 1 for n, p in zip(lens, pages)], dtype=torch.int32
    )
    page = (page_size, kv_heads, head_dim) if layout == "NHD" else (kv_heads, page_size, head_dim)
    k_cache = torch.full((num_pages, *page), NAN, dtype=dtype, device="cuda")
    v_cache = torch.full_like(k_cache, NAN)
    ks = [torch.randn(n, kv_heads, head_dim, dtype=dtype, device="cuda") for n in lens]
    vs = [torch.randn(n, kv_heads, head_dim, dtype=dtype, device="cuda") for n in lens]
    for b, (k, v) in enumerate(zip(ks, vs)):
        position = torch.arange(k.shape[0], device="cuda")
        ids = indices[indptr[b] : indptr[b + 1]].long().cuda()[position // page_size]
        slots = position % page_size
        for cache, values in ((k_cache, k), (v_cache, v)):
            if layout == "NHD":
                cache[ids, slots] = values
            else:
                cache[ids, :, slots] = values
    return ks, vs, k_cache, v_cache, indptr, indices, last


def _workspace() -> torch.Tensor:
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


GPU_CASES = [  # (group, head_dim, page_size, layout, dtype)
    (1, 128, 16, "NHD", torch.float16),
    (4, 128, 1, "HND", torch.bfloat16),
    (8, 128, 16, "HND", torch.float16),
    (1, 64, 1, "NHD", torch.bfloat16),
    (4, 64, 16, "NHD", torch.float16),
    (8, 64, 16, "HND", torch.bfloat16),
    (1, 256, 16, "HND", torch.bfloat16),
    (4, 256, 16, "NHD", torch.bfloat16),
    (8, 256, 1, "NHD", torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("group,head_dim,page_size,layout,dtype", GPU_CASES)
def test_tensor_core_decode_matches_cuda_cores_and_float64(
    group, head_dim, page_size, layout, dtype
) -> None:
    """Empty, one-token, page-straddling and long (split and merged) requests; full
    attention, a soft cap with a custom sm_scale, and a sliding window; the LSE; outputs
    poisoned with NaN, so a row left unwritten fails (tests/ops/test_decode.py's check)."""
    lens, kv_heads = [1, 17, 0, 300, 4099, 33], 2
    args = ("cuda", lens, group * kv_heads, kv_heads, head_dim, page_size, layout, dtype)
    tensor_cores = check_batch_decode(*args, use_tensor_cores=True, kv_tuple=group == 4)
    cuda_cores = check_batch_decode(*args, kv_tuple=group != 4)
    for (out, lse), (core_out, core_lse) in zip(tensor_cores, cuda_cores):
        torch.testing.assert_close(out, core_out, **tolerance(dtype, tensor_cores=True))
        torch.testing.assert_close(lse, core_lse, **LSE_TOLERANCE)


Q_LEN_CASES = [  # (q_len_per_req, group, head_dim, layout, dtype)
    (2, 4, 128, "NHD", torch.bfloat16),
    (4, 8, 64, "HND", torch.float16),
    (3, 1, 256, "NHD", torch.bfloat16),
    (7, 4, 128, "HND", torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("q_len,group,head_dim,layout,dtype", Q_LEN_CASES)
def test_several_query_tokens_per_request_attend_causally(
    q_len, group, head_dim, layout, dtype
) -> None:
    """q_len_per_req > 1: request b's rows b * q_len ... are its newest tokens, each seeing
    the keys up to its own position (bottom-right causal), with and without a window, on
    short, page-straddling and split requests; outputs poisoned with NaN."""
    torch.manual_seed(q_len * head_dim + group)
    kv_heads, page_size = 2, 16
    qo_heads = group * kv_heads
    lens = [q_len, q_len + 17, 300, 4099, 33]
    ks, vs, k_cache, v_cache, indptr, indices, last = _paged(
        lens, page_size, kv_heads, head_dim, dtype, layout, seed=q_len
    )
    q = torch.randn(len(lens) * q_len, qo_heads, head_dim, dtype=dtype, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(_workspace(), layout, use_tensor_cores=True)
    for window in (-1, 5):
        w.plan(
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            window_left=window,
            q_len_per_req=q_len,
        )
        out = torch.full_like(q, NAN)
        lse = torch.full(q.shape[:2], NAN, device="cuda")
        w.run(q, (k_cache, v_cache), out=out, lse=lse, return_lse=True)
        for b in range(len(lens)):
            rows = slice(b * q_len, (b + 1) * q_len)
            want, want_lse = reference.attention(
                q[rows], ks[b], vs[b], causal=True, window_left=window
            )
            assert_output_close(out[rows], want, **tolerance(dtype, tensor_cores=True))
            torch.testing.assert_close(lse[rows].double(), want_lse, **LSE_TOLERANCE)


@pytest.mark.gpu
def test_large_groups_scales_and_the_5d_cache_form() -> None:
    """A group of 128 (two 64-row tiles per token, past the CUDA-core kernel's limit), and a
    group of 32 with q_scale/k_scale/v_scale, on a split of long requests."""
    torch.manual_seed(128)
    dtype, head_dim, page_size = torch.bfloat16, 128, 16
    for qo_heads, kv_heads in ((128, 1), (32, 1)):
        lens = [9000, 5, 700]
        ks, vs, k_cache, v_cache, indptr, indices, last = _paged(
            lens, page_size, kv_heads, head_dim, dtype, "NHD", seed=qo_heads
        )
        q = torch.randn(len(lens), qo_heads, head_dim, dtype=dtype, device="cuda")
        w = BatchDecodeWithPagedKVCacheWrapper(_workspace(), use_tensor_cores=True)
        w.plan(
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            sm_scale=0.05,
        )
        out, lse = w.run(
            q,
            torch.stack([k_cache, v_cache], dim=1),
            q_scale=0.5,
            k_scale=2.5,
            v_scale=0.25,
            return_lse=True,
        )
        for b in range(len(lens)):
            want, want_lse = reference.decode_attention(q[b], ks[b], vs[b], 0.05 * 0.5 * 2.5)
            assert_output_close(out[b], want * 0.25, **tolerance(dtype, tensor_cores=True))
            torch.testing.assert_close(lse[b].double(), want_lse, **LSE_TOLERANCE)


@pytest.mark.gpu
def test_cuda_graph_replay_after_re_planning_and_rewriting_the_buffers() -> None:
    """A run() captured under one plan replays correctly after plan(), fast_decode_plan(),
    the module plan vLLM calls (``_cached_module.plan`` with the reference's arguments, after
    writing the buffers) and a direct rewrite of the page-table buffers with no plan at all."""
    torch.manual_seed(3)
    dtype, page_size, qo_heads, kv_heads, head_dim, batch = torch.float16, 16, 32, 4, 128, 3
    num_pages = 3000
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(batch, dtype=torch.int32, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(
        _workspace(),
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf,
    )
    k_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, qo_heads, head_dim, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(batch, qo_heads, device="cuda")

    def table(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        pages = [-(-n // page_size) for n in lens]
        ids = torch.randperm(num_pages, generator=gen)[: sum(pages)].to(torch.int32)
        indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        last = torch.tensor(
            [n - (p - 1) * page_size for n, p in zip(lens, pages)], dtype=torch.int32
        )
        return indptr, ids, last

    def expected(
        lens: list[int], indptr: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outs, lses = [], []
        for b, n in enumerate(lens):
            pages = ids[indptr[b] : indptr[b + 1]].long().cuda()
            k = k_cache[pages].reshape(-1, kv_heads, head_dim)[:n]
            v = v_cache[pages].reshape(-1, kv_heads, head_dim)[:n]
            o, s = reference.decode_attention(q[b], k, v, head_dim**-0.5)
            outs.append(o)
            lses.append(s)
        return torch.stack(outs), torch.stack(lses)

    first = table([40, 3000, 7], 0)
    w.plan(*first, qo_heads, kv_heads, head_dim, page_size, q_data_type=dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q, (k_cache, v_cache), out=out, lse=lse)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k_cache, v_cache), out=out, lse=lse)

    steps = (
        ([40, 3000, 7], "plan"),
        ([20000, 1, 300], "plan"),
        ([5000, 1, 33], "none"),
        ([17, 20000, 300], "fast"),
        ([9000, 64, 2], "module"),
        ([100, 100, 100], "plan"),
    )
    for step, (lens, how) in enumerate(steps):
        indptr, ids, last = table(lens, step + 1)
        if how == "plan":
            w.plan(indptr, ids, last, qo_heads, kv_heads, head_dim, page_size, q_data_type=dtype)
        else:  # the engine writes the buffers itself
            indptr_buf.copy_(indptr)
            indices_buf[: ids.numel()].copy_(ids)
            last_buf.copy_(last)
            if how == "fast":
                fast_decode_plan(
                    w,
                    indptr_buf,
                    indices_buf,
                    last_buf,
                    qo_heads,
                    kv_heads,
                    head_dim,
                    page_size,
                    q_data_type=dtype,
                    global_override_indptr_cpu=indptr,
                )
            if how == "module":  # vLLM's fast_plan_decode after its first call
                args = [
                    w._float_workspace_buffer,
                    w._int_workspace_buffer,
                    w._pin_memory_int_workspace_buffer,
                    decode_api._get_range_buf(batch + 1, "cpu"),
                    indptr,
                    torch.tensor(lens, dtype=torch.int32),
                    batch,
                    batch,
                    qo_heads,
                    kv_heads,
                    page_size,
                    True,
                    head_dim,
                    head_dim,
                    False,
                    -1,
                    -1,
                    False,
                    0,
                ]
                w._plan_info = w._cached_module.plan(*args)
        q.copy_(torch.randn_like(q))
        out.fill_(NAN)
        lse.fill_(NAN)
        graph.replay()
        want, want_lse = expected(lens, indptr, ids)
        assert_output_close(out, want, **tolerance(dtype, tensor_cores=True))
        torch.testing.assert_close(lse.double(), want_lse, **LSE_TOLERANCE)


SINGLE_GPU_CASES = [  # (kv_len, qo_heads, kv_heads, head_dim, layout, dtype)
    (1, 8, 8, 128, "NHD", torch.float16),
    (255, 32, 8, 64, "HND", torch.bfloat16),
    (4097, 32, 4, 128, "NHD", torch.bfloat16),
    (33001, 32, 8, 256, "HND", torch.float16),
    (1000, 64, 8, 128, "NHD", torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kv_len,qo_heads,kv_heads,head_dim,layout,dtype", SINGLE_GPU_CASES)
def test_single_decode_with_tensor_cores_matches(
    kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    torch.manual_seed(kv_len)
    q = torch.randn(qo_heads, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(kv_len, kv_heads, head_dim, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    kk, vv = (
        (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
        if layout == "HND"
        else (k, v)
    )
    for sm_scale, cap, window in ((None, None, -1), (0.3, 30.0, -1), (None, None, 100)):
        scale = head_dim**-0.5 if sm_scale is None else sm_scale
        want, want_lse = reference.decode_attention(q, k, v, scale * 2.0, cap, window)
        got = []
        for use_tensor_cores in (True, False):
            # single decode allocates its outputs: free NaN blocks of their sizes first, so
            # the caching allocator (best effort) hands them out and an unwritten row is NaN
            poison = (
                torch.full((qo_heads, head_dim), NAN, dtype=dtype, device="cuda"),
                torch.full((qo_heads,), NAN, device="cuda"),
            )
            del poison
            out, lse = flashinfer.single_decode_with_kv_cache(
                q,
                kk,
                vv,
                kv_layout=layout,
                use_tensor_cores=use_tensor_cores,
                q_scale=2.0,
                sm_scale=sm_scale,
                logits_soft_cap=cap,
                window_left=window,
                return_lse=True,
            )
            assert out.shape == q.shape and out.dtype == dtype and lse.shape == (qo_heads,)
            got.append((out, lse))
        (out, lse), (core_out, core_lse) = got
        assert_output_close(out, want, **tolerance(dtype, tensor_cores=True))
        torch.testing.assert_close(lse.double(), want_lse, **LSE_TOLERANCE)
        torch.testing.assert_close(out, core_out, **tolerance(dtype, tensor_cores=True))
        torch.testing.assert_close(lse, core_lse, **LSE_TOLERANCE)
