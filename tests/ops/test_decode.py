"""Decode attention and cascade merging: the split-KV scheduler, plan() and argument checks
on the CPU (with the decode module compiled for 9.0a); numerics against a float32 torch
reference, page-order independence and CUDA-graph replay on the GPU."""

from __future__ import annotations

import math
import random
from typing import Iterator

import pytest
import torch

import flashinfer
from flashinfer import cascade as cascade_api
from flashinfer import checks
from flashinfer import decode as decode_api
from flashinfer.decode_schedule import (
    kv_lengths,
    pack_schedule,
    plan_decode_schedule,
    plan_length,
)
from flashinfer.jit.decode import DTYPES, HEAD_DIMS, gen_cascade_module, gen_decode_module
from flashinfer.jit.kv_dtype import KV_FP8_DTYPES
from flashinfer.jit.pos_encoding import POS_ENCODINGS
from flashinfer.testing import reference
from flashinfer.testing.reference import decode_attention as reference_decode
from tests.conftest import run_python
from tests.ops.attention_error import assert_output_close
from tests.ops.nan_inputs import assert_nan_where
from tests.ops.test_norm import build_without_spills
from tests.ops.test_prefill import cpu_kernels, cpu_prefill  # noqa: F401 - a fixture
from tests.ops.test_prefill_gpu import _break_page_ids, _kv_data, _on_broken_pages, _paged_kv

# -- the scheduler (pure host code) --------------------------------------------------------------


def model_chunk(lens: list[int], heads: int, max_ctas: int, min_chunk: int) -> int | None:
    """The expected chunking, by brute force: no split when the batch alone fills the GPU
    or nothing is longer than min_chunk; else the smallest chunk >= min_chunk whose CTA
    count fits in max_ctas (None when that is one chunk per request)."""
    longest = max(lens, default=0)
    if len(lens) * heads >= max_ctas or longest <= min_chunk:
        return None
    for chunk in range(min_chunk, longest + 1):
        if sum(max(1, math.ceil(n / chunk)) for n in lens) * heads <= max_ctas:
            return chunk if chunk < longest else None
    raise AssertionError("unreachable: chunk = longest always fits")


def check_covers(schedule, lens: list[int], begins: list[int]) -> None:
    """Each request's range is covered once, in order, by chunks of at most chunk_size."""
    by_request: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, e, t in zip(
        schedule.work_request, schedule.work_start, schedule.work_end, schedule.work_tmp_row
    ):
        by_request.setdefault(r, []).append((s, e, t))
    assert sorted(by_request) == list(range(len(lens)))
    chunk_ids: dict[int, list[tuple[int, int]]] = {}
    for r, c, n in zip(schedule.work_request, schedule.work_chunk, schedule.work_chunks):
        chunk_ids.setdefault(r, []).append((c, n))
    for r, ids in chunk_ids.items():  # what the device reads: chunk c of n, in order
        assert ids == [(c, len(ids)) for c in range(len(ids))]
    tmp_rows = []
    for r, items in by_request.items():
        assert items[0][0] == begins[r] and items[-1][1] == lens[r]
        for (_, e0, _), (s1, _, _) in zip(items, items[1:]):
            assert e0 == s1
        if len(items) == 1:
            assert items[0][2] == -1
        else:
            assert all(e - s <= schedule.chunk_size for s, e, _ in items)
            tmp_rows += [t for _, _, t in items]
            i = schedule.merge_request.index(r)
            assert list(range(schedule.merge_indptr[i], schedule.merge_indptr[i + 1])) == [
                t for _, _, t in items
            ]
    assert sorted(tmp_rows) == list(range(schedule.num_tmp_rows))


@pytest.mark.parametrize("seed", range(40))
def test_scheduler_matches_the_model(seed: int) -> None:
    rnd = random.Random(seed)
    batch = rnd.choice([1, 1, 2, 3, 8, 16, 64, 300])
    lens = [
        rnd.choice([0, 1, 7, 255, 256, 257, 4096, 32768, rnd.randint(1, 131072)])
        for _ in range(batch)
    ]
    heads = rnd.choice([1, 2, 8, 32])
    max_ctas = rnd.choice([132, 528, 924, 4224])
    schedule = plan_decode_schedule(lens, heads, max_ctas)
    assert schedule.chunk_size == model_chunk(lens, heads, max_ctas, 256)
    check_covers(schedule, lens, [0] * batch)
    if schedule.chunk_size is not None:
        assert schedule.num_work * heads <= max_ctas
    assert schedule == plan_decode_schedule(lens, heads, max_ctas)  # deterministic


def test_one_long_request_fills_the_gpu() -> None:
    schedule = plan_decode_schedule([32768], 8, 924)
    assert schedule.num_work * 8 <= 924 and schedule.num_work * 8 > 924 // 2
    assert schedule.merge_request == (0,) and schedule.num_tmp_rows == schedule.num_work
    big_batch = plan_decode_schedule([4096] * 256, 8, 924)
    assert big_batch.chunk_size is None and big_batch.num_work == 256
    assert big_batch.work_tmp_row == (-1,) * 256 and big_batch.num_merge == 0


def test_sliding_window_schedules_only_the_window() -> None:
    schedule = plan_decode_schedule([10000, 50, 0], 4, 4, window_left=99)
    assert schedule.chunk_size is None
    assert list(zip(schedule.work_start, schedule.work_end)) == [(9900, 10000), (0, 50), (0, 0)]
    split = plan_decode_schedule([100000], 1, 64, window_left=9999)
    check_covers(split, [100000], [90000])


def test_kv_lengths_and_packed_layout() -> None:
    assert kv_lengths([0, 3, 3, 4], [5, 9, 1], 16) == [37, 0, 1]
    schedule = plan_decode_schedule([1000, 10], 1, 8)  # 1000 splits into chunks of 256
    assert schedule.chunk_size == 256 and schedule.num_work == 5
    words = pack_schedule(schedule, 6, 2)
    assert len(words) == plan_length(6, 2)
    assert words[:2] == [5, 256]  # num_work, chunk_tokens
    assert words[2:8] == [0, 0, 0, 0, 1, 0]  # request
    assert words[8:14] == [0, 1, 2, 3, 0, 0]  # chunk index
    assert words[14:20] == [4, 4, 4, 4, 1, 0]  # chunks of the request
    assert words[20:26] == [0, 1, 2, 3, -1, 0]  # tmp row
    assert words[26:29] == [1, 0, 0]  # num_merge, merge_request
    assert words[29:] == [0, 4, 0]  # merge_indptr (padded)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        pack_schedule(schedule, 4, 2)
    long = [4 << 31]  # tokens: a chunk size is a word, so below 2^31
    largest = plan_decode_schedule(long, 1, 8, fixed_chunk=(1 << 31) - 1)
    assert pack_schedule(largest, 5, 1)[1] == (1 << 31) - 1
    with pytest.raises(ValueError, match="the schedule does not fit in int32"):
        pack_schedule(plan_decode_schedule(long, 1, 8, fixed_chunk=1 << 31), 5, 1)


def test_fixed_split_size_and_disabled_split() -> None:
    fixed = plan_decode_schedule([1000, 10], 1, 8, fixed_chunk=100)
    assert fixed.chunk_size == 100 and fixed.num_work == 11
    check_covers(fixed, [1000, 10], [0, 0])
    assert plan_decode_schedule([1000, 10], 1, 8, fixed_chunk=5000).chunk_size is None
    never = plan_decode_schedule([100000], 1, 1000, allow_split=False)
    assert never.chunk_size is None and never.num_work == 1


# -- argument checks before any launch ---------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args):  # noqa: ANN002, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(decode_api, "get_decode_module", refuse)
    monkeypatch.setattr(cascade_api, "get_cascade_module", refuse)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


SINGLE_BAD = [
    ("kv_layout must be 'NHD' or 'HND'", ValueError, dict(kv_layout="NDH")),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("q must be 2-D", ValueError, dict(q=_bf16(1, 8, 128))),
    (
        "q has dtype torch.float32; supported: float16, bfloat16",
        TypeError,
        dict(q=torch.randn(8, 128)),
    ),
    (
        "k has dtype torch.float16, but q has torch.bfloat16",
        TypeError,
        dict(k=torch.randn(10, 2, 128, dtype=torch.float16)),
    ),
    ("v has shape \\(11, 2, 128\\), k has \\(10, 2, 128\\)", ValueError, dict(v=_bf16(11, 2, 128))),
    ("q must be 16-byte aligned", ValueError, dict(q=_bf16(8 * 128 + 1)[1:].view(8, 128))),
    (
        "k's strides must be multiples of 8 elements",
        ValueError,
        dict(k=_bf16(10, 2, 130)[..., :128]),
    ),
    (
        "head_dim must be one of 64, 128, 256, got 96",
        ValueError,
        dict(q=_bf16(8, 96), k=_bf16(10, 2, 96), v=_bf16(10, 2, 96)),
    ),
    (
        "num_qo_heads \\(8\\) must be a multiple of num_kv_heads \\(3, k.shape\\[1\\] with "
        "kv_layout='NHD'\\)",
        ValueError,
        dict(k=_bf16(10, 3, 128), v=_bf16(10, 3, 128)),
    ),
    ("k has head_dim 64, q has 128", ValueError, dict(k=_bf16(10, 2, 64), v=_bf16(10, 2, 64))),
    ("sm_scale must be > 0.0", ValueError, dict(sm_scale=0.0)),
    ("logits_soft_cap must be >= 0.0", ValueError, dict(logits_soft_cap=-1.0)),
    ("k_scale must be > 0.0", ValueError, dict(k_scale=-1.0)),
    ("q_scale must be a float", TypeError, dict(q_scale="1")),
    ("v_scale must be finite", ValueError, dict(v_scale=float("nan"))),
    ("use_tensor_cores must be a bool", TypeError, dict(use_tensor_cores=1)),
    ("rope_theta must be > 0.0", ValueError, dict(rope_theta=0.0)),
    (
        "rope_scale must be finite",
        ValueError,
        dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=float("inf")),
    ),
    ("return_lse must be a bool", TypeError, dict(return_lse=None)),
    ("window_left must be >= -1", ValueError, dict(window_left=-2)),
    ("k must be contiguous in its last dim", ValueError, dict(k=_bf16(10, 128, 2).transpose(1, 2))),
    ("q must be a CUDA tensor", ValueError, dict()),
]


@pytest.mark.parametrize("message,error,overrides", SINGLE_BAD, ids=[b[0][:40] for b in SINGLE_BAD])
def test_single_decode_bad_arguments(no_launch, message, error, overrides) -> None:
    args = dict(q=_bf16(8, 128), k=_bf16(10, 2, 128), v=_bf16(10, 2, 128))
    args.update(overrides)
    with pytest.raises(error, match=message):
        flashinfer.single_decode_with_kv_cache(**args)


class CpuPlan:
    """plan()/run() on the CPU: a fixed GPU size, uploads recorded instead of copied, and a
    stand-in decode module that records each launch and fills ``out`` with ones."""

    def __init__(self) -> None:
        self.uploads: list[list[int]] = []
        self.launches: list[tuple] = []
        # (dtype, head_dim, pos_encoding) of each module asked for, and its KV dtype
        self.modules: list[tuple] = []
        self.kv_dtypes: list[torch.dtype | None] = []

    def get_decode_module(
        self,
        dtype: torch.dtype,
        head_dim: int,
        pos_encoding: str = "NONE",
        kv_dtype: torch.dtype | None = None,
    ) -> CpuPlan:
        self.modules.append((dtype, head_dim, pos_encoding))
        self.kv_dtypes.append(kv_dtype)
        return self

    def batch_decode(self, *args) -> None:  # noqa: ANN002
        self.launches.append(args)
        args[9].fill_(1.0)  # out

    def single_decode(self, *args) -> None:  # noqa: ANN002
        self.launches.append(args)
        args[5].fill_(1.0)  # out


@pytest.fixture
def cpu_plan(monkeypatch: pytest.MonkeyPatch) -> Iterator[CpuPlan]:
    record = CpuPlan()
    monkeypatch.setattr(decode_api, "_max_ctas", lambda *a: 64)
    monkeypatch.setattr(decode_api, "get_device_sm_count", lambda device: 2)
    monkeypatch.setattr(decode_api, "get_decode_module", record.get_decode_module)
    monkeypatch.setattr(
        decode_api.BatchDecodeWithPagedKVCacheWrapper,
        "_upload",
        lambda self, words, target: record.uploads.append(list(words)),
    )
    monkeypatch.setattr(checks, "check_cuda", lambda *a, **k: None)
    with cpu_kernels():
        yield record


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _plan_args(**overrides):  # noqa: ANN202
    args = dict(
        indptr=_i32([0, 2, 3]),
        indices=_i32([4, 1, 0]),
        last_page_len=_i32([5, 16]),
        num_qo_heads=8,
        num_kv_heads=2,
        head_dim=128,
        page_size=16,
        q_data_type=torch.bfloat16,
    )
    args.update(overrides)
    return args


PLAN_BAD = [
    (
        "indptr must be non-decreasing, but indptr\\[2\\] = 2 < indptr\\[1\\] = 3",
        ValueError,
        dict(indptr=_i32([0, 3, 2])),
    ),
    ("indptr must start at 0, got indptr\\[0\\] = 1", ValueError, dict(indptr=_i32([1, 2, 3]))),
    (
        "indptr\\[-1\\] must be at most len\\(indices\\) = 2, got 3",
        ValueError,
        dict(indices=_i32([0, 1])),
    ),
    (
        "last_page_len\\[0\\] is 17, must be in \\[1, page_size=16\\]",
        ValueError,
        dict(last_page_len=_i32([17, 1])),
    ),
    ("last_page_len\\[1\\] is 0", ValueError, dict(last_page_len=_i32([1, 0]))),
    ("last_page_len has 3 elements, expected 2", ValueError, dict(last_page_len=_i32([1, 1, 1]))),
    ("indptr has dtype torch.float32", TypeError, dict(indptr=torch.zeros(3))),
    ("head_dim must be one of 64, 128, 256, got 80", ValueError, dict(head_dim=80)),
    ("must be a multiple of num_kv_heads", ValueError, dict(num_kv_heads=3)),
    ("page_size must be >= 1", ValueError, dict(page_size=0)),
    ("q_data_type is torch.float32; supported", TypeError, dict(q_data_type=torch.float32)),
    (
        "kv_data_type torch.float16 differs from q_data_type",
        TypeError,
        dict(kv_data_type="float16"),
    ),
    ("window_left must be an int", TypeError, dict(window_left=1.5)),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("rope_scale must be > 0.0", ValueError, dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=0)),
    (
        'pos_encoding_mode="ROPE_LLAMA" needs a 16-bit KV cache, not float8_e5m2',
        ValueError,
        dict(pos_encoding_mode="ROPE_LLAMA", kv_data_type="float8_e5m2"),
    ),
    ("kv_data_type 'int8' is not a supported dtype", TypeError, dict(kv_data_type="int8")),
    (
        "o_data_type torch.float8_e4m3fn is not|o_data_type 'float8_e4m3fn' is not",
        TypeError,
        dict(o_data_type="float8_e4m3fn"),
    ),
]


@pytest.mark.parametrize("message,error,overrides", PLAN_BAD, ids=[b[0][:40] for b in PLAN_BAD])
def test_plan_bad_arguments(cpu_plan, message, error, overrides) -> None:
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(error, match=message):
        wrapper.plan(**_plan_args(**overrides))
    assert cpu_plan.uploads == [] and wrapper._plan_info is None


def test_plan_uploads_the_schedule_and_run_checks_against_it(cpu_plan) -> None:
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        wrapper.run(_bf16(2, 8, 128), (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)))
    wrapper.plan(**_plan_args())
    assert len(cpu_plan.uploads) == 1
    words = cpu_plan.uploads[0]
    lens = kv_lengths([0, 2, 3], [5, 16], 16)
    schedule = plan_decode_schedule(lens, 2, 64)
    assert words == pack_schedule(schedule, schedule.num_work, schedule.num_merge)
    cache = (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128))
    bad_runs = [
        (
            "q has shape \\(3, 8, 128\\); plan\\(\\) was for \\(2, 8, 128\\)",
            ValueError,
            (_bf16(3, 8, 128), cache),
        ),
        (
            "q has dtype torch.float16; plan\\(\\) was for torch.bfloat16",
            TypeError,
            (torch.randn(2, 8, 128, dtype=torch.float16), cache),
        ),
        (
            "paged_kv_cache\\[0\\] has shape \\(5, 2, 16, 128\\); plan\\(\\) was for pages of "
            "\\(16, 2, 128\\)",
            ValueError,
            (_bf16(2, 8, 128), (_bf16(5, 2, 16, 128), _bf16(5, 2, 16, 128))),
        ),
        (
            "paged_kv_cache\\[1\\] has dtype torch.float16",
            TypeError,
            (_bf16(2, 8, 128), (cache[0], torch.zeros(5, 16, 2, 128, dtype=torch.float16))),
        ),
        (
            "paged_kv_cache must hold keys and values in dim 1",
            ValueError,
            (_bf16(2, 8, 128), _bf16(5, 3, 16, 2, 128)),
        ),
        (
            "paged_kv_cache must be a \\(k_cache, v_cache\\) pair",
            ValueError,
            (_bf16(2, 8, 128), (cache[0],)),
        ),
    ]
    for message, error, args in bad_runs:
        with pytest.raises(error, match=message):
            wrapper.run(*args)
    with pytest.raises(ValueError, match="out has shape"):
        wrapper.run(_bf16(2, 8, 128), cache, out=_bf16(2, 8, 64))
    # the binding refuses these too, but only after the module is built, and never while
    # a graph is traced with fake tensors
    q = _bf16(2, 8, 128)
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        wrapper.run(_bf16(2 * 8 * 128 + 1)[1:].view(2, 8, 128), cache)
    with pytest.raises(ValueError, match="paged_kv_cache\\[0\\]'s strides must be multiples of 8"):
        wrapper.run(q, (_bf16(5, 16, 2, 132)[..., :128], cache[1]))
    with pytest.raises(ValueError, match="out and q must be different tensors"):
        wrapper.run(q, cache, out=q)
    out = _bf16(2, 8, 128)
    with pytest.raises(ValueError, match="lse and out must be different tensors"):
        wrapper.run(q, cache, out=out, lse=out.view(torch.float32).view(-1)[:16].view(2, 8))
    assert cpu_plan.launches == []


def test_position_encodings_run_their_builds_with_their_parameters(cpu_plan) -> None:
    """pos_encoding_mode="ROPE_LLAMA" (plan's, or forward()'s override) asks for the RoPE
    build of the module and passes 1 / rope_scale and 1 / rope_theta (defaults 1 and 1e4);
    "NONE" the plain build; "ALIBI" the ALiBi build, with the slopes."""
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    cache = (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128))
    names = gen_decode_module(torch.bfloat16, 128).function_args["batch_decode"]

    def last_launch() -> dict:
        return dict(zip(names, cpu_plan.launches[-1]))

    wrapper.plan(**_plan_args(pos_encoding_mode="ROPE_LLAMA", rope_scale=4.0, rope_theta=5e5))
    assert cpu_plan.modules[-1] == (torch.bfloat16, 128, "ROPE_LLAMA")
    wrapper.run(_bf16(2, 8, 128), cache)
    assert cpu_plan.modules[-1] == (torch.bfloat16, 128, "ROPE_LLAMA")
    assert last_launch()["rope_rcp_scale"] == 0.25
    assert last_launch()["rope_rcp_theta"] == pytest.approx(2e-6)
    wrapper.plan(**_plan_args())
    wrapper.run(_bf16(2, 8, 128), cache)
    assert cpu_plan.modules[-1] == (torch.bfloat16, 128, "NONE")
    assert (last_launch()["rope_rcp_scale"], last_launch()["rope_rcp_theta"]) == (1.0, 1e-4)
    wrapper.forward(_bf16(2, 8, 128), cache, pos_encoding_mode="ROPE_LLAMA", rope_theta=1e6)
    assert cpu_plan.modules[-1] == (torch.bfloat16, 128, "ROPE_LLAMA")
    assert last_launch()["rope_rcp_theta"] == pytest.approx(1e-6)
    assert last_launch()["alibi_slopes"] is None
    wrapper.forward(_bf16(2, 8, 128), cache, pos_encoding_mode="ALIBI")
    assert cpu_plan.modules[-1] == (torch.bfloat16, 128, "ALIBI")
    # the slopes of 8 heads (the reference's), in log2 units
    slopes = [2.0 ** (-(i + 1)) / math.log(2) for i in range(8)]
    assert last_launch()["alibi_slopes"].tolist() == pytest.approx(slopes, rel=1e-6)


def test_fp8_cache_runs_its_build_and_is_checked_against_the_plan(cpu_plan) -> None:
    """kv_data_type="float8_e4m3fn" (a dtype or its name) asks for the fp8-cache build, and
    run() takes only a cache of that dtype; k_scale folds into the score scale and v_scale
    scales the output, as for any cache. A cache of q's dtype asks for the plain build."""
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    fp8 = torch.float8_e4m3fn
    cache = (_bf16(5, 16, 2, 128).to(fp8), _bf16(5, 16, 2, 128).to(fp8))
    names = gen_decode_module(torch.bfloat16, 128).function_args["batch_decode"]
    for kv_data_type in ("float8_e4m3fn", fp8):
        wrapper.plan(**_plan_args(kv_data_type=kv_data_type))
        assert cpu_plan.kv_dtypes[-1] == fp8 and wrapper._cached_kv_data_type == fp8
        assert "kv_dtype=float8_e4m3fn" in repr(wrapper)
        out = wrapper.run(_bf16(2, 8, 128), cache, k_scale=0.5, v_scale=3.0)
        assert cpu_plan.kv_dtypes[-1] == fp8
        launch = dict(zip(names, cpu_plan.launches[-1]))
        assert launch["score_scale"] == pytest.approx(0.5 * 128**-0.5 * math.log2(math.e))
        assert torch.equal(out, torch.full_like(out, 3.0))  # the stand-in writes ones
    with pytest.raises(TypeError, match=r"paged_kv_cache\[0\] has dtype torch.bfloat16; plan"):
        wrapper.run(_bf16(2, 8, 128), (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)))
    with pytest.raises(TypeError, match="has dtype torch.float8_e5m2; plan\\(\\) was for "):
        wrapper.run(_bf16(2, 8, 128), tuple(c.view(torch.float8_e5m2) for c in cache))
    wrapper.plan(**_plan_args(kv_data_type="bfloat16"))
    wrapper.run(_bf16(2, 8, 128), (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)))
    assert cpu_plan.kv_dtypes[-1] == torch.bfloat16


def test_fp8_cache_with_tensor_cores_runs_the_prefill_kernel(cpu_plan, cpu_prefill) -> None:
    """use_tensor_cores=True with an fp8 cache plans and runs the prefill kernel's fp8 build
    (as the reference does), for one query token a request or more; single decode too."""
    fp8 = torch.float8_e4m3fn
    workspace = torch.empty(1 << 20, dtype=torch.uint8)
    tensor_cores = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, use_tensor_cores=True)
    tensor_cores.plan(**_plan_args(kv_data_type=fp8))
    assert not isinstance(tensor_cores._plan_info, decode_api._Plan)  # the prefill plan
    assert cpu_prefill.kv_dtypes[-1] == fp8 and len(cpu_prefill.uploads) == 1
    assert cpu_plan.uploads == [] and cpu_plan.kv_dtypes == []  # no CUDA-core build
    cache = (_bf16(5, 16, 2, 128).to(fp8), _bf16(5, 16, 2, 128).to(fp8))
    out = tensor_cores.run(_bf16(2, 8, 128), cache, v_scale=2.0)
    launch = cpu_prefill.launches[-1]
    assert launch["k"].dtype == fp8 and torch.equal(out, torch.full_like(out, 2.0))
    tensor_cores.plan(**_plan_args(kv_data_type=fp8, q_len_per_req=2))
    tensor_cores.run(_bf16(4, 8, 128), cache)
    assert cpu_prefill.launches[-1]["causal"] and tensor_cores._cached_kv_data_type == fp8
    with pytest.raises(
        TypeError, match="paged_kv_cache\\[0\\] has dtype torch.bfloat16; plan\\(\\) was for"
    ):
        tensor_cores.run(_bf16(4, 8, 128), (_bf16(5, 16, 2, 128), _bf16(5, 16, 2, 128)))
    q, k = _bf16(8, 128), _bf16(10, 2, 128).to(fp8)
    out = flashinfer.single_decode_with_kv_cache(q, k, k, use_tensor_cores=True)
    assert cpu_prefill.launches[-1]["k"].dtype == fp8 and cpu_plan.launches == []
    assert torch.equal(out, torch.ones_like(out))
    with pytest.raises(TypeError, match="v has dtype torch.float8_e5m2, but k has"):
        flashinfer.single_decode_with_kv_cache(q, k, k.view(torch.float8_e5m2))
    with pytest.raises(ValueError, match="needs a 16-bit KV cache, not float8_e4m3fn"):
        flashinfer.single_decode_with_kv_cache(q, k, k, pos_encoding_mode="ROPE_LLAMA")


def test_cuda_graph_mode_needs_fixed_buffers_and_fixes_the_batch(cpu_plan) -> None:
    ws = torch.empty(64 << 20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="use_cuda_graph=True needs paged_kv_indptr_buffer"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(3, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(8, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.zeros(2, dtype=torch.int32),
    )
    # a captured run() reads q/out at the captured batch: any other batch is refused
    for indptr, last in (([0, 1, 2, 3], [1, 1, 1]), ([0, 1], [1])):
        with pytest.raises(
            ValueError,
            match=r"batch size is fixed to the buffers' 2; plan\(\) "
            f"got {len(last)}",
        ):
            wrapper.plan(**_plan_args(indptr=_i32(indptr), last_page_len=_i32(last)))
    with pytest.raises(ValueError, match="9 page indices exceed the CUDA-graph buffer's 8"):
        wrapper.plan(**_plan_args(indices=torch.arange(9, dtype=torch.int32)))
    assert cpu_plan.uploads == []


@pytest.mark.parametrize("use_cuda_graph", [False, True])
def test_int64_page_ids_past_int32_become_ids_the_kernel_skips(cpu_plan, use_cuda_graph) -> None:
    """plan() narrows int64 page ids to the kernel's int32 by clamping (no device read): an
    id past int32 names no page then (the kernel skips it) instead of wrapping onto a real
    one (2**32 + 1 onto page 1), in the wrapper's own array and in a CUDA-graph buffer."""
    buffers = dict(
        paged_kv_indptr_buffer=torch.zeros(3, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(8, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.zeros(2, dtype=torch.int32),
    )
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(1 << 20, dtype=torch.uint8),
        use_cuda_graph=use_cuda_graph,
        **(buffers if use_cuda_graph else {}),
    )
    wrapper.plan(**_plan_args(indices=torch.tensor([4, 2**32 + 1, 0])))
    assert wrapper._paged_kv_indices_buf[:3].tolist() == [4, 2**31 - 1, 0]


def test_cuda_graph_fixed_split_past_the_graphs_capacity_is_refused(cpu_plan) -> None:
    """A captured grid holds the batch plus the chunks the GPU runs at once (2 SMs here, 32
    CTAs each, over 2 KV heads: 32): a fixed split into more chunks is refused, naming the
    remedy, before anything is uploaded; a larger one fits."""
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8),
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(3, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(48, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.zeros(2, dtype=torch.int32),
    )
    table = dict(indptr=_i32([0, 40, 41]), indices=torch.arange(41, dtype=torch.int32))
    with pytest.raises(
        ValueError,
        match="fixed_split_size=1\\) needs 41 work items and 40 tmp rows; a CUDA graph holds "
        "34 and 32 \\(tmp rows: as many as float_workspace_buffer holds\\): use a larger "
        "fixed_split_size",
    ):
        wrapper.plan(**_plan_args(**table), fixed_split_size=1)
    assert cpu_plan.uploads == []
    wrapper.plan(**_plan_args(**table), fixed_split_size=2)
    assert wrapper._plan_info.schedule.num_work == 21 and len(cpu_plan.uploads) == 1


def test_cuda_graph_tmp_rows_are_what_the_float_workspace_holds(
    cpu_plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA-graph wrapper's split-KV rows are bounded by the GPU (32 CTAs an SM) and by
    what its float workspace holds: 64 query heads over one KV head on 132 SMs would want
    4224 rows of 64 x 129 floats (139 MB) of a 128 MiB workspace, which plan() refused until
    session 36. The planner's own split must fit them or is dropped; every plan keeps the
    same capacity, so a captured graph's buffers stay put."""
    monkeypatch.setattr(decode_api, "get_device_sm_count", lambda device: 132)

    def graph_wrapper(workspace_bytes: int) -> flashinfer.BatchDecodeWithPagedKVCacheWrapper:
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(workspace_bytes, dtype=torch.uint8),
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(5, dtype=torch.int32),
            paged_kv_indices_buffer=torch.zeros(4000, dtype=torch.int32),
            paged_kv_last_page_len_buffer=torch.zeros(4, dtype=torch.int32),
        )

    wrapper = graph_wrapper(128 << 20)
    heads = dict(num_qo_heads=64, num_kv_heads=1, head_dim=128)
    fit = ((128 << 20) - 512) // (4 * 64 * 129)
    short = _plan_args(indptr=_i32([0, 1, 2, 3, 4]), last_page_len=_i32([1] * 4), **heads)
    wrapper.plan(**{**short, "indices": _i32([0, 1, 2, 3])})
    assert wrapper._plan_info.tmp_capacity == fit < 132 * 32
    long = _plan_args(
        indptr=_i32([0, 1000, 2000, 3000, 4000]),
        indices=torch.arange(4000, dtype=torch.int32),
        last_page_len=_i32([16] * 4),
        **heads,
    )
    monkeypatch.setattr(decode_api, "_max_ctas", lambda *a: 132 * 32)
    wrapper.plan(**long)  # the planner's split (252 chunks of 256 tokens), within the rows
    assert wrapper._plan_info.schedule.num_tmp_rows == 252 <= fit
    assert wrapper._plan_info.tmp_capacity == fit
    small = graph_wrapper(4 << 20)  # 126 rows
    small.plan(**long)  # the planner's split past the rows: none, rather than a refusal
    assert small._plan_info.schedule.num_tmp_rows == 0 and small._plan_info.tmp_capacity == 126
    with pytest.raises(ValueError, match="needs 1000 work items and 1000 tmp rows; a CUDA graph"):
        small.plan(**long, fixed_split_size=4)  # an imposed split is refused, not dropped


def test_workspace_too_small_is_reported(cpu_plan) -> None:
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16384, dtype=torch.uint8))
    long_request = _plan_args(
        indptr=_i32([0, 3]), last_page_len=_i32([16]), page_size=16, indices=_i32([0, 1, 2])
    )
    wrapper.plan(**long_request)  # 48 tokens: no split, no tmp rows; fits
    planned = wrapper._plan_info
    split_request = _plan_args(
        indptr=_i32([0, 300]),
        last_page_len=_i32([16]),
        indices=torch.arange(300, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match="float_workspace_buffer has 16384 bytes; this plan needs"):
        wrapper.plan(**split_request)
    assert wrapper._plan_info is planned and len(cpu_plan.uploads) == 1
    wrapper.reset_workspace_buffer(
        torch.empty(1 << 20, dtype=torch.uint8), torch.empty(64, dtype=torch.uint8)
    )
    with pytest.raises(
        ValueError,
        match="int_workspace_buffer has 64 bytes; this plan needs 328 "
        "\\(see reset_workspace_buffer\\)",
    ):
        wrapper.plan(**split_request)
    assert wrapper._plan_info is None and len(cpu_plan.uploads) == 1
    wrapper.reset_workspace_buffer(
        torch.empty(1 << 20, dtype=torch.uint8), torch.empty(328, dtype=torch.uint8)
    )
    wrapper.plan(**split_request)  # the 328 bytes: 4 + 4 x 19 work items + 2 x 1 merge words
    schedule = wrapper._plan_info.schedule
    assert (schedule.num_work, schedule.num_merge) == (19, 1)
    assert wrapper._plan_info.plan_words.numel() == 82 and len(cpu_plan.uploads) == 2


def _meta_states(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """v of ``shape`` and its LSEs, on the meta device."""
    v = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    return v, torch.empty(shape[:-1], device="meta")


MERGE_BAD = [
    (
        "s_a has shape \\(4, 3\\), expected \\(4, 2\\)",
        ValueError,
        lambda: flashinfer.merge_state(
            _bf16(4, 2, 64), torch.zeros(4, 3), _bf16(4, 2, 64), torch.zeros(4, 2)
        ),
    ),
    (
        "s_b has dtype torch.int32; supported: float16, bfloat16, float32, float64",
        TypeError,
        lambda: flashinfer.merge_state(
            _bf16(4, 2, 64),
            torch.zeros(4, 2),
            _bf16(4, 2, 64),
            torch.zeros(4, 2, dtype=torch.int32),
        ),
    ),
    (
        "v_b has shape \\(4, 2, 32\\), v_a has \\(4, 2, 64\\)",
        ValueError,
        lambda: flashinfer.merge_state(
            _bf16(4, 2, 64), torch.zeros(4, 2), _bf16(4, 2, 32), torch.zeros(4, 2)
        ),
    ),
    (
        "v_a must be a CUDA tensor",
        ValueError,
        lambda: flashinfer.merge_state(
            _bf16(4, 2, 64), torch.zeros(4, 2), _bf16(4, 2, 64), torch.zeros(4, 2)
        ),
    ),
    (
        "mask has 3 elements, v has 4 positions",
        ValueError,
        lambda: flashinfer.merge_state_in_place(
            _bf16(4, 2, 64),
            torch.zeros(4, 2),
            _bf16(4, 2, 64),
            torch.zeros(4, 2),
            torch.ones(3, dtype=torch.bool),
        ),
    ),
    (
        "v must be 4-D",
        ValueError,
        lambda: flashinfer.merge_states(_bf16(4, 2, 64), torch.zeros(4, 2)),
    ),
    (
        "v has head_dim 1024 > 512",
        ValueError,
        lambda: flashinfer.merge_states(_bf16(1, 2, 1, 1024), torch.zeros(1, 2, 1)),
    ),
    (  # the merge grid's x (meta tensors: shapes without memory)
        "v_a has 2147483648 positions > 2147483647",
        ValueError,
        lambda: flashinfer.merge_state(*_meta_states((1 << 31, 1, 8)) * 2),
    ),
    (  # and its y
        "v has 65536 heads > 65535",
        ValueError,
        lambda: flashinfer.merge_states(*_meta_states((2, 1, 1 << 16, 8))),
    ),
]


@pytest.mark.parametrize("message,error,call", MERGE_BAD, ids=[b[0][:40] for b in MERGE_BAD])
def test_merge_bad_arguments(no_launch, message, error, call) -> None:
    with pytest.raises(error, match=message):
        call()


def test_decode_and_cascade_bindings_check_too() -> None:
    """The representative specialization (bf16, head_dim 128) compiles for 9.0a; its
    binding re-checks with Python exceptions."""
    module = decode_api.get_decode_module(torch.bfloat16, 128)
    assert (module.dtype(), module.head_dim(), module.pos_encoding()) == ("bfloat16", 128, "NONE")
    q, k, out = _bf16(8, 128), _bf16(10, 2, 128), _bf16(8, 128)
    tmp = torch.empty(1)

    def single(q=q, k=k, chunk=10, chunks=1, rope=(1.0, 1e-4), slopes=None):  # noqa: ANN001, ANN202
        return module.single_decode(
            q, k, k, tmp, tmp, out, None, False, -1, chunk, chunks, 1.0, 0.0, *rope, slopes, False
        )

    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        single()
    for rope in ((0.0, 1e-4), (1.0, math.inf), (-1.0, 1e-4)):
        with pytest.raises(ValueError, match="rope_rcp_scale and rope_rcp_theta must be pos"):
            single(rope=rope)
    with pytest.raises(ValueError, match="alibi_slopes given to a module built for pos_encoding"):
        single(slopes=torch.ones(8))
    with pytest.raises(ValueError, match="q has head_dim 64, this module is for 128"):
        single(q=_bf16(8, 64))
    with pytest.raises(ValueError, match="k's strides must be multiples of 8"):
        single(k=_bf16(10, 2, 130)[..., :128])
    with pytest.raises(ValueError, match="window_left, chunk_tokens and num_chunks are out of"):
        single(chunk=0)
    with pytest.raises(TypeError, match="q has dtype float16, expected bfloat16"):
        single(q=q.half())
    with pytest.raises(ValueError, match="tmp_v has 1 elements, needs 2048"):
        single(chunks=2)
    cascade = cascade_api.get_cascade_module(torch.bfloat16)
    v, s = _bf16(4, 2, 64), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="v_a must be a CUDA tensor"):
        cascade.merge_state(v, s, v, s, v, s, None, False)
    with pytest.raises(ValueError, match="v_a and s_a must be contiguous"):
        cascade.merge_state(_bf16(4, 64, 2).transpose(1, 2), s, v, s, v, s, None, False)


def test_fp8_cache_binding_checks_its_dtype_and_strides() -> None:
    """The fp8-cache build (bf16 q, e4m3 cache) takes caches of its KV dtype only, with
    strides of whole 16-byte vectors (16 fp8 elements), and q of its own dtype."""
    fp8 = torch.float8_e4m3fn
    module = decode_api.get_decode_module(torch.bfloat16, 128, "NONE", fp8)
    assert (module.dtype(), module.kv_dtype()) == ("bfloat16", "float8_e4m3fn")
    q, out, tmp = _bf16(8, 128), _bf16(8, 128), torch.empty(1)

    def single(q=q, k=_bf16(10, 2, 128).to(fp8)):  # noqa: ANN001, ANN202
        return module.single_decode(
            q, k, k, tmp, tmp, out, None, False, -1, 10, 1, 1.0, 0.0, 1.0, 1e-4, None, False
        )

    with pytest.raises(TypeError, match="k has dtype bfloat16, expected float8_e4m3fn"):
        single(k=_bf16(10, 2, 128))
    with pytest.raises(TypeError, match="q has dtype float8_e4m3fn, expected bfloat16"):
        single(q=q.to(fp8))
    with pytest.raises(ValueError, match="k's strides must be multiples of 16 elements"):
        single(k=_bf16(10, 2, 136).to(fp8)[..., :128])
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        single(k=_bf16(10, 2, 144).to(fp8)[..., :128])  # the cache passes


def test_alibi_binding_checks_its_slopes() -> None:
    """The ALiBi build's binding needs float32 slopes for every query head, and refuses a soft
    cap, before any launch."""
    module = decode_api.get_decode_module(torch.bfloat16, 128, "ALIBI")
    assert module.pos_encoding() == "ALIBI"
    q, k, out, tmp = _bf16(8, 128), _bf16(10, 2, 128), _bf16(8, 128), torch.empty(1)

    def single(slopes=None, cap=0.0):  # noqa: ANN001, ANN202
        return module.single_decode(
            q, k, k, tmp, tmp, out, None, False, -1, 10, 1, 1.0, cap, 1.0, 1e-4, slopes, False
        )

    with pytest.raises(ValueError, match="this ALiBi module needs alibi_slopes"):
        single()
    with pytest.raises(ValueError, match="ALiBi does not combine with a logits soft cap"):
        single(torch.ones(8), cap=1.0)
    with pytest.raises(TypeError, match="alibi_slopes has dtype float16"):
        single(torch.ones(8, dtype=torch.float16))
    with pytest.raises(ValueError, match="alibi_slopes must be 1-D and contiguous with at least 8"):
        single(torch.ones(7))
    with pytest.raises(ValueError, match="alibi_slopes must be 1-D and contiguous"):
        single(torch.ones(16)[::2])
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        single(torch.ones(8))  # the slopes pass


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_decode_specialization_compiles(dtype: str, head_dim: int) -> None:
    module = gen_decode_module(dtype, head_dim).build_and_load()
    assert module.head_dim() == head_dim and module.dtype() == dtype


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_cascade_specialization_compiles(dtype: str) -> None:
    assert gen_cascade_module(dtype).build_and_load().dtype() == dtype


# the representative specializations (16-bit and fp8 caches) always; the others with
# --compile-matrix
SPILL_CASES = [
    pytest.param(
        d,
        h,
        pos,
        None,
        marks=[] if (d, h) == ("bfloat16", 128) else [pytest.mark.compile_matrix],
        id=f"{d}-{h}-{pos}",
    )
    for d in DTYPES
    for h in HEAD_DIMS
    for pos in POS_ENCODINGS
] + [
    pytest.param(
        "bfloat16" if kv == "float8_e4m3fn" else "float16",
        h,
        pos,
        kv,
        marks=[]
        if (kv, h, pos) == ("float8_e4m3fn", 128, "NONE")
        else [pytest.mark.compile_matrix],
        id=f"{kv}-{h}-{pos}",
    )
    for kv in KV_FP8_DTYPES
    for h in HEAD_DIMS
    for pos in ("NONE", "ALIBI")
]


@pytest.mark.parametrize("dtype,head_dim,pos_encoding,kv_dtype", SPILL_CASES)
def test_decode_kernels_do_not_spill(
    dtype: str, head_dim: int, pos_encoding: str, kv_dtype: str | None
) -> None:
    """Every decode kernel variant (one or two heads a thread, 128- and 64-register blocks)
    and the chunk merge keep their state in registers, in every position encoding's and fp8
    cache's build (a module of its own, named so): a spill would put local-memory traffic
    into a kernel whose speed is its HBM stream."""
    spec = gen_decode_module(dtype, head_dim, pos_encoding, kv_dtype)
    kv_part = f"_kv{kv_dtype.split('_')[1][:4]}" if kv_dtype else ""  # e4m3, e5m2
    prefix = f"decode_{spec.name.split('_')[1]}_hd{head_dim}{kv_part}"
    assert spec.name == prefix + POS_ENCODINGS[pos_encoding]
    module = build_without_spills(spec)
    assert module.head_dim() == head_dim and module.pos_encoding() == pos_encoding
    assert module.kv_dtype() == (kv_dtype or dtype)


# -- GPU: numerics ------------------------------------------------------------------------------


def tolerance(dtype: torch.dtype, tensor_cores: bool = False) -> dict[str, float]:
    """Tensor-core decode rounds the probabilities to 16 bits before P V, as prefill does."""
    if dtype == torch.bfloat16:
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-2, rtol=1e-2) if tensor_cores else dict(atol=5e-3, rtol=5e-3)


def lse_tolerance(tensor_cores: bool = False) -> dict[str, float]:
    return dict(atol=1e-2, rtol=1e-3) if tensor_cores else dict(atol=1e-3, rtol=1e-3)


SINGLE_CASES = [  # (kv_len, qo_heads, kv_heads, head_dim, layout, dtype)
    (1, 8, 8, 128, "NHD", torch.float16),
    (7, 32, 8, 128, "HND", torch.bfloat16),
    (255, 32, 4, 64, "NHD", torch.bfloat16),
    (1000, 8, 1, 256, "HND", torch.float16),
    (4097, 32, 8, 128, "NHD", torch.float16),
    (33001, 32, 8, 128, "NHD", torch.bfloat16),
    (131072, 32, 8, 128, "HND", torch.bfloat16),
    (2048, 16, 16, 256, "NHD", torch.bfloat16),
    (3000, 64, 8, 64, "HND", torch.float16),
]


def check_single_decode(
    kv_len: int,
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    layout: str,
    dtype: torch.dtype,
    device: str = "cuda",
) -> None:
    """single_decode_with_kv_cache against the reference: plain, soft-capped, windowed."""
    torch.manual_seed(kv_len)
    q = torch.randn(qo_heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(kv_len, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn(kv_len, kv_heads, head_dim, dtype=dtype, device=device)
    kk, vv = (
        (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
        if layout == "HND"
        else (k, v)
    )
    for sm_scale, cap, window in ((None, None, -1), (0.3, 30.0, -1), (None, None, 100)):
        scale = sm_scale or 1 / math.sqrt(head_dim)
        want, want_lse = reference_decode(q, k, v, scale, cap, window)
        out, lse = flashinfer.single_decode_with_kv_cache(
            q,
            kk,
            vv,
            kv_layout=layout,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
            return_lse=True,
        )
        assert out.dtype == dtype and out.shape == q.shape
        assert_output_close(out, want, **tolerance(dtype))
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_len,qo_heads,kv_heads,head_dim,layout,dtype", SINGLE_CASES)
def test_single_decode_matches_the_reference(
    kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    check_single_decode(kv_len, qo_heads, kv_heads, head_dim, layout, dtype)


def _paged_batch(
    lens: list[int],
    page_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    layout: str,
    seed: int,
):  # noqa: ANN202
    """Caches filled with flashinfer.append_paged_kv_cache over shuffled pages; returns the
    per-request K/V and the page table."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = [max(1, math.ceil(n / page_size)) if n else 0 for n in lens]
    num_pages = sum(pages_per) + 5
    order = torch.randperm(num_pages, generator=gen, device="cuda")[: sum(pages_per)]
    indices = order.to(torch.int32)
    indptr = torch.tensor(
        [0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32, device="cuda"
    )
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages_per)],
        dtype=torch.int32,
        device="cuda",
    )
    shape = (
        (num_pages, page_size, kv_heads, head_dim)
        if layout == "NHD"
        else (num_pages, kv_heads, page_size, head_dim)
    )
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")  # poison unused slots
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    ks = [
        torch.randn(n, kv_heads, head_dim, dtype=dtype, device="cuda", generator=gen) for n in lens
    ]
    vs = [
        torch.randn(n, kv_heads, head_dim, dtype=dtype, device="cuda", generator=gen) for n in lens
    ]
    nnz = sum(lens)
    if nnz:
        append_indptr = torch.tensor(
            [0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda"
        )
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        batch, positions = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz)
        flashinfer.append_paged_kv_cache(
            torch.cat(ks),
            torch.cat(vs),
            batch,
            positions,
            (k_cache, v_cache),
            indices,
            indptr,
            last,
            kv_layout=layout,
        )
    last = torch.where(last == 0, torch.ones_like(last), last)  # empty requests: any valid value
    return ks, vs, k_cache, v_cache, indptr, indices, last


def paged_decode_batch(
    device: str,
    lens: list[int],
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor, tuple]:
    """q [batch, Hq, D], each request's keys and values, the 5-D paged cache holding them
    over shuffled pages with NaN in every slot no request owns, and its page table (indptr,
    indices, last_page_len; on the host)."""
    torch.manual_seed(seed)
    ks, vs = _kv_data(lens, kv_heads, head_dim, dtype, device)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed)
    q = torch.randn(len(lens), qo_heads, head_dim, dtype=dtype, device=device)
    return q, ks, vs, cache, (indptr, indices, last)


def check_decoded(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    scale: float,
    cap: float | None = None,
    window: int = -1,
    tensor_cores: bool = False,
    rope: tuple[float, float] | None = None,
    alibi: bool = False,
    equal_nan: bool = False,
) -> None:
    """Each request's output and LSE against the float64 reference (``rope``: (rope_scale,
    rope_theta) of pos_encoding_mode "ROPE_LLAMA", the rotated query rounded to q's dtype as
    tensor cores take it, not as the CUDA-core kernel keeps it; ``alibi``: "ALIBI";
    ``equal_nan``: NaN exactly where the reference has it); a request without keys gives
    zeros and -inf."""
    for b, (k, v) in enumerate(zip(ks, vs)):
        if k.shape[0] == 0:
            assert (out[b] == 0).all() and (lse[b] == -math.inf).all(), b
            continue
        want, want_lse = reference_decode(
            q[b], k, v, scale, cap, window, rope, alibi, rope_rounds_q=tensor_cores
        )
        assert_output_close(
            out[b],
            want,
            equal_nan=equal_nan,
            **tolerance(q.dtype, tensor_cores),
            msg=f"{b}",
        )
        torch.testing.assert_close(
            lse[b].double(),
            want_lse,
            equal_nan=equal_nan,
            **lse_tolerance(tensor_cores),
            msg=f"{b}",
        )


# (sm_scale, logits_soft_cap, window_left): plain, soft-capped with a custom scale, windowed
DECODE_VARIANTS = ((None, None, -1), (0.1, 50.0, -1), (None, None, 31))


def check_batch_decode(
    device: str,
    lens: list[int],
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype,
    use_tensor_cores: bool = False,
    kv_tuple: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """BatchDecodeWithPagedKVCacheWrapper (CUDA-core or tensor-core decode) against the
    reference in each of DECODE_VARIANTS, into NaN-poisoned out and lse; the cache as one
    5-D tensor or (with ``kv_tuple``) a (k, v) pair of its halves. Returns each variant's
    (out, lse). The data depend only on the arguments other than the mode, so both modes
    see the same."""
    q, ks, vs, cache, table = paged_decode_batch(
        device, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, seed=sum(lens)
    )
    kv = (cache[:, 0], cache[:, 1]) if kv_tuple else cache
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout=layout, use_tensor_cores=use_tensor_cores
    )
    results = []
    for sm_scale, cap, window in DECODE_VARIANTS:
        wrapper.plan(
            *table,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
        )
        out = torch.full_like(q, math.nan)
        lse = torch.full(q.shape[:2], math.nan, device=device)
        got, got_lse = wrapper.run(q, kv, out=out, lse=lse, return_lse=True)
        assert got is out and got_lse is lse
        scale = head_dim**-0.5 if sm_scale is None else sm_scale
        check_decoded(out, lse, q, ks, vs, scale, cap, window, use_tensor_cores)
        results.append((out, lse))
    return results


BATCH_CASES = [  # (lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, kv_tuple)
    ([1, 17, 300, 4096, 2], 32, 8, 128, 16, "NHD", torch.bfloat16, True),
    ([5, 1, 64, 129], 8, 8, 64, 1, "HND", torch.float16, False),
    ([30000], 32, 8, 128, 64, "NHD", torch.bfloat16, False),
    ([1000] * 64, 32, 4, 128, 16, "HND", torch.bfloat16, True),
    ([7, 100, 2000], 16, 2, 256, 64, "NHD", torch.float16, False),
    ([1, 0, 33], 8, 1, 128, 16, "NHD", torch.float16, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,qo_heads,kv_heads,head_dim,page_size,layout,dtype,kv_tuple", BATCH_CASES
)
def test_batch_decode_matches_the_reference(
    lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, kv_tuple
) -> None:
    check_batch_decode(
        "cuda", lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, kv_tuple=kv_tuple
    )


# Each run's plan() arguments besides pos_encoding_mode, by mode: RoPE with the defaults, with
# another scale, theta and a soft cap, and windowed; ALiBi plain, with a custom sm_scale, and
# windowed (a soft cap does not combine with it)
POS_VARIANTS = {
    "ROPE_LLAMA": (
        {},
        dict(rope_scale=2.0, rope_theta=5e5, logits_soft_cap=30.0),
        dict(rope_theta=1e6, window_left=40),
    ),
    "ALIBI": ({}, dict(sm_scale=0.05), dict(window_left=40)),
}


def _reference_args(head_dim: int, pos_encoding: str, options: dict) -> dict:
    """check_decoded's arguments for a run with plan() ``options`` in ``pos_encoding``."""
    rope = None
    if pos_encoding == "ROPE_LLAMA":
        rope = (options.get("rope_scale") or 1.0, options.get("rope_theta") or 1e4)
    return dict(
        scale=options.get("sm_scale") or head_dim**-0.5,
        cap=options.get("logits_soft_cap"),
        window=options.get("window_left", -1),
        rope=rope,
        alibi=pos_encoding == "ALIBI",
    )


def _longest_request(
    ks: list[torch.Tensor], vs: list[torch.Tensor], layout: str
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The longest request's index and its keys and values as single decode takes them in
    ``layout`` (contiguous)."""
    b = max(range(len(ks)), key=lambda i: ks[i].shape[0])
    if layout == "HND":
        return b, ks[b].transpose(0, 1).contiguous(), vs[b].transpose(0, 1).contiguous()
    return b, ks[b], vs[b]


def check_position_encoding_decode(
    device: str,
    pos_encoding: str,
    lens: list[int],
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype,
    use_tensor_cores: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """BatchDecodeWithPagedKVCacheWrapper with ``pos_encoding`` ("ROPE_LLAMA": the query at
    its request's last position, each key at its index; "ALIBI": the slope times the key's
    index; also inside a window) against the reference, in each of its POS_VARIANTS, into
    NaN-poisoned out and lse; then single decode of the longest request. Returns each
    variant's (out, lse)."""
    q, ks, vs, cache, table = paged_decode_batch(
        device, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, seed=sum(lens) + 1
    )
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout=layout, use_tensor_cores=use_tensor_cores
    )
    results = []
    for options in POS_VARIANTS[pos_encoding]:
        wrapper.plan(
            *table,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode=pos_encoding,
            q_data_type=dtype,
            **options,
        )
        out = torch.full_like(q, math.nan)
        lse = torch.full(q.shape[:2], math.nan, device=device)
        wrapper.run(q, cache, out=out, lse=lse)
        want = _reference_args(head_dim, pos_encoding, options)
        check_decoded(out, lse, q, ks, vs, tensor_cores=use_tensor_cores, **want)
        results.append((out, lse))
    b, k, v = _longest_request(ks, vs, layout)
    options = POS_VARIANTS[pos_encoding][1]
    out, lse = flashinfer.single_decode_with_kv_cache(
        q[b],
        k,
        v,
        kv_layout=layout,
        pos_encoding_mode=pos_encoding,
        use_tensor_cores=use_tensor_cores,
        return_lse=True,
        **options,
    )
    want = _reference_args(head_dim, pos_encoding, options)
    check_decoded(
        out[None], lse[None], q[b : b + 1], [ks[b]], [vs[b]], tensor_cores=use_tensor_cores, **want
    )
    return results


POS_CASES = [  # (lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype)
    ([1, 17, 300, 4096, 0], 32, 8, 128, 16, "NHD", torch.bfloat16),
    ([5, 129, 33001], 8, 8, 64, 1, "HND", torch.float16),
    ([7, 100, 2000], 16, 2, 256, 64, "NHD", torch.bfloat16),
    ([131072, 3], 32, 4, 128, 16, "HND", torch.bfloat16),
    ([900, 40], 35, 1, 64, 16, "NHD", torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("pos_encoding", ["ROPE_LLAMA", "ALIBI"])
@pytest.mark.parametrize("lens,qo_heads,kv_heads,head_dim,page_size,layout,dtype", POS_CASES)
def test_batch_decode_position_encodings_match_the_reference_and_tensor_cores(
    pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype
) -> None:
    """RoPE and ALiBi inside the CUDA-core decode kernel against the reference, up to 128k
    positions (a group of 35: the 1024-thread kernel), and against tensor-core decode on the
    same data."""
    args = ("cuda", pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype)
    cuda_cores = check_position_encoding_decode(*args)
    tensor_cores = check_position_encoding_decode(*args, use_tensor_cores=True)
    for (out, lse), (out_tc, lse_tc) in zip(cuda_cores, tensor_cores):
        torch.testing.assert_close(out, out_tc, **tolerance(dtype, True))
        torch.testing.assert_close(lse, lse_tc, **lse_tolerance(True))


K_SCALE, V_SCALE = 0.5, 2.0  # an fp8 cache's dequantization scales in the fp8 checks


def check_fp8_decode(
    device: str,
    kv_dtype: torch.dtype,
    pos_encoding: str,
    lens: list[int],
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype,
    use_tensor_cores: bool = False,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """An fp8 KV cache (plan's ``kv_data_type``) in BatchDecodeWithPagedKVCacheWrapper, in
    each of DECODE_VARIANTS (ALiBi: those without a soft cap) with k_scale and v_scale, then
    single decode of the longest request, against the reference on the dequantized keys and
    values (the fp8 values times the scales), into NaN-poisoned out and lse; the pages no
    request owns hold fp8 NaN. Returns each run's (out, lse), single decode's last."""
    torch.manual_seed(sum(lens) + 2)
    ks16, vs16 = _kv_data(lens, kv_heads, head_dim, dtype, device)
    ks, vs = [k.to(kv_dtype) for k in ks16], [v.to(kv_dtype) for v in vs16]
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=len(lens))
    q = torch.randn(len(lens), qo_heads, head_dim, dtype=dtype, device=device)
    k_ref, v_ref = [k.float() * K_SCALE for k in ks], [v.float() * V_SCALE for v in vs]
    alibi = pos_encoding == "ALIBI"
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, kv_layout=layout, use_tensor_cores=use_tensor_cores
    )
    results = []
    for sm_scale, cap, window in DECODE_VARIANTS:
        if alibi and cap:
            continue
        wrapper.plan(
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode=pos_encoding,
            q_data_type=dtype,
            kv_data_type=kv_dtype,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
        )
        out = torch.full_like(q, math.nan)
        lse = torch.full(q.shape[:2], math.nan, device=device)
        wrapper.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, out=out, lse=lse)
        scale = head_dim**-0.5 if sm_scale is None else sm_scale
        check_decoded(out, lse, q, k_ref, v_ref, scale, cap, window, use_tensor_cores, alibi=alibi)
        results.append((out, lse))
    b, k, v = _longest_request(ks, vs, layout)
    out, lse = flashinfer.single_decode_with_kv_cache(
        q[b],
        k,
        v,
        kv_layout=layout,
        pos_encoding_mode=pos_encoding,
        use_tensor_cores=use_tensor_cores,
        k_scale=K_SCALE,
        v_scale=V_SCALE,
        return_lse=True,
    )
    check_decoded(
        out[None],
        lse[None],
        q[b : b + 1],
        [k_ref[b]],
        [v_ref[b]],
        head_dim**-0.5,
        tensor_cores=use_tensor_cores,
        alibi=alibi,
    )
    return [*results, (out, lse)]


# (kv_dtype, pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype)
FP8_CASES = [
    (torch.float8_e4m3fn, "NONE", [1, 17, 300, 4096, 0], 32, 8, 128, 16, "NHD", torch.bfloat16),
    (torch.float8_e5m2, "NONE", [5, 129, 33001], 8, 8, 64, 1, "HND", torch.float16),
    (torch.float8_e4m3fn, "ALIBI", [7, 100, 2000], 16, 2, 256, 64, "NHD", torch.float16),
    (torch.float8_e4m3fn, "NONE", [131072, 3], 32, 4, 128, 16, "HND", torch.bfloat16),
    (torch.float8_e5m2, "ALIBI", [900, 40], 35, 1, 64, 16, "NHD", torch.bfloat16),
    (torch.float8_e4m3fn, "NONE", [1000] * 64, 32, 8, 128, 16, "NHD", torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kv_dtype,pos_encoding,lens,qo_heads,kv_heads,head_dim,page_size,layout,dtype", FP8_CASES
)
def test_batch_decode_fp8_cache_matches_the_reference(
    kv_dtype, pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype
) -> None:
    """e4m3 and e5m2 caches up to 128k tokens, both head counts a thread and the 1024-thread
    kernel (a group of 35), with and without ALiBi; then with use_tensor_cores=True, which
    runs the prefill kernel's fp8 build, against the same reference."""
    args = ("cuda", kv_dtype, pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size)
    check_fp8_decode(*args, layout, dtype)
    check_fp8_decode(*args, layout, dtype, use_tensor_cores=True)


@pytest.mark.gpu
def test_batch_decode_is_independent_of_page_order_and_cache_form() -> None:
    lens, page_size, dtype = [50, 700, 3], 16, torch.bfloat16
    ks, vs, k_cache, v_cache, indptr, indices, last = _paged_batch(
        lens, page_size, 4, 128, dtype, "NHD", seed=3
    )
    q = torch.randn(3, 16, 128, dtype=dtype, device="cuda")
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace)
    wrapper.plan(indptr, indices, last, 16, 4, 128, page_size, q_data_type=dtype)
    first = wrapper.run(q, (k_cache, v_cache))
    # the same data under another page permutation
    perm = torch.randperm(k_cache.shape[0], device="cuda")
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device="cuda")
    k2, v2 = k_cache[perm], v_cache[perm]
    wrapper.plan(
        indptr,
        inverse[indices.long()].to(torch.int32),
        last,
        16,
        4,
        128,
        page_size,
        q_data_type=dtype,
    )
    assert torch.equal(wrapper.run(q, torch.stack([k2, v2], dim=1)), first)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_with_new_data_and_plans() -> None:
    dtype, page_size, qo_heads, kv_heads, head_dim, batch = torch.float16, 16, 32, 8, 128, 4
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(8192, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(batch, dtype=torch.int32, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf,
    )
    assert wrapper.is_cuda_graph_enabled
    num_pages = 8000  # the largest plan below needs 6443 pages
    k_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, qo_heads, head_dim, dtype=dtype, device="cuda")
    out = torch.empty_like(q)

    def plan(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        indptr, ids, last = _page_table(lens, page_size, num_pages, seed)
        wrapper.plan(indptr, ids, last, qo_heads, kv_heads, head_dim, page_size, q_data_type=dtype)
        return indptr, ids

    table = plan([100, 5000, 1, 20000], 0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, (k_cache, v_cache), out=out)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, (k_cache, v_cache), out=out)
    for step, new_lens in enumerate(([100, 5000, 1, 20000], [3000, 2, 64, 100000], [1, 1, 1, 1])):
        if step:
            table = plan(new_lens, step)
        q.copy_(torch.randn_like(q))
        k_cache.copy_(torch.randn_like(k_cache))
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(
            out.double(),
            _expected_batch(q, k_cache, v_cache, *table, new_lens),
            atol=5e-3,
            rtol=5e-3,
        )


def _page_table(
    lens: list[int], page_size: int, num_pages: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr, indices, last_page_len) on the CPU over shuffled pages of [0, num_pages)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / page_size) for n in lens]
    ids = torch.randperm(num_pages, generator=gen)[: sum(pages)].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, pages)], dtype=torch.int32)
    return indptr, ids, last


def _expected_batch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indptr: torch.Tensor,
    ids: torch.Tensor,
    lens: list[int],
    sm_scale: float | None = None,
) -> torch.Tensor:
    """The float32 reference over an NHD paged cache, request by request."""
    rows = []
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    for b, n in enumerate(lens):
        pages = ids[indptr[b] : indptr[b + 1]].long().to(k_cache.device)
        k = k_cache[pages].reshape(-1, heads, dim)[:n]
        v = v_cache[pages].reshape(-1, heads, dim)[:n]
        rows.append(reference_decode(q[b], k, v, sm_scale or 1 / math.sqrt(dim))[0])
    return torch.stack(rows)


@pytest.mark.gpu
def test_cuda_graph_replay_after_writing_the_buffers_directly() -> None:
    """An engine writes new page tables into the constructor's buffers and replays, with
    plan(), with fast_decode_plan (as begin_forward), with the module plan SGLang's earlier
    fast_decode_plan calls (``_cached_module.plan`` with the reference's 15 decode-plan
    arguments), or with no plan at all: the kernel reads each request's length from the
    buffers, so all four give correct attention."""
    dtype, page_size, qo_heads, kv_heads, head_dim, batch = torch.bfloat16, 16, 32, 8, 128, 3
    num_pages = 4000
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(batch, dtype=torch.int32, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf,
    )
    k_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, qo_heads, head_dim, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    indptr, ids, last = _page_table([40, 3000, 7], page_size, num_pages, 0)
    wrapper.plan(indptr, ids, last, qo_heads, kv_heads, head_dim, page_size, q_data_type=dtype)
    assert torch.equal(indptr_buf.cpu(), indptr) and torch.equal(last_buf.cpu(), last)
    assert torch.equal(indices_buf[: ids.numel()].cpu(), ids)
    wrapper.run(q, (k_cache, v_cache), out=out)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, (k_cache, v_cache), out=out)

    def write_buffers(lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        indptr, ids, last = _page_table(lens, page_size, num_pages, seed)
        indptr_buf.copy_(indptr)
        indices_buf[: ids.numel()].copy_(ids)
        last_buf.copy_(last)
        return indptr, ids

    for step, (lens, how) in enumerate(
        (
            ([5000, 1, 33], "none"),
            ([17, 20000, 300], "fast"),
            ([9000, 64, 2], "module"),
            ([100, 100, 100], "plan"),
        )
    ):
        table = write_buffers(lens, step + 1)
        if how == "fast":
            wrapper.begin_forward = flashinfer.decode.fast_decode_plan.__get__(wrapper)
            wrapper.begin_forward(
                indptr_buf,
                indices_buf,
                last_buf,
                qo_heads,
                kv_heads,
                head_dim,
                page_size,
                q_data_type=dtype,
                global_override_indptr_cpu=table[0],
            )
        elif how == "module":
            wrapper._plan_info = wrapper._cached_module.plan(
                wrapper._float_workspace_buffer,
                wrapper._int_workspace_buffer,
                wrapper._pin_memory_int_workspace_buffer,
                table[0],
                batch,
                qo_heads,
                kv_heads,
                page_size,
                True,
                -1,
                0.0,
                head_dim,
                head_dim,
                torch.empty(0, dtype=dtype, device="cuda"),
                torch.empty(0, dtype=dtype, device="cuda"),
            )
        elif how == "plan":
            wrapper.plan(
                table[0],
                table[1],
                last_buf.cpu(),
                qo_heads,
                kv_heads,
                head_dim,
                page_size,
                q_data_type=dtype,
            )
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(
            out.double(), _expected_batch(q, k_cache, v_cache, *table, lens), atol=2e-2, rtol=2e-2
        )


@pytest.mark.gpu
def test_two_wrappers_sharing_a_float_workspace_keep_their_own_schedules() -> None:
    dtype, page_size, heads, kv_heads, dim = torch.float16, 16, 32, 8, 128
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    a = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace)
    b = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace)
    num_pages = 1200
    k_cache = torch.randn(num_pages, page_size, kv_heads, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    lens_a, lens_b = [3000] * 4, [10] * 16
    table_a = _page_table(lens_a, page_size, num_pages, 1)
    table_b = _page_table(lens_b, page_size, num_pages, 2)
    a.plan(*table_a, heads, kv_heads, dim, page_size, q_data_type=dtype)
    b.plan(*table_b, heads, kv_heads, dim, page_size, q_data_type=dtype)
    q_a = torch.randn(4, heads, dim, dtype=dtype, device="cuda")
    out = a.run(q_a, (k_cache, v_cache))
    torch.testing.assert_close(
        out.double(),
        _expected_batch(q_a, k_cache, v_cache, table_a[0], table_a[1], lens_a),
        atol=5e-3,
        rtol=5e-3,
    )


@pytest.mark.gpu
def test_scales_lse_and_pdl() -> None:
    """q_scale and k_scale multiply sm_scale, v_scale the output (as the reference applies
    them); the LSE is base 2; PDL on and off give identical bits, also right behind a kernel
    that writes q on the same stream."""
    dtype, page_size, heads, kv_heads, dim = torch.bfloat16, 16, 16, 4, 128
    num_pages = 600
    k_cache = torch.randn(num_pages, page_size, kv_heads, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    lens = [5000, 3, 900]
    indptr, ids, last = _page_table(lens, page_size, num_pages, 5)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    )
    wrapper.plan(
        indptr, ids, last, heads, kv_heads, dim, page_size, q_data_type=dtype, sm_scale=0.05
    )
    q = torch.randn(3, heads, dim, dtype=dtype, device="cuda")
    out, lse = wrapper.run(
        q, (k_cache, v_cache), q_scale=0.5, k_scale=2.5, v_scale=0.25, return_lse=True
    )
    want = _expected_batch(q, k_cache, v_cache, indptr, ids, lens, sm_scale=0.05 * 0.5 * 2.5)
    torch.testing.assert_close(out.double(), want * 0.25, atol=1e-2, rtol=2e-2)
    for b, n in enumerate(lens):
        pages = ids[indptr[b] : indptr[b + 1]].long().cuda()
        k = k_cache[pages].reshape(-1, kv_heads, dim)[:n].float()
        scores = torch.einsum(
            "hd,lhd->hl", q[b].float(), k.repeat_interleave(heads // kv_heads, 1)
        ) * (0.05 * 1.25)
        torch.testing.assert_close(
            lse[b], torch.logsumexp(scores, -1) / math.log(2), atol=1e-3, rtol=1e-3
        )
    source = torch.randn_like(q)
    results = []
    for pdl in (False, True, None):
        q.zero_()
        q.add_(source)  # the kernel right before decode writes q
        results.append(wrapper.run(q, (k_cache, v_cache), enable_pdl=pdl))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    single_q = q[0]
    k0 = k_cache[ids[: indptr[1]].long().cuda()].reshape(-1, kv_heads, dim)[: lens[0]]
    v0 = v_cache[ids[: indptr[1]].long().cuda()].reshape(-1, kv_heads, dim)[: lens[0]]
    got = flashinfer.single_decode_with_kv_cache(
        single_q, k0, v0, q_scale=2.0, k_scale=0.5, v_scale=3.0, sm_scale=0.1
    )
    torch.testing.assert_close(
        got.double(), reference_decode(single_q, k0, v0, 0.1)[0] * 3.0, atol=6e-2, rtol=2e-2
    )


@pytest.mark.gpu
def test_out_of_range_page_ids_are_skipped_not_scored() -> None:
    dtype, page_size, heads, dim = torch.float16, 16, 8, 128
    k_cache = torch.randn(8, page_size, heads, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    indptr = torch.tensor([0, 3], dtype=torch.int32)
    ids = torch.tensor([2, 99, 5], dtype=torch.int32)  # 99: no such page
    last = torch.tensor([16], dtype=torch.int32)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    )
    wrapper.plan(indptr, ids, last, heads, heads, dim, page_size, q_data_type=dtype)
    q = torch.randn(1, heads, dim, dtype=dtype, device="cuda")
    out = wrapper.run(q, (k_cache, v_cache))
    kept = torch.tensor([2, 5], device="cuda")
    k = k_cache[kept].reshape(-1, heads, dim)
    v = v_cache[kept].reshape(-1, heads, dim)
    torch.testing.assert_close(
        out[0].double(), reference_decode(q[0], k, v, dim**-0.5)[0], atol=5e-3, rtol=5e-3
    )


SPLIT_CASES = [  # (qo_heads, kv_heads, head_dim, dtype): even groups fold two heads a thread
    (2, 1, 64, torch.float16),
    (6, 2, 128, torch.bfloat16),
    (24, 2, 128, torch.float16),
    (3, 1, 256, torch.bfloat16),
    (32, 8, 128, torch.bfloat16),
]


def check_split_chunks_with_unscored_pages(
    device: str, lens: list[int], qo_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    """Chunks of 4 pages of 7 tokens (28: neither a whole KV tile nor page-aligned tiles),
    merged by the merge kernel. Request 0's pages 4-7 and 9 have ids outside the cache, so
    its chunk 1 scores nothing (an empty state the merge must weigh 0) and chunk 2 loses one
    page of four: those tokens are skipped, not scored. With and without a soft cap."""
    page_size = 7
    q, ks, vs, cache, (indptr, indices, last) = paged_decode_batch(
        device, lens, qo_heads, kv_heads, head_dim, page_size, "NHD", dtype, head_dim + qo_heads
    )
    num_pages = cache.shape[0]
    ids = [num_pages, -1, num_pages + 7, 1 << 30, -(1 << 30)]
    bad = {(0, page): page_id for page, page_id in zip([4, 5, 6, 7, 9], ids)}
    _break_page_ids(indices, indptr, bad)
    kept = ~_on_broken_pages(0, lens[0], page_size, bad, device)
    ks[0], vs[0] = ks[0][kept], vs[0][kept]
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device=device)
    )
    for cap in (None, 30.0):
        wrapper.plan(
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            q_data_type=dtype,
            logits_soft_cap=cap,
            fixed_split_size=4,
        )
        out, lse = wrapper.run(q, cache, return_lse=True)
        check_decoded(out, lse, q, ks, vs, head_dim**-0.5, cap)


@pytest.mark.gpu
@pytest.mark.parametrize("qo_heads,kv_heads,head_dim,dtype", SPLIT_CASES)
def test_split_chunks_with_unscored_pages_merge_to_the_reference(
    qo_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    """The other requests are one token and a few chunks."""
    check_split_chunks_with_unscored_pages(
        "cuda", [500, 1, 90], qo_heads, kv_heads, head_dim, dtype
    )


def check_nans_propagate(
    device: str, head_dim: int, group: int, use_tensor_cores: bool = False
) -> None:
    """A NaN input gives NaN exactly where the float64 reference has it, and the reference
    elsewhere, as in the reference library (whose LSE is m + log2(d), NaN when d is): never an
    LSE of -inf (a state over no keys, which a later merge drops) nor zeros. Requests of 300,
    1, 90 and 40 tokens (pages of 7, split into chunks of 8 pages), bf16, 2 KV heads:
    - request 0: key 250 of KV head 0 has a NaN (its fifth chunk's state is NaN, which the
      merge kernel must keep), and query head ``group`` (KV head 1) is NaN: every score of
      that head in every chunk, each chunk's state NaN with a running max of -inf (fmaxf
      skips NaN); out and LSE NaN for heads 0 to ``group``;
    - request 2: query head 1 NaN (no split: the block's parts merge it);
    - request 3: value 10 of KV head 1 has a NaN at dim 7: that dim of heads ``group`` to
      ``2 * group - 1``, their LSE finite.
    Outputs are poisoned with -7, so a NaN is the kernel's."""
    lens, kv_heads, qo_heads, dtype, page_size = [300, 1, 90, 40], 2, 2 * group, torch.bfloat16, 7
    torch.manual_seed(head_dim + group)
    ks, vs = _kv_data(lens, kv_heads, head_dim, dtype, device)
    q = torch.randn(len(lens), qo_heads, head_dim, dtype=dtype, device=device)
    ks[0][250, 0, 3] = math.nan
    q[0, group] = math.nan
    q[2, 1] = math.nan
    vs[3][10, 1, 7] = math.nan
    nan_out = torch.zeros(q.shape, dtype=torch.bool)
    nan_out[0, : group + 1] = True
    nan_out[2, 1] = True
    nan_out[3, group:, 7] = True
    nan_lse = nan_out.all(dim=-1)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "NHD", seed=group)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device=device), use_tensor_cores=use_tensor_cores
    )
    wrapper.plan(
        indptr,
        indices,
        last,
        qo_heads,
        kv_heads,
        head_dim,
        page_size,
        q_data_type=dtype,
        fixed_split_size=8,
    )
    out = torch.full_like(q, -7.0)
    lse = torch.full(q.shape[:2], -7.0, device=device)
    wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
    for b, (k, v) in enumerate(zip(ks, vs)):
        want, want_lse = reference_decode(q[b], k, v, head_dim**-0.5)
        assert_nan_where(f"the reference's out[{b}]", want, nan_out[b])
        assert_nan_where(f"out[{b}]", out[b], nan_out[b])
        assert_nan_where(f"lse[{b}]", lse[b], nan_lse[b])
        assert_output_close(out[b], want, equal_nan=True, **tolerance(dtype, use_tensor_cores))
        torch.testing.assert_close(
            lse[b].double(), want_lse, equal_nan=True, **lse_tolerance(use_tensor_cores)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("use_tensor_cores", [False, True])
@pytest.mark.parametrize("head_dim,group", [(64, 4), (128, 3), (128, 8), (256, 2)])
def test_nans_propagate_through_split_and_merge(
    head_dim: int, group: int, use_tensor_cores: bool
) -> None:
    check_nans_propagate("cuda", head_dim, group, use_tensor_cores)


@pytest.mark.gpu
@pytest.mark.parametrize("group,head_dim", [(33, 128), (35, 64), (64, 128), (127, 64), (7, 256)])
def test_odd_and_large_gqa_groups_launch(group: int, head_dim: int) -> None:
    """Blocks of group * head_dim / 8 threads that are not whole warps (see row_mask)."""
    dtype, kv_heads = torch.bfloat16, 2
    q = torch.randn(group * kv_heads, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(700, kv_heads, head_dim, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    want, want_lse = reference_decode(q, k, v, head_dim**-0.5)
    out, lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-3, rtol=1e-3)


def check_merge_state(device: str, dtype: torch.dtype) -> None:
    """merge_state, merge_state_in_place (with a mask) and merge_states against the softmax
    merge formula in base 2 (also run on the emulator: tests/ops/test_cascade_emulated.py)."""
    seq, heads, dim = 37, 8, 128
    v_a = torch.randn(seq, heads, dim, device=device).to(dtype)
    v_b = torch.randn(seq, heads, dim, device=device).to(dtype)
    s_a = torch.randn(seq, heads, device=device) * 5
    s_b = torch.randn(seq, heads, device=device) * 5
    s_b[0, 0] = float("-inf")  # an empty state contributes nothing
    s_want = torch.logaddexp2(s_a.double(), s_b.double())  # base-2 LSEs
    v_want = (
        torch.exp2(s_a.double() - s_want)[..., None] * v_a.double()
        + torch.exp2(s_b.double() - s_want)[..., None] * v_b.double()
    )
    tol = dict(atol=1e-2, rtol=1e-2) if dtype != torch.float32 else dict(atol=1e-5, rtol=1e-5)
    v, s = flashinfer.merge_state(v_a, s_a, v_b, s_b)
    torch.testing.assert_close(v.double(), v_want, **tol)
    torch.testing.assert_close(s.double(), s_want, atol=1e-5, rtol=1e-5)
    v16, s16 = flashinfer.merge_state(v_a, s_a.half(), v_b, s_b.half())  # cast to float32
    assert s16.dtype == torch.float32
    torch.testing.assert_close(
        s16.double(),
        torch.logaddexp2(s_a.half().double(), s_b.half().double()),
        atol=1e-5,
        rtol=1e-5,
    )
    mask = torch.rand(seq, device=device) > 0.5
    v_in, s_in = v_a.clone(), s_a.clone()
    flashinfer.merge_state_in_place(v_in, s_in, v_b, s_b, mask=mask)
    torch.testing.assert_close(
        v_in.double(), torch.where(mask[:, None, None], v_want, v_a.double()), **tol
    )
    torch.testing.assert_close(
        s_in.double(), torch.where(mask[:, None], s_want, s_a.double()), atol=1e-5, rtol=1e-5
    )
    states = torch.randn(seq, 5, heads, dim, device=device).to(dtype)
    lses = torch.randn(seq, 5, heads, device=device) * 3
    v_all, s_all = flashinfer.merge_states(states, lses)
    weights = torch.softmax(lses.double() * math.log(2), dim=1)
    torch.testing.assert_close(v_all.double(), (weights[..., None] * states.double()).sum(1), **tol)
    torch.testing.assert_close(
        s_all.double(),
        torch.logsumexp(lses.double() * math.log(2), 1) / math.log(2),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_state_matches_the_softmax_merge_formula(dtype) -> None:
    check_merge_state("cuda", dtype)


def check_merging_nan_states(device: str, dtype: torch.dtype) -> None:
    """merge_state, merge_state_in_place and merge_states keep a NaN: a state whose s is NaN
    makes the merged v and s NaN (never s = -inf, the mark of a state over no keys, which a
    later merge would drop), a NaN in v that dim of v, as the float64 reference (and the
    reference library) do; empty states (s = -inf) still weigh nothing. head_dim 72: threads
    past it too."""
    seq, heads, dim = 6, 3, 72
    torch.manual_seed(seq)
    v = torch.randn(seq, 3, heads, dim, device=device).to(dtype)
    s = torch.randn(seq, 3, heads, device=device) * 4
    s[1, 0, 2] = math.nan  # one NaN state among three
    s[2, :, 0] = math.nan  # only NaN states
    s[3, 0, 1], s[3, 1, 1] = -math.inf, math.nan  # an empty and a NaN state
    v[4, 1, 1, 5] = math.nan  # a NaN value under a finite s
    s[5] = -math.inf  # only empty states: v = 0, s = -inf
    tol = dict(atol=1e-2, rtol=1e-2) if dtype != torch.float32 else dict(atol=1e-5, rtol=1e-5)

    def check(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]):
        assert bool(want[1].isnan().any()), "the case has no NaN state"
        torch.testing.assert_close(got[0].double(), want[0], equal_nan=True, **tol)
        torch.testing.assert_close(got[1].double(), want[1], equal_nan=True, atol=1e-5, rtol=1e-5)

    want = reference.merge_states(v, s)
    assert want[1].isnan().nonzero().tolist() == [[1, 2], [2, 0], [3, 1]]
    assert want[0].isnan().any(dim=-1).nonzero().tolist() == [[1, 2], [2, 0], [3, 1], [4, 1]]
    check(flashinfer.merge_states(v, s), want)
    pair = (v[:, 1], s[:, 1], v[:, 0], s[:, 0])
    merged = reference.merge_state(*pair)
    check(flashinfer.merge_state(*pair), merged)
    mask = torch.tensor([True, True, True, False, True, True], device=device)
    v_in, s_in = v[:, 1].clone(), s[:, 1].clone()
    flashinfer.merge_state_in_place(v_in, s_in, v[:, 0], s[:, 0], mask=mask)
    keep = ~mask[:, None]
    check(
        (v_in, s_in),
        (
            torch.where(keep[..., None], v[:, 1].double(), merged[0]),
            torch.where(keep, s[:, 1].double(), merged[1]),
        ),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_merging_nan_states(dtype) -> None:
    check_merging_nan_states("cuda", dtype)


def check_merging_empty_shapes(device: str) -> None:
    """merge_states over no states gives v = 0 and s = -inf at every position (a merge of
    nothing; outputs poisoned first), and states with no positions or no heads give empty
    outputs (merge_state and merge_state_in_place too), whatever strides torch reports for
    the empty dims (the binding took them for gaps and refused the tensors as not
    contiguous)."""
    for shape in ((4, 0, 2, 72), (0, 3, 2, 72), (4, 3, 0, 72)):
        v = torch.randn(shape, device=device, dtype=torch.float16)
        s = torch.randn(shape[:3], device=device)
        v_out, s_out = flashinfer.merge_states(v, s)
        assert v_out.shape == (shape[0], *shape[2:]) and s_out.shape == (shape[0], shape[2])
        want_v, want_s = reference.merge_states(v, s)
        assert shape[1] or bool((want_s == -math.inf).all() and (want_v == 0).all())
        torch.testing.assert_close(v_out.double(), want_v)
        torch.testing.assert_close(s_out.double(), want_s)
    v, s = torch.randn(3, 0, 72, device=device), torch.randn(3, 0, device=device)
    v_out, s_out = flashinfer.merge_state(v, s, v, s)
    assert v_out.shape == v.shape and s_out.shape == s.shape
    flashinfer.merge_state_in_place(v, s, v, s)


@pytest.mark.gpu
def test_merging_empty_shapes() -> None:
    check_merging_empty_shapes("cuda")


@pytest.mark.gpu
def test_decoding_in_two_halves_and_merging_equals_decoding_whole() -> None:
    q = torch.randn(32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(3000, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    whole, whole_lse = flashinfer.single_decode_with_kv_cache(q, k, v, return_lse=True)
    a, sa = flashinfer.single_decode_with_kv_cache(q, k[:1234], v[:1234], return_lse=True)
    b, sb = flashinfer.single_decode_with_kv_cache(q, k[1234:], v[1234:], return_lse=True)
    merged, merged_lse = flashinfer.merge_state(a[None], sa[None], b[None], sb[None])
    torch.testing.assert_close(merged[0].float(), whole.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(merged_lse[0], whole_lse, atol=1e-3, rtol=1e-3)


def test_wrapper_calls_are_api_logged_with_the_plan() -> None:
    code = (
        "import torch, flashinfer\n"
        "w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8))\n"
        "try:\n"
        "    w.run(torch.zeros(1, 8, 128, dtype=torch.float16), (torch.zeros(1), torch.zeros(1)))\n"
        "except RuntimeError as e:\n"
        "    print('caught', e)\n"
    )
    out = run_python(code, env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": "stdout"}).stdout
    assert "FlashInfer API Call: BatchDecodeWithPagedKVCacheWrapper.run" in out
    assert (
        "BatchDecodeWithPagedKVCacheWrapper(kv_layout='NHD', use_cuda_graph=False, "
        "not planned)" in out
    )
    assert "raised RuntimeError: call plan() before run()" in out and "caught" in out


def test_head_counts_past_a_grid_dimension_are_refused() -> None:
    with pytest.raises(ValueError, match="num_qo_heads must be <= 65535, got 65536"):
        decode_api._check_heads(65536, 65536, 128)
    assert decode_api._check_heads(65535, 65535, 128) == 1
