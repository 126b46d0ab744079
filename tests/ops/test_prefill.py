"""Prefill attention on the CPU, up to the launch: every argument check (raised before
anything is launched or uploaded), the schedule plan() uploads, the capacities of
CUDA-graph mode, custom-mask packing and the arguments run() launches with, recorded by a
stand-in module. Numerics are in tests/ops/test_prefill_gpu.py (on a GPU) and
tests/ops/test_prefill_emulated.py (the kernel emulator, on the CPU)."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import pytest
import torch
from torch.library import CustomOpDef

from flashinfer import cascade as cascade_api
from flashinfer import checks
from flashinfer import decode as decode_api
from flashinfer import prefill as prefill_api
from flashinfer.jit.prefill import (
    BATCH_PREFILL_ARGS,
    DEFAULT_TILINGS,
    HEAD_DIMS,
    SINGLE_PREFILL_ARGS,
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
    prefill_tiling,
)
from flashinfer.prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
)
from flashinfer.prefill_schedule import TILE_ROWS, pack_schedule, plan_length, plan_prefill_schedule
from flashinfer.quantization import packbits, segment_packbits
from tests.compile import cpu_kernels as compile_cpu_kernels
from tests.compile import module_ops
from tests.ops.test_norm import build_without_spills

LOG2E = 1.4426950408889634
MAX_CTAS = 64

BATCH_ARGS, SINGLE_ARGS = BATCH_PREFILL_ARGS, SINGLE_PREFILL_ARGS


def attention_ops() -> list[CustomOpDef]:
    """The torch custom ops the attention modules (decode, prefill, cascade) register."""
    return module_ops(decode_api, prefill_api, cascade_api)


def cpu_kernels() -> contextlib.AbstractContextManager[None]:
    """The attention ops' implementations registered for CPU tensors while the block runs
    (the ops are CUDA-only): plan()/run() on CPU tensors under a recorder reach the stand-in
    modules through the ops, as they reach the modules on a GPU."""
    return compile_cpu_kernels(decode_api, prefill_api, cascade_api)


class CpuPrefill:
    """plan()/run() on the CPU: a fixed GPU size, uploads recorded instead of copied, and a
    stand-in prefill module that records each launch (by argument name) and fills ``out``
    with ones, and which build (its position encoding and KV dtype) each launch asked for."""

    def __init__(self) -> None:
        self.uploads: list[list[int]] = []
        self.launches: list[dict] = []
        self.builds: list[str] = []
        self.kv_dtypes: list[torch.dtype | None] = []
        self.head_dims: list[tuple[int, int | None]] = []

    def get_prefill_module(
        self,
        dtype: torch.dtype,
        head_dim: int,
        pos_encoding: str = "NONE",
        kv_dtype: torch.dtype | None = None,
        head_dim_vo: int | None = None,
    ) -> CpuPrefill:
        self.builds.append(pos_encoding)
        self.kv_dtypes.append(kv_dtype)
        self.head_dims.append((head_dim, head_dim_vo))
        return self

    def batch_prefill(self, *args) -> None:  # noqa: ANN002
        assert len(args) == len(BATCH_ARGS)
        self.launches.append(dict(zip(BATCH_ARGS, args)))
        args[BATCH_ARGS.index("out")].fill_(1.0)

    def single_prefill(self, *args) -> None:  # noqa: ANN002
        assert len(args) == len(SINGLE_ARGS)
        self.launches.append(dict(zip(SINGLE_ARGS, args)))
        args[SINGLE_ARGS.index("out")].fill_(1.0)


@pytest.fixture
def cpu_prefill(monkeypatch: pytest.MonkeyPatch) -> Iterator[CpuPrefill]:
    record = CpuPrefill()
    monkeypatch.setattr(prefill_api, "_max_ctas", lambda *a: MAX_CTAS)
    monkeypatch.setattr(prefill_api, "get_device_sm_count", lambda device: 2)
    monkeypatch.setattr(prefill_api, "get_prefill_module", record.get_prefill_module)
    monkeypatch.setattr(
        prefill_api._BatchPrefillWrapper,
        "_upload",
        lambda self, words, target: record.uploads.append(list(words)),
    )
    monkeypatch.setattr(checks, "check_cuda", lambda *a, **k: None)
    with cpu_kernels():
        yield record


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# -- single prefill ---------------------------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args):  # noqa: ANN002, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(prefill_api, "get_prefill_module", refuse)
    monkeypatch.setattr(prefill_api, "_max_ctas", refuse)


SINGLE_BAD = [
    ("kv_layout must be 'NHD' or 'HND'", ValueError, dict(kv_layout="NDH")),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("use_fp16_qk_reduction=True is not supported", ValueError, dict(use_fp16_qk_reduction=True)),
    ("use_fp16_qk_reduction must be a bool", TypeError, dict(use_fp16_qk_reduction=0)),
    ("backend 'fa3' is not available", ValueError, dict(backend="fa3")),
    ("scale_q is not supported", ValueError, dict(scale_q=torch.ones(8))),
    ("scale_v is not supported", ValueError, dict(scale_v=torch.ones(2))),
    ("kv_cache_sf is not supported", ValueError, dict(kv_cache_sf=(torch.ones(1),) * 2)),
    ("causal must be a bool", TypeError, dict(causal=1)),
    ("return_lse must be a bool", TypeError, dict(return_lse=None)),
    ("q must be 3-D", ValueError, dict(q=_bf16(8, 128))),
    (
        "q has dtype torch.float32; supported: float16, bfloat16",
        TypeError,
        dict(q=torch.randn(5, 8, 128)),
    ),
    (
        "o_dtype torch.float16 differs from q's torch.bfloat16",
        TypeError,
        dict(o_dtype=torch.float16),
    ),
    (
        "k has dtype torch.float16, but q has torch.bfloat16",
        TypeError,
        dict(k=torch.randn(10, 2, 128, dtype=torch.float16)),
    ),
    ("v must be 3-D", ValueError, dict(v=_bf16(10, 2, 1, 128))),
    ("k has head_dim 64, q has 128", ValueError, dict(k=_bf16(10, 2, 64))),
    (
        "head_dim_qk 128 with head_dim_vo 64 is not supported: equal head dims of "
        "\\(64, 128, 256\\), or 192 with 128",
        ValueError,
        dict(v=_bf16(10, 2, 64)),
    ),
    (
        "head_dim must be one of 64, 128, 256, got 192",
        ValueError,
        dict(q=_bf16(5, 8, 192), k=_bf16(10, 2, 192), v=_bf16(10, 2, 192)),
    ),
    (
        "head_dim_qk 256 with head_dim_vo 128 is not supported",
        ValueError,
        dict(q=_bf16(5, 8, 256), k=_bf16(10, 2, 256), v=_bf16(10, 2, 128)),
    ),
    (
        "pos_encoding_mode='ROPE_LLAMA' needs head_dim_vo equal to head_dim_qk, got 192/128",
        ValueError,
        dict(
            q=_bf16(5, 8, 192),
            k=_bf16(10, 2, 192),
            v=_bf16(10, 2, 128),
            pos_encoding_mode="ROPE_LLAMA",
        ),
    ),
    ("v has shape \\(11, 2, 128\\), k has \\(10, 2, 128\\)", ValueError, dict(v=_bf16(11, 2, 128))),
    ("k must be contiguous in its last dim", ValueError, dict(k=_bf16(10, 128, 2).transpose(1, 2))),
    (
        "q's strides must be multiples of 8 elements",
        ValueError,
        dict(q=_bf16(5, 8, 130)[..., :128]),
    ),
    ("k must be 16-byte aligned", ValueError, dict(k=_bf16(2561)[1:].view(10, 2, 128))),
    (
        "head_dim must be one of 64, 128, 256, got 96",
        ValueError,
        dict(q=_bf16(5, 8, 96), k=_bf16(10, 2, 96), v=_bf16(10, 2, 96)),
    ),
    (
        "num_qo_heads \\(8\\) must be a multiple of num_kv_heads \\(3, k.shape\\[1\\] with "
        "kv_layout='NHD'\\)",
        ValueError,
        dict(k=_bf16(10, 3, 128), v=_bf16(10, 3, 128)),
    ),
    ("sm_scale must be > 0.0", ValueError, dict(sm_scale=0.0)),
    ("logits_soft_cap must be >= 0.0", ValueError, dict(logits_soft_cap=-1.0)),
    ("k_scale must be > 0.0", ValueError, dict(k_scale=0.0)),
    ("v_scale must be a float", TypeError, dict(v_scale=torch.ones(1))),
    ("rope_theta must be > 0.0", ValueError, dict(rope_theta=0.0)),
    ("window_left must be >= -1", ValueError, dict(window_left=-2)),
    (
        "custom_mask has 49 elements; \\[qo_len, kv_len\\] is \\[5, 10\\]",
        ValueError,
        dict(custom_mask=torch.ones(7, 7, dtype=torch.bool)),
    ),
    (
        "custom_mask has dtype torch.complex64",
        TypeError,
        dict(custom_mask=torch.ones(5, 10, dtype=torch.complex64)),
    ),
    (
        "packed_custom_mask has 6 bytes; the mask needs 7",
        ValueError,
        dict(packed_custom_mask=torch.zeros(6, dtype=torch.uint8)),
    ),
    (
        "packed_custom_mask has dtype torch.int32",
        TypeError,
        dict(packed_custom_mask=torch.zeros(7, dtype=torch.int32)),
    ),
    (
        "packed_custom_mask must be 1-D",
        ValueError,
        dict(packed_custom_mask=torch.zeros(7, 1, dtype=torch.uint8)),
    ),
    (
        "q: 16777216 query tokens x 128 query heads must be < 2\\^31",
        ValueError,
        dict(q=_bf16(1, 128, 128).expand(1 << 24, 128, 128)),
    ),
    (
        "k holds 2147483648 tokens; at most 2\\^31 - 1",
        ValueError,
        dict(
            k=_bf16(1, 2, 128).expand(1 << 31, 2, 128),
            v=_bf16(1, 2, 128).expand(1 << 31, 2, 128),
        ),
    ),
    ("q must be a CUDA tensor", ValueError, dict()),
    (
        "custom_mask must be a CUDA tensor",
        ValueError,
        dict(custom_mask=torch.ones(5, 10, dtype=torch.bool)),
    ),
]


@pytest.mark.parametrize("message,error,overrides", SINGLE_BAD, ids=[b[0][:40] for b in SINGLE_BAD])
def test_single_prefill_bad_arguments(monkeypatch, no_launch, message, error, overrides) -> None:
    if message.startswith("custom_mask must be"):  # q, k and v pass as CUDA; the mask not
        real = checks.check_cuda
        monkeypatch.setattr(
            checks,
            "check_cuda",
            lambda name, t, like=None: None if name in ("q", "k", "v") else real(name, t, like),
        )
    args = dict(q=_bf16(5, 8, 128), k=_bf16(10, 2, 128), v=_bf16(10, 2, 128))
    args.update(overrides)
    with pytest.raises(error, match=message):
        single_prefill_with_kv_cache(**args)


def test_single_prefill_launch_arguments(cpu_prefill: CpuPrefill) -> None:
    q, k, v = _bf16(5, 8, 128), _bf16(10, 2, 128), _bf16(10, 2, 128)
    out = single_prefill_with_kv_cache(
        q, k, v, causal=True, sm_scale=0.5, k_scale=2.0, v_scale=0.25, window_left=3
    )
    launch = cpu_prefill.launches[-1]
    assert out is launch["out"] and out.shape == q.shape and bool((out == 0.25).all())
    assert launch["causal"] is True and launch["window_left"] == 3 and not launch["hnd"]
    assert launch["score_scale"] == pytest.approx(0.5 * 2.0 * LOG2E)
    assert launch["score_cap"] == 0.0 and launch["lse"] is None and launch["custom_mask"] is None
    assert (launch["chunk_tokens"], launch["num_chunks"]) == (10, 1)  # short KV: one chunk
    assert launch["tmp_v"].numel() == 1 and launch["enable_pdl"] is False

    mask = torch.rand(5, 10) > 0.5
    out, lse = single_prefill_with_kv_cache(
        q,
        k.transpose(0, 1),
        v.transpose(0, 1),
        custom_mask=mask,
        kv_layout="HND",
        logits_soft_cap=30.0,
        return_lse=True,
    )
    launch = cpu_prefill.launches[-1]
    assert torch.equal(launch["custom_mask"], packbits(mask.reshape(-1), bitorder="little"))
    assert launch["hnd"] and lse is launch["lse"] and lse.shape == (5, 8)
    assert launch["score_cap"] == pytest.approx(30.0 * LOG2E)
    assert launch["score_scale"] == pytest.approx(128**-0.5 / 30.0)
    packed = torch.zeros(7, dtype=torch.uint8)  # wins over custom_mask, as in the reference
    prefill_api.single_prefill_with_kv_cache_return_lse(
        q, k, v, custom_mask=mask, packed_custom_mask=packed
    )
    assert cpu_prefill.launches[-1]["custom_mask"] is packed


def test_single_prefill_splits_long_kv_of_short_queries(cpu_prefill: CpuPrefill) -> None:
    q, k = _bf16(2, 8, 128), _bf16(1000, 2, 128)
    single_prefill_with_kv_cache(q, k, k)
    launch = cpu_prefill.launches[-1]
    # 1 q tile x 2 kv heads = 2 CTAs: 1000 keys split into 4 chunks of 250
    assert (launch["chunk_tokens"], launch["num_chunks"]) == (250, 4)
    assert launch["tmp_v"].numel() == 2 * 4 * 8 * 128 and launch["tmp_lse"].numel() == 2 * 4 * 8

    def tokens_for(tiles: int) -> int:  # query tokens (group 4) that fill exactly `tiles` tiles
        return tiles * TILE_ROWS // 4 - 10

    single_prefill_with_kv_cache(_bf16(tokens_for(10), 8, 128), k, k)  # 20 CTAs: 3 chunks
    assert (cpu_prefill.launches[-1]["chunk_tokens"], cpu_prefill.launches[-1]["num_chunks"]) == (
        334,
        3,
    )
    single_prefill_with_kv_cache(_bf16(tokens_for(19), 8, 128), k, k)  # 38 CTAs: no room
    assert (cpu_prefill.launches[-1]["chunk_tokens"], cpu_prefill.launches[-1]["num_chunks"]) == (
        1000,
        1,
    )
    launches = len(cpu_prefill.launches)
    out, lse = single_prefill_with_kv_cache(_bf16(0, 8, 128), k, k, return_lse=True)
    assert out.shape == (0, 8, 128) and lse.shape == (0, 8)
    assert len(cpu_prefill.launches) == launches  # nothing to launch for no queries


@pytest.mark.parametrize(
    "qo_len,kv_len,group,heads,max_ctas",
    [
        (1, 257, 1, 1, 132),
        (1, 100000, 8, 8, 264),
        (64, 4096, 1, 32, 1024),
        (7, 300, 4, 2, 3),
        (1000, 5000, 4, 8, 132),
        (3, 9, 1, 1, 16),
    ],
)
def test_single_chunks_cover_the_kv_and_fill_at_most_the_gpu(
    qo_len, kv_len, group, heads, max_ctas
) -> None:
    chunk, chunks = prefill_api._single_chunks(qo_len, kv_len, group, heads, max_ctas)
    ctas = math.ceil(qo_len * group / TILE_ROWS) * heads
    assert (chunks - 1) * chunk < kv_len <= chunks * chunk  # every chunk is nonempty
    if chunks > 1:  # no more chunks than 256-token ones, and the CTAs fit the GPU
        assert chunks <= math.ceil(kv_len / 256) and ctas * chunks <= max_ctas
    else:  # the tiles fill the GPU, the KV is short, or there is no room for a second chunk
        assert chunk == kv_len and (ctas >= max_ctas or kv_len <= 256 or max_ctas // ctas == 1)


# -- batch wrappers: plan ---------------------------------------------------------------------


def _workspace(nbytes: int = 1 << 20) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


# two requests: 3 queries over 21 keys (pages 4, 1; last holds 5) and 2 over 16 (page 0);
# 8 query heads over 2 KV heads, head_dim 128, pages of 16
PAGED = dict(
    qo_indptr=_i32([0, 3, 5]),
    paged_kv_indptr=_i32([0, 2, 3]),
    paged_kv_indices=_i32([4, 1, 0]),
    paged_kv_last_page_len=_i32([5, 16]),
    num_qo_heads=8,
    num_kv_heads=2,
    head_dim_qk=128,
    page_size=16,
    q_data_type=torch.bfloat16,
)
RAGGED = dict(
    qo_indptr=_i32([0, 3, 5]),
    kv_indptr=_i32([0, 21, 37]),
    num_qo_heads=8,
    num_kv_heads=2,
    head_dim_qk=128,
    q_data_type=torch.bfloat16,
)
MASK_BITS = 3 * 21 + 2 * 16


def _with(base: dict, **overrides) -> dict:
    args = dict(base)
    args.update(overrides)
    return args


COMMON_PLAN_BAD = [
    (
        "qo_indptr must be non-decreasing, but qo_indptr\\[2\\] = 2 < qo_indptr\\[1\\] = 3",
        ValueError,
        dict(qo_indptr=_i32([0, 3, 2])),
    ),
    (
        "qo_indptr must start at 0, got qo_indptr\\[0\\] = 1",
        ValueError,
        dict(qo_indptr=_i32([1, 3, 5])),
    ),
    ("qo_indptr has dtype torch.float32", TypeError, dict(qo_indptr=torch.zeros(3))),
    (
        "qo_indptr\\[-1\\]: 268435456 query tokens x 8 query heads must be < 2\\^31",
        ValueError,
        dict(qo_indptr=_i32([0, 3, 1 << 28])),
    ),
    ("qo_indptr must be 1-D", ValueError, dict(qo_indptr=torch.zeros(3, 1, dtype=torch.int32))),
    (
        "qo_indptr needs batch_size \\+ 1 elements",
        ValueError,
        dict(qo_indptr=torch.zeros(0, dtype=torch.int32)),
    ),
    ("num_qo_heads must be >= 1", ValueError, dict(num_qo_heads=0)),
    ("num_kv_heads must be an int", TypeError, dict(num_kv_heads=2.0)),
    ("must be a multiple of num_kv_heads", ValueError, dict(num_kv_heads=3)),
    ("head_dim_qk must be one of 64, 128, 256, got 80", ValueError, dict(head_dim_qk=80)),
    ("head_dim_qk 128 with head_dim_vo 64 is not supported", ValueError, dict(head_dim_vo=64)),
    ("head_dim_qk must be one of 64, 128, 256, got 192", ValueError, dict(head_dim_qk=192)),
    (
        "head_dim_qk 192 with head_dim_vo 192 is not supported",
        ValueError,
        dict(head_dim_qk=192, head_dim_vo=192),
    ),
    (
        "head_dim_qk must be one of 64, 128, 192, 256, got 96",
        ValueError,
        dict(head_dim_vo=96, head_dim_qk=96),
    ),
    ("head_dim_vo must be an int", TypeError, dict(head_dim_qk=192, head_dim_vo=128.0)),
    (
        "pos_encoding_mode='ROPE_LLAMA' needs head_dim_vo equal to head_dim_qk, got 192/128",
        ValueError,
        dict(head_dim_qk=192, head_dim_vo=128, pos_encoding_mode="ROPE_LLAMA"),
    ),
    ("causal must be a bool", TypeError, dict(causal=1)),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("use_fp16_qk_reduction=True is not supported", ValueError, dict(use_fp16_qk_reduction=True)),
    ("sm_scale must be > 0.0", ValueError, dict(sm_scale=-1.0)),
    ("logits_soft_cap must be >= 0.0", ValueError, dict(logits_soft_cap=-1.0)),
    ("window_left must be an int", TypeError, dict(window_left=1.5)),
    ("rope_scale must be > 0.0", ValueError, dict(rope_scale=0.0)),
    ("q_data_type is torch.float32; supported", TypeError, dict(q_data_type=torch.float32)),
    (
        'pos_encoding_mode="ROPE_LLAMA" needs a 16-bit KV cache, not float8_e4m3fn',
        ValueError,
        dict(kv_data_type="float8_e4m3fn", pos_encoding_mode="ROPE_LLAMA"),
    ),
    ("kv_data_type 'int8' is not a supported dtype", TypeError, dict(kv_data_type="int8")),
    (
        "o_data_type torch.float16 differs from q_data_type torch.bfloat16",
        TypeError,
        dict(o_data_type="float16"),
    ),
    ("non_blocking must be a bool", TypeError, dict(non_blocking=1)),
    (
        "prefix_len_ptr is not supported: this library has no multi-item scoring",
        ValueError,
        dict(prefix_len_ptr=_i32([0, 0])),
    ),
    ("token_pos_in_items_ptr is not supported", ValueError, dict(token_pos_in_items_ptr=_i32([0]))),
    ("max_item_len_ptr is not supported", ValueError, dict(max_item_len_ptr=_i32([1, 1]))),
    ("token_pos_in_items_len must be 0", ValueError, dict(token_pos_in_items_len=4)),
    ("fixed_split_size must be >= 1", ValueError, dict(fixed_split_size=0)),
    ("disable_split_kv must be a bool", TypeError, dict(disable_split_kv=None)),
    ("seq_lens has 3 elements, expected 2", ValueError, dict(seq_lens=_i32([1, 2, 3]))),
    ("seq_lens_q has dtype torch.float32", TypeError, dict(seq_lens_q=torch.ones(2))),
    ("max_sequence_kv must be >= 0", ValueError, dict(max_sequence_kv=-1)),
    (
        f"custom_mask has 10 elements; the requests' qo_len \\* kv_len add up to {MASK_BITS}",
        ValueError,
        dict(custom_mask=torch.ones(10, dtype=torch.bool)),
    ),
    (
        "custom_mask has dtype torch.complex64",
        TypeError,
        dict(custom_mask=torch.ones(MASK_BITS, dtype=torch.complex64)),
    ),
    ("custom_mask must be a torch.Tensor", TypeError, dict(custom_mask=[True] * MASK_BITS)),
    # request 1's mask starts at byte 63 (the reference's offsets) and has 32 bits
    (
        "packed_custom_mask has 66 bytes; the mask needs 67",
        ValueError,
        dict(packed_custom_mask=torch.zeros(66, dtype=torch.uint8)),
    ),
    (
        "packed_custom_mask has dtype torch.int8",
        TypeError,
        dict(packed_custom_mask=torch.zeros(67, dtype=torch.int8)),
    ),
]
PAGED_PLAN_BAD = COMMON_PLAN_BAD + [
    ("paged_kv_indptr has 2 elements, expected 3", ValueError, dict(paged_kv_indptr=_i32([0, 3]))),
    (
        "paged_kv_indptr\\[-1\\] must be at most len\\(paged_kv_indices\\) = 2, got 3",
        ValueError,
        dict(paged_kv_indices=_i32([0, 1])),
    ),
    ("paged_kv_indptr must be non-decreasing", ValueError, dict(paged_kv_indptr=_i32([0, 3, 2]))),
    ("paged_kv_indices has dtype torch.float32", TypeError, dict(paged_kv_indices=torch.zeros(3))),
    (
        "paged_kv_last_page_len\\[0\\] is 17, must be in \\[1, page_size=16\\]",
        ValueError,
        dict(paged_kv_last_page_len=_i32([17, 1])),
    ),
    ("paged_kv_last_page_len\\[1\\] is 0", ValueError, dict(paged_kv_last_page_len=_i32([1, 0]))),
    (
        "paged_kv_last_page_len has 3 elements, expected 2",
        ValueError,
        dict(paged_kv_last_page_len=_i32([1, 1, 1])),
    ),
    ("page_size must be >= 1", ValueError, dict(page_size=0)),
    ("seq_lens must be >= 0", ValueError, dict(seq_lens=_i32([-1, 3]))),
    ("block_tables must be a torch.Tensor", TypeError, dict(block_tables=[[0, 1]])),
]
RAGGED_PLAN_BAD = COMMON_PLAN_BAD + [
    ("kv_indptr has 2 elements, expected 3", ValueError, dict(kv_indptr=_i32([0, 3]))),
    ("kv_indptr must be non-decreasing", ValueError, dict(kv_indptr=_i32([0, 21, 20]))),
    ("kv_indptr must start at 0", ValueError, dict(kv_indptr=_i32([2, 21, 37]))),
    ("v_indptr is not supported", ValueError, dict(v_indptr=_i32([0, 21, 37]))),
    ("o_indptr is not supported", ValueError, dict(o_indptr=_i32([0, 3, 5]))),
    ("max_token_per_sequence must be an int", TypeError, dict(max_token_per_sequence=2.5)),
]


def _assert_nothing_happened(record: CpuPrefill, wrapper) -> None:  # noqa: ANN001
    assert record.uploads == [] and record.launches == [] and wrapper._plan_info is None


@pytest.mark.parametrize(
    "message,error,overrides", PAGED_PLAN_BAD, ids=[b[0][:40] for b in PAGED_PLAN_BAD]
)
def test_paged_plan_bad_arguments(cpu_prefill, message, error, overrides) -> None:
    wrapper = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    with pytest.raises(error, match=message):
        wrapper.plan(**_with(PAGED, **overrides))
    _assert_nothing_happened(cpu_prefill, wrapper)


@pytest.mark.parametrize(
    "message,error,overrides", RAGGED_PLAN_BAD, ids=[b[0][:40] for b in RAGGED_PLAN_BAD]
)
def test_ragged_plan_bad_arguments(cpu_prefill, message, error, overrides) -> None:
    wrapper = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    with pytest.raises(error, match=message):
        wrapper.plan(**_with(RAGGED, **overrides))
    _assert_nothing_happened(cpu_prefill, wrapper)


def test_constructor_bad_arguments(cpu_prefill: CpuPrefill) -> None:
    bad = [
        (
            "float_workspace_buffer must be a contiguous 1-D tensor",
            ValueError,
            lambda: BatchPrefillWithPagedKVCacheWrapper(torch.empty(4, 4)),
        ),
        (
            "float_workspace_buffer must be a torch.Tensor",
            TypeError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(None),
        ),
        (
            "kv_layout must be 'NHD' or 'HND'",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(_workspace(), "NCHW"),
        ),
        (
            "use_cuda_graph must be a bool",
            TypeError,
            lambda: BatchPrefillWithPagedKVCacheWrapper(_workspace(), use_cuda_graph=None),
        ),
        (
            "backend 'cudnn' is not available",
            ValueError,
            lambda: BatchPrefillWithPagedKVCacheWrapper(_workspace(), backend="cudnn"),
        ),
        (
            "backend 'cute-dsl' is not available",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(_workspace(), backend="cute-dsl"),
        ),
        (
            "jit_args is not supported",
            ValueError,
            lambda: BatchPrefillWithPagedKVCacheWrapper(_workspace(), jit_args=["variant"]),
        ),
        (
            "jit_kwargs is not supported",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(_workspace(), jit_kwargs={}),
        ),
        (
            "use_cuda_graph=True needs qo_indptr_buf",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(
                _workspace(), use_cuda_graph=True, kv_indptr_buf=_i32([0, 0])
            ),
        ),
        (
            "use_cuda_graph=True needs kv_indptr_buf",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(
                _workspace(), use_cuda_graph=True, qo_indptr_buf=_i32([0, 0])
            ),
        ),
        (
            "use_cuda_graph=True needs paged_kv_indices_buf",
            ValueError,
            lambda: BatchPrefillWithPagedKVCacheWrapper(
                _workspace(),
                use_cuda_graph=True,
                qo_indptr_buf=_i32([0, 0]),
                paged_kv_indptr_buf=_i32([0, 0]),
                paged_kv_last_page_len_buf=_i32([0]),
            ),
        ),
        (
            "kv_indptr_buf has 2 elements; qo_indptr_buf has 3",
            ValueError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(
                _workspace(),
                use_cuda_graph=True,
                qo_indptr_buf=_i32([0, 0, 0]),
                kv_indptr_buf=_i32([0, 0]),
            ),
        ),
        (
            "paged_kv_last_page_len_buf has 3 elements; qo_indptr_buf's batch size 2 needs 2",
            ValueError,
            lambda: _graph_paged(last_page_len_buf=_i32([1, 1, 1])),
        ),
        (
            "qo_indptr_buf has dtype torch.int64; supported: int32",
            TypeError,
            lambda: BatchPrefillWithRaggedKVCacheWrapper(
                _workspace(),
                use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(3, dtype=torch.long),
                kv_indptr_buf=_i32([0, 0, 0]),
            ),
        ),
        (
            "custom_mask_buf has dtype torch.bool; supported: uint8",
            TypeError,
            lambda: _graph_ragged(custom_mask_buf=torch.zeros(8, dtype=torch.bool)),
        ),
        (
            "mask_indptr_buf has 2 elements, expected 3",
            ValueError,
            lambda: _graph_ragged(mask_indptr_buf=_i32([0, 0])),
        ),
    ]
    for message, error, make in bad:
        with pytest.raises(error, match=message):
            make()


def _graph_ragged(
    batch: int = 2, workspace: int = 64 << 20, **kwargs
) -> BatchPrefillWithRaggedKVCacheWrapper:
    return BatchPrefillWithRaggedKVCacheWrapper(
        _workspace(workspace),
        use_cuda_graph=True,
        qo_indptr_buf=torch.full((batch + 1,), -7, dtype=torch.int32),
        kv_indptr_buf=torch.full((batch + 1,), -7, dtype=torch.int32),
        **kwargs,
    )


def _graph_paged(
    batch: int = 2, pages: int = 8, last_page_len_buf: torch.Tensor | None = None, **kwargs
) -> BatchPrefillWithPagedKVCacheWrapper:
    return BatchPrefillWithPagedKVCacheWrapper(
        _workspace(64 << 20),
        use_cuda_graph=True,
        qo_indptr_buf=torch.full((batch + 1,), -7, dtype=torch.int32),
        paged_kv_indptr_buf=torch.full((batch + 1,), -7, dtype=torch.int32),
        paged_kv_indices_buf=torch.full((pages,), -7, dtype=torch.int32),
        paged_kv_last_page_len_buf=(
            torch.full((batch,), -7, dtype=torch.int32)
            if last_page_len_buf is None
            else last_page_len_buf
        ),
        **kwargs,
    )


def _expected_words(qo_indptr: list[int], kv_lens: list[int], **kwargs) -> list[int]:
    schedule = plan_prefill_schedule(qo_indptr, kv_lens, 4, 2, MAX_CTAS, **kwargs)
    return pack_schedule(schedule, schedule.num_work, schedule.num_merge)


def test_plan_uploads_the_packed_schedule(cpu_prefill: CpuPrefill) -> None:
    paged = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    paged.plan(**PAGED, causal=True)
    assert cpu_prefill.uploads[-1] == _expected_words([0, 3, 5], [21, 16], causal=True)
    paged.plan(**_with(PAGED, fixed_split_size=1))  # one page = 16 tokens: 21 keys -> 2 chunks
    assert cpu_prefill.uploads[-1] == _expected_words([0, 3, 5], [21, 16], fixed_chunk=16)
    assert cpu_prefill.uploads[-1][:2] == [3, 16]
    paged.plan(**_with(PAGED, fixed_split_size=1, disable_split_kv=True))
    assert cpu_prefill.uploads[-1][:2] == [2, 1]
    paged.plan(**_with(PAGED, seq_lens=_i32([2000, 16])))  # seq_lens steer the schedule
    assert cpu_prefill.uploads[-1] == _expected_words([0, 3, 5], [2000, 16])

    ragged = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    ragged.plan(**_with(RAGGED, kv_indptr=_i32([0, 1000, 1016])))  # 1000 keys: 4 chunks of 256
    words = cpu_prefill.uploads[-1]
    assert words == _expected_words([0, 3, 5], [1000, 16])
    plan = ragged._plan_info
    assert words[:2] == [5, 256] and len(words) == plan_length(5, 3)
    assert (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity) == (5, 3, 12)
    assert (plan.grid_work, plan.grid_merge, plan.total_q, plan.total_kv) == (5, 3, 5, 1016)
    assert plan.tmp_v.numel() == 12 * 8 * 128  # 12 tmp rows x 8 heads x head_dim
    assert plan.tmp_lse.numel() == 128  # 12 x 8 LSEs, the region rounded up to 256 bytes
    assert plan.plan_words.data_ptr() == ragged._int_workspace_buffer.data_ptr()
    assert plan.tmp_v.data_ptr() == ragged._float_workspace_buffer.data_ptr()
    ragged.plan(
        **_with(
            RAGGED,
            kv_indptr=_i32([0, 1000, 1016]),
            custom_mask=torch.ones(3 * 1000 + 2 * 16, dtype=torch.bool),
            causal=True,
        )
    )  # a mask overrides causal
    assert cpu_prefill.uploads[-1] == _expected_words([0, 3, 5], [1000, 16])


def test_plan_sets_the_attributes_engines_read(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    assert not w.is_cuda_graph_enabled and w._fixed_batch_size == 0 and w._backend == "auto"
    assert w._int_workspace_buffer.nbytes == 8 << 20
    assert w._pin_memory_int_workspace_buffer.nbytes == 8 << 20
    assert w._jit_module is None and w._plan_info is None and w.device == torch.device("cpu")
    indptr64 = PAGED["qo_indptr"].long()
    w.plan(
        **_with(
            PAGED,
            qo_indptr=indptr64,
            causal=True,
            sm_scale=0.2,
            window_left=9,
            rope_theta=5e5,
            q_data_type="bfloat16",
            kv_data_type=torch.bfloat16,
        )
    )
    assert (w._causal, w._sm_scale, w._logits_soft_cap, w._window_left) == (True, 0.2, 0.0, 9)
    assert (w._pos_encoding_mode, w._use_fp16_qk_reduction, w._rope_theta) == ("NONE", False, 5e5)
    assert w._cached_module is cpu_prefill and w._backend == "fa2"
    assert w._qo_indptr_buf.dtype == torch.int32 and torch.equal(w._qo_indptr_buf.long(), indptr64)
    assert w._paged_kv_indptr_buf is PAGED["paged_kv_indptr"]  # int32 on the device: as is
    assert w._paged_kv_indices_buf is PAGED["paged_kv_indices"]
    assert w._paged_kv_last_page_len_buf is PAGED["paged_kv_last_page_len"]
    assert w._custom_mask_buf is None and w._mask_indptr_buf is None
    assert (w._batch_size, w._qo_indptr_last, w._num_qo_heads, w._num_kv_heads) == (2, 5, 8, 2)
    assert (
        w._cached_q_data_type == w._cached_kv_data_type == w._cached_o_data_type == torch.bfloat16
    )
    assert (w._max_q_len, w._max_kv_len) == (3, 21)
    assert "work_items=2" in repr(w) and "BatchPrefillWithPagedKVCacheWrapper" in repr(w)
    r = BatchPrefillWithRaggedKVCacheWrapper(_workspace(), "HND", backend="fa2")
    r.plan(**RAGGED)
    assert r._kv_indptr_buf is RAGGED["kv_indptr"] and r._kv_layout == "HND"
    assert r._qo_indptr_buf is RAGGED["qo_indptr"] and r._backend == "fa2"


def test_custom_masks_are_packed_per_request(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    mask = torch.rand(MASK_BITS) > 0.5
    w.plan(**PAGED, custom_mask=mask)
    packed, byte_indptr = segment_packbits(
        mask, torch.tensor([0, 63, MASK_BITS]), bitorder="little"
    )
    assert torch.equal(w._custom_mask_buf, packed) and w._custom_mask_buf.numel() == 8 + 4
    assert w._mask_indptr_buf.tolist() == byte_indptr.tolist() == [0, 8, 12]
    assert w._mask_indptr_buf.dtype == torch.int32
    given = torch.randint(0, 256, (67,), dtype=torch.uint8)
    w.plan(**PAGED, packed_custom_mask=given, custom_mask=mask)  # the packed form wins
    assert torch.equal(w._custom_mask_buf, given)
    assert w._mask_indptr_buf.tolist() == [0, 63, MASK_BITS]  # the reference's offsets
    w.plan(**PAGED)
    assert w._custom_mask_buf is None and w._mask_indptr_buf is None


def test_workspaces_too_small_are_reported(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithRaggedKVCacheWrapper(_workspace(16384))
    w.plan(**RAGGED)  # no split: no tmp rows, fits
    with pytest.raises(
        ValueError, match="float_workspace_buffer has 16384 bytes; this plan needs 49664"
    ):
        w.plan(**_with(RAGGED, kv_indptr=_i32([0, 1000, 1016])))  # 12 tmp rows x 8 heads
    assert len(cpu_prefill.uploads) == 1 and w._plan_info.schedule.num_merge == 0
    w.reset_workspace_buffer(_workspace(1 << 20), torch.empty(64, dtype=torch.uint8))
    with pytest.raises(
        ValueError,
        match="int_workspace_buffer has 64 bytes; this plan needs "
        "140 \\(see reset_workspace_buffer\\)",
    ):
        w.plan(**_with(RAGGED, kv_indptr=_i32([0, 1000, 1016])))
    with pytest.raises(ValueError, match="int_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(_workspace(), torch.empty(65, dtype=torch.uint8)[1:])


# -- batch wrappers: run -----------------------------------------------------------------------


def _paged_cache(layout: str = "NHD", pages: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (pages, 16, 2, 128) if layout == "NHD" else (pages, 2, 16, 128)
    return _bf16(*shape), _bf16(*shape)


def test_run_before_plan_and_after_a_reset(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        w.run(_bf16(5, 8, 128), _paged_cache())
    w.plan(**PAGED)
    w.run(_bf16(5, 8, 128), _paged_cache())
    w.reset_workspace_buffer(_workspace(), torch.empty(4096, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        w.run(_bf16(5, 8, 128), _paged_cache())
    r = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        r.run(_bf16(5, 8, 128), _bf16(37, 2, 128), _bf16(37, 2, 128))
    assert len(cpu_prefill.launches) == 1


PAGED_RUN_BAD = [
    (
        "q has shape \\(6, 8, 128\\); plan\\(\\) was for \\(5, 8, 128\\)",
        ValueError,
        dict(q=_bf16(6, 8, 128)),
    ),
    ("q has shape \\(5, 4, 128\\)", ValueError, dict(q=_bf16(5, 4, 128))),
    (
        "q has dtype torch.float16; plan\\(\\) was for torch.bfloat16",
        TypeError,
        dict(q=torch.randn(5, 8, 128, dtype=torch.float16)),
    ),
    ("q must be a torch.Tensor", TypeError, dict(q=None)),
    ("q's strides must be multiples of 8", ValueError, dict(q=_bf16(5, 8, 132)[..., :128])),
    (
        "paged_kv_cache\\[0\\] has shape \\(5, 2, 16, 128\\); plan\\(\\) was for pages of "
        "\\(16, 2, 128\\) \\(NHD\\)",
        ValueError,
        dict(paged_kv_cache=_paged_cache("HND")),
    ),
    (
        "paged_kv_cache\\[1\\] has dtype torch.float16",
        TypeError,
        dict(
            paged_kv_cache=(_bf16(5, 16, 2, 128), torch.zeros(5, 16, 2, 128, dtype=torch.float16))
        ),
    ),
    (
        "paged_kv_cache must hold keys and values in dim 1",
        ValueError,
        dict(paged_kv_cache=_bf16(5, 3, 16, 2, 128)),
    ),
    (
        "the key and value caches of paged_kv_cache differ in num_pages",
        ValueError,
        dict(paged_kv_cache=(_bf16(5, 16, 2, 128), _bf16(4, 16, 2, 128))),
    ),
    (
        "paged_kv_cache\\[0\\] must be contiguous in its last dim",
        ValueError,
        dict(paged_kv_cache=(_bf16(5, 16, 128, 2).transpose(2, 3), _bf16(5, 16, 2, 128))),
    ),
    ("extra positional arguments", ValueError, dict(args=(torch.ones(1),))),
    ("sinks is not supported", ValueError, dict(sinks=torch.zeros(8))),
    ("kv_cache_sf is not supported", ValueError, dict(kv_cache_sf=_paged_cache())),
    (
        "skip_softmax_threshold_scale_factor is not supported",
        ValueError,
        dict(skip_softmax_threshold_scale_factor=1.0),
    ),
    ("q_scale must be a float", TypeError, dict(q_scale=torch.ones(1))),
    ("k_scale must be > 0.0", ValueError, dict(k_scale=0.0)),
    ("v_scale must be finite", ValueError, dict(v_scale=float("inf"))),
    ("window_left must be >= -1", ValueError, dict(window_left=-3)),
    ("return_lse must be a bool", TypeError, dict(return_lse=1)),
    ("enable_pdl must be a bool or None", TypeError, dict(enable_pdl="yes")),
    (
        "out has shape \\(5, 8, 64\\), expected \\(5, 8, 128\\)",
        ValueError,
        dict(out=_bf16(5, 8, 64)),
    ),
    (
        "out has dtype torch.float32, expected torch.bfloat16",
        TypeError,
        dict(out=torch.zeros(5, 8, 128)),
    ),
    ("out's strides must be multiples of 8", ValueError, dict(out=_bf16(5, 8, 129)[..., :128])),
    ("lse has shape \\(5, 4\\), expected \\(5, 8\\)", ValueError, dict(lse=torch.zeros(5, 4))),
    (
        "lse has dtype torch.float16, expected torch.float32",
        TypeError,
        dict(lse=torch.zeros(5, 8, dtype=torch.float16)),
    ),
    ("lse must be contiguous", ValueError, dict(lse=torch.zeros(8, 5).t())),
]


@pytest.mark.parametrize(
    "message,error,overrides", PAGED_RUN_BAD, ids=[b[0][:40] for b in PAGED_RUN_BAD]
)
def test_paged_run_bad_arguments(cpu_prefill, message, error, overrides) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    w.plan(**PAGED)
    call = dict(q=_bf16(5, 8, 128), paged_kv_cache=_paged_cache())
    call.update(overrides)
    args = call.pop("args", ())
    with pytest.raises(error, match=message):
        w.run(call.pop("q"), call.pop("paged_kv_cache"), *args, **call)
    assert cpu_prefill.launches == []


RAGGED_RUN_BAD = [
    (
        "k has 36 tokens; kv_indptr\\[-1\\] is 37",
        ValueError,
        dict(k=_bf16(36, 2, 128), v=_bf16(36, 2, 128)),
    ),
    (
        "k has shape \\(37, 4, 128\\); plan\\(\\) was for 2 kv heads of head_dim 128",
        ValueError,
        dict(k=_bf16(37, 4, 128)),
    ),
    (
        "v must be 3-D \\[kv_indptr\\[-1\\], num_kv_heads, head_dim\\]",
        ValueError,
        dict(v=_bf16(37, 256)),
    ),
    (
        "k has dtype torch.float16; plan\\(\\) was for torch.bfloat16",
        TypeError,
        dict(k=torch.zeros(37, 2, 128, dtype=torch.float16)),
    ),
    ("v has shape \\(40, 2, 128\\), k has \\(37, 2, 128\\)", ValueError, dict(v=_bf16(40, 2, 128))),
    ("v must be 16-byte aligned", ValueError, dict(v=_bf16(37 * 256 + 1)[1:].view(37, 2, 128))),
    ("o_scale must be None or 1.0", ValueError, dict(o_scale=2.0)),
    ("kv_cache_sf is not supported", ValueError, dict(kv_cache_sf=torch.ones(1))),
    (
        "q has shape \\(37, 8, 128\\); plan\\(\\) was for \\(5, 8, 128\\)",
        ValueError,
        dict(q=_bf16(37, 8, 128)),
    ),
    ("extra positional arguments", ValueError, dict(args=(torch.ones(1),))),
]


@pytest.mark.parametrize(
    "message,error,overrides", RAGGED_RUN_BAD, ids=[b[0][:40] for b in RAGGED_RUN_BAD]
)
def test_ragged_run_bad_arguments(cpu_prefill, message, error, overrides) -> None:
    w = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    w.plan(**RAGGED)
    call = dict(q=_bf16(5, 8, 128), k=_bf16(37, 2, 128), v=_bf16(37, 2, 128))
    call.update(overrides)
    args = call.pop("args", ())
    with pytest.raises(error, match=message):
        w.run(call.pop("q"), call.pop("k"), call.pop("v"), *args, **call)
    assert cpu_prefill.launches == []


def test_paged_run_launch_arguments(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace(), "HND")
    mask = torch.rand(MASK_BITS) > 0.3
    w.plan(**PAGED, causal=True, sm_scale=0.5, window_left=7, custom_mask=mask)
    q = _bf16(5, 8, 128)
    k, v = _paged_cache("HND")
    out = w.run(q, torch.stack([k, v], dim=1))
    launch = cpu_prefill.launches[-1]
    plan = w._plan_info
    assert out is launch["out"] and out.shape == q.shape and bool((out == 1).all())
    assert launch["q"] is q and launch["k"].shape == (5, 2, 16, 128) and launch["hnd"]
    assert torch.equal(launch["k"], k) and torch.equal(launch["v"], v)
    assert launch["qo_indptr"] is w._qo_indptr_buf and launch["kv_indptr"] is w._paged_kv_indptr_buf
    assert launch["kv_indices"] is w._paged_kv_indices_buf
    assert launch["kv_last_page_len"] is w._paged_kv_last_page_len_buf
    assert (
        launch["custom_mask"] is w._custom_mask_buf and launch["mask_indptr"] is w._mask_indptr_buf
    )
    assert launch["plan"] is plan.plan_words and launch["tmp_v"] is plan.tmp_v
    assert launch["tmp_lse"] is plan.tmp_lse and launch["lse"] is None
    assert (launch["work_capacity"], launch["merge_capacity"], launch["tmp_capacity"]) == (2, 0, 0)
    assert (launch["grid_work"], launch["grid_merge"]) == (2, 0)
    assert launch["causal"] is True and launch["window_left"] == 7
    assert launch["score_scale"] == pytest.approx(0.5 * LOG2E) and launch["score_cap"] == 0.0
    assert launch["enable_pdl"] is False

    out, lse = w.run(
        q,
        (k, v),
        q_scale=2.0,
        k_scale=3.0,
        v_scale=0.5,
        return_lse=True,
        window_left=-1,
        enable_pdl=True,
    )
    launch = cpu_prefill.launches[-1]
    assert launch["score_scale"] == pytest.approx(0.5 * 6.0 * LOG2E)
    assert launch["window_left"] == -1 and w._window_left == 7  # a per-call override
    assert bool((out == 0.5).all()) and lse is launch["lse"] and lse.shape == (5, 8)
    assert lse.dtype == torch.float32 and launch["enable_pdl"] is False  # not on a CPU device
    given_out, given_lse = torch.empty_like(q), torch.empty(5, 8)
    got, got_lse = w.run_return_lse(q, (k, v), out=given_out, lse=given_lse)
    assert got is given_out and got_lse is given_lse
    assert w.run(q, (k, v), lse=given_lse) is cpu_prefill.launches[-1]["out"]
    assert cpu_prefill.launches[-1]["lse"] is given_lse  # written even without return_lse

    w._sm_scale, w._logits_soft_cap, w._causal = 0.125, 10.0, False  # engines set these
    w.run(q, (k, v))
    launch = cpu_prefill.launches[-1]
    assert launch["score_scale"] == pytest.approx(0.125 / 10.0) and launch["causal"] is False
    assert launch["score_cap"] == pytest.approx(10.0 * LOG2E)
    w._causal = 1
    with pytest.raises(TypeError, match="causal must be a bool"):
        w.run(q, (k, v))


def test_ragged_run_launch_arguments(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    w.plan(**_with(RAGGED, kv_indptr=_i32([0, 1000, 1016]), logits_soft_cap=5.0))
    q, k, v = _bf16(5, 8, 128), _bf16(1020, 2, 128), _bf16(1020, 2, 128)  # padding is fine
    out = w.run(q, k, v, v_scale=2.0, o_scale=1.0)
    launch = cpu_prefill.launches[-1]
    assert launch["k"] is k and launch["v"] is v and not launch["hnd"]
    assert launch["kv_indptr"] is w._kv_indptr_buf
    assert launch["kv_indices"] is None and launch["kv_last_page_len"] is None
    assert launch["custom_mask"] is None and launch["mask_indptr"] is None
    assert (launch["grid_work"], launch["grid_merge"], launch["tmp_capacity"]) == (5, 3, 12)
    assert launch["score_cap"] == pytest.approx(5.0 * LOG2E)
    assert launch["score_scale"] == pytest.approx(128**-0.5 / 5.0)
    assert bool((out == 2.0).all())
    out, lse = w.run_return_lse(q, k, v)
    assert lse.shape == (5, 8)


def test_fp8_caches_ask_for_their_build_and_are_checked(cpu_prefill: CpuPrefill) -> None:
    """kv_data_type="float8_e4m3fn" (a dtype or its name) plans the fp8-cache build; run()
    takes caches of that dtype only, with strides in 16-byte vectors (16 fp8 elements), and
    refuses RoPE set since by forward(); single prefill takes fp8 k and v of one dtype; the
    cascade wrapper plans every level with it."""
    fp8 = torch.float8_e4m3fn
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    for kv_data_type in ("float8_e4m3fn", fp8):
        w.plan(**_with(PAGED, kv_data_type=kv_data_type))
        assert cpu_prefill.kv_dtypes[-1] == fp8 and w._cached_kv_data_type == fp8
        assert w._cached_q_data_type == w._cached_o_data_type == torch.bfloat16
    k, v = (t.to(fp8) for t in _paged_cache())
    out = w.run(_bf16(5, 8, 128), (k, v), k_scale=0.5, v_scale=2.0)
    launch = cpu_prefill.launches[-1]
    assert launch["k"].dtype == launch["v"].dtype == fp8 and bool((out == 2.0).all())
    assert launch["score_scale"] == pytest.approx(0.5 / math.sqrt(128) * LOG2E)
    assert cpu_prefill.kv_dtypes[-1] == fp8  # the launch's build too
    with pytest.raises(
        TypeError, match="paged_kv_cache\\[0\\] has dtype torch.bfloat16; plan\\(\\) was for"
    ):
        w.run(_bf16(5, 8, 128), _paged_cache())
    with pytest.raises(TypeError, match="has dtype torch.float8_e5m2; plan\\(\\) was for"):
        w.run(_bf16(5, 8, 128), (k.view(torch.float8_e5m2), v.view(torch.float8_e5m2)))
    wide = torch.empty(5, 16, 2, 136, dtype=fp8)[..., :128]  # rows 136 elements apart
    with pytest.raises(ValueError, match="strides must be multiples of 16 elements"):
        w.run(_bf16(5, 8, 128), (wide, wide))
    with pytest.raises(ValueError, match="needs a 16-bit KV cache, not float8_e4m3fn"):
        w.forward(_bf16(5, 8, 128), (k, v), pos_encoding_mode="ROPE_LLAMA")

    ragged = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    ragged.plan(**_with(RAGGED, kv_data_type=torch.float8_e5m2))
    kv = _bf16(37, 2, 128).to(torch.float8_e5m2)
    ragged.run(_bf16(5, 8, 128), kv, kv)
    assert cpu_prefill.launches[-1]["k"] is kv

    q, k1 = _bf16(4, 8, 128), _bf16(30, 2, 128).to(fp8)
    single_prefill_with_kv_cache(q, k1, k1, causal=True)
    assert cpu_prefill.launches[-1]["k"] is k1 and cpu_prefill.kv_dtypes[-1] == fp8
    with pytest.raises(TypeError, match="v has dtype torch.float8_e5m2, but k has"):
        single_prefill_with_kv_cache(q, k1, k1.view(torch.float8_e5m2))
    with pytest.raises(TypeError, match="k has dtype torch.float16, but q has"):
        single_prefill_with_kv_cache(q, k1.half(), k1.half())
    with pytest.raises(ValueError, match="needs a 16-bit KV cache, not float8_e4m3fn"):
        single_prefill_with_kv_cache(q, k1, k1, pos_encoding_mode="ROPE_LLAMA")

    cascade = cascade_api.MultiLevelCascadeAttentionWrapper(2, _workspace())
    tables = [PAGED[name] for name in ("qo_indptr", "paged_kv_indptr", "paged_kv_indices")]
    cascade.plan(
        *([t, t] for t in tables),
        [PAGED["paged_kv_last_page_len"]] * 2,
        8,
        2,
        128,
        16,
        q_data_type=torch.bfloat16,
        kv_data_type=fp8,
    )
    assert cpu_prefill.kv_dtypes[-2:] == [fp8, fp8]


def test_mla_head_dims_plan_run_and_check(cpu_prefill: CpuPrefill) -> None:
    """head_dim_qk 192 with head_dim_vo 128 (DeepSeek's MLA prefill): plan asks for that
    build, run takes k of 192 and v of 128 dims and returns (or checks) an output of 128, the
    scale defaults to 1/sqrt(192), the partial states are 128 wide; a v of 192, an out of
    192, a 5-D paged cache (one head_dim for k and v) and RoPE set by forward() are refused;
    single prefill takes v of 128 too."""
    w = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    w.plan(**_with(RAGGED, head_dim_qk=192, head_dim_vo=128, kv_indptr=_i32([0, 1000, 1016])))
    assert cpu_prefill.head_dims[-1] == (192, 128)
    assert "head_dim=192/128" in repr(w)
    plan = w._plan_info
    assert plan.tmp_v.numel() == plan.tmp_capacity * 8 * 128 > 0
    q, k, v = _bf16(5, 8, 192), _bf16(1016, 2, 192), _bf16(1016, 2, 128)
    out, lse = w.run(q, k, v, return_lse=True)
    assert out.shape == (5, 8, 128) and lse.shape == (5, 8) and bool((out == 1.0).all())
    launch = cpu_prefill.launches[-1]
    assert launch["k"] is k and launch["v"] is v and launch["out"] is out
    assert launch["score_scale"] == pytest.approx(192**-0.5 * LOG2E)
    assert cpu_prefill.head_dims[-1] == (192, 128)  # the launch's build too
    given = torch.empty(5, 8, 128, dtype=torch.bfloat16)
    assert w.run(q, k, v, out=given) is given
    with pytest.raises(ValueError, match="v has shape \\(1016, 2, 192\\); plan\\(\\) was for 2 kv"):
        w.run(q, k, _bf16(1016, 2, 192))
    with pytest.raises(ValueError, match="k has shape \\(1016, 2, 128\\); plan\\(\\) was for"):
        w.run(q, _bf16(1016, 2, 128), v)
    with pytest.raises(ValueError, match="out has shape \\(5, 8, 192\\), expected \\(5, 8, 128\\)"):
        w.run(q, k, v, out=_bf16(5, 8, 192))
    with pytest.raises(ValueError, match="needs head_dim_vo equal to head_dim_qk, got 192/128"):
        w.forward(q, k, v, pos_encoding_mode="ROPE_LLAMA")

    paged = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    paged.plan(**_with(PAGED, head_dim_qk=192, head_dim_vo=128))
    kc, vc = _bf16(5, 16, 2, 192), _bf16(5, 16, 2, 128)
    assert paged.run(q, (kc, vc)).shape == (5, 8, 128)
    assert cpu_prefill.launches[-1]["v"] is vc
    with pytest.raises(ValueError, match="plan\\(\\) was for pages of \\(16, 2, 128\\)"):
        paged.run(q, _bf16(5, 2, 16, 2, 192))

    q1, k1, v1 = _bf16(4, 8, 192), _bf16(30, 2, 192), _bf16(30, 2, 128)
    out = single_prefill_with_kv_cache(q1, k1, v1, causal=True)
    assert out.shape == (4, 8, 128) and cpu_prefill.head_dims[-1] == (192, 128)
    assert cpu_prefill.launches[-1]["v"] is v1


def test_a_batch_without_queries_launches_nothing(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    w.plan(**_with(RAGGED, qo_indptr=_i32([0, 0, 0])))
    out, lse = w.run(_bf16(0, 8, 128), _bf16(37, 2, 128), _bf16(37, 2, 128), return_lse=True)
    assert out.shape == (0, 8, 128) and lse.shape == (0, 8) and cpu_prefill.launches == []


def test_forward_overrides_the_planned_parameters(cpu_prefill: CpuPrefill) -> None:
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace())
    w.plan(**PAGED)
    q, cache = _bf16(5, 8, 128), _paged_cache()
    out = w.forward(
        q, cache, causal=True, sm_scale=0.3, logits_soft_cap=20.0, window_left=4, v_scale=2.0
    )
    launch = cpu_prefill.launches[-1]
    assert launch["causal"] is True and launch["window_left"] == 4
    assert launch["score_scale"] == pytest.approx(0.3 / 20.0) and bool((out == 2.0).all())
    assert (w._causal, w._sm_scale, w._window_left) == (True, 0.3, 4)
    out, lse = w.forward_return_lse(q, cache, k_scale=2.0)
    assert cpu_prefill.launches[-1]["score_scale"] == pytest.approx(2 * 128**-0.5 * LOG2E)
    assert lse.shape == (5, 8) and w._causal is False and w._window_left == -1
    with pytest.raises(ValueError, match="use_fp16_qk_reduction=True is not supported"):
        w.forward(q, cache, use_fp16_qk_reduction=True)
    with pytest.raises(ValueError, match="pos_encoding_mode 'ALIBI' does not combine with"):
        w.forward_return_lse(q, cache, pos_encoding_mode="ALIBI", logits_soft_cap=5.0)
    w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA", rope_scale=4.0, rope_theta=5e5)
    launch = cpu_prefill.launches[-1]
    assert cpu_prefill.builds[-1] == "ROPE_LLAMA" and w._pos_encoding_mode == "ROPE_LLAMA"
    assert (launch["rope_rcp_scale"], launch["rope_rcp_theta"]) == (0.25, pytest.approx(2e-6))
    assert launch["alibi_slopes"] is None
    w.forward(q, cache, pos_encoding_mode="ALIBI")
    launch = cpu_prefill.launches[-1]
    assert cpu_prefill.builds[-1] == "ALIBI" and w._pos_encoding_mode == "ALIBI"
    # the slopes of 8 heads (the reference's), in log2 units
    slopes = [2.0 ** (-(i + 1)) * LOG2E for i in range(8)]
    assert launch["alibi_slopes"].tolist() == pytest.approx(slopes, rel=1e-6)
    w.end_forward()

    r = BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    r.begin_forward(**RAGGED)
    k, v = _bf16(37, 2, 128), _bf16(37, 2, 128)
    r.forward(q, k, v, causal=True, window_left=2)
    assert (cpu_prefill.launches[-1]["causal"], cpu_prefill.launches[-1]["window_left"]) == (
        True,
        2,
    )
    out, lse = r.forward_return_lse(q, k, v, logits_soft_cap=3.0)
    assert cpu_prefill.launches[-1]["score_cap"] == pytest.approx(3.0 * LOG2E)
    with pytest.raises(TypeError, match="causal must be a bool"):
        r.forward(q, k, v, causal="yes")
    r.end_forward()


def test_page_size_one_caches_may_leave_the_page_dim_out(cpu_prefill: CpuPrefill) -> None:
    for layout in ("NHD", "HND"):
        w = BatchPrefillWithPagedKVCacheWrapper(_workspace(), layout)
        w.plan(
            **_with(
                PAGED,
                paged_kv_indptr=_i32([0, 3, 4]),
                paged_kv_indices=_i32([0, 1, 2, 3]),
                paged_kv_last_page_len=_i32([1, 1]),
                page_size=1,
            )
        )
        k3 = _bf16(4, 2, 128)
        for form in ((k3, k3), torch.stack([k3, k3], dim=1)):
            w.run(_bf16(5, 8, 128), form)
            k_cache = cpu_prefill.launches[-1]["k"]
            assert k_cache.shape == ((4, 1, 2, 128) if layout == "NHD" else (4, 2, 1, 128))


# -- CUDA-graph mode ---------------------------------------------------------------------------


def test_cuda_graph_plan_copies_into_the_fixed_buffers(cpu_prefill: CpuPrefill) -> None:
    w = _graph_paged()
    assert w.is_cuda_graph_enabled and w._fixed_batch_size == 2
    buffers = (
        w._qo_indptr_buf,
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
    )
    w.plan(
        **_with(
            PAGED,
            qo_indptr=PAGED["qo_indptr"].long(),
            paged_kv_indices=PAGED["paged_kv_indices"].long(),
        )
    )
    assert (
        w._qo_indptr_buf,
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
    ) == buffers  # the same tensors: captured addresses
    assert buffers[0].tolist() == [0, 3, 5] and buffers[1].tolist() == [0, 2, 3]
    assert buffers[2].tolist() == [4, 1, 0, -7, -7, -7, -7, -7]
    assert buffers[3].tolist() == [5, 16]
    plan = w._plan_info
    # work items: max(2 x 2 items, SM count x blocks per SM = 64, unsplit bound); a merge row
    # per token; the tmp rows (8 heads x (128 + 1) floats) the 64 MiB float workspace holds
    fit = ((64 << 20) - 512) // (4 * 8 * 129)
    assert (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity) == (MAX_CTAS, 5, fit)
    assert (plan.grid_work, plan.grid_merge) == (MAX_CTAS, 5)
    assert plan.tmp_lse.data_ptr() + plan.tmp_lse.nbytes <= w._workspace.data_ptr() + (64 << 20)
    first = cpu_prefill.uploads[-1]
    assert len(first) == plan_length(MAX_CTAS, 5)
    w.plan(**_with(PAGED, qo_indptr=_i32([0, 1, 2])))  # fewer tokens: fine
    assert len(cpu_prefill.uploads[-1]) == len(first)
    w.run(_bf16(2, 8, 128), _paged_cache())
    launch = cpu_prefill.launches[-1]
    assert launch["qo_indptr"] is buffers[0] and launch["kv_indices"] is buffers[2]
    assert launch["grid_work"] == launch["work_capacity"] == MAX_CTAS
    assert launch["plan"].data_ptr() == plan.plan_words.data_ptr()
    assert launch["tmp_v"].data_ptr() == plan.tmp_v.data_ptr()


def test_cuda_graph_later_plans_fit_the_first_plans_capacity(cpu_prefill: CpuPrefill) -> None:
    w = _graph_ragged(workspace=64 << 10)  # 15 tmp rows of 8 x 129 floats
    w.plan(**_with(RAGGED, kv_indptr=_i32([0, 1000, 1016])))  # split: 5 items, 12 tmp rows
    plan = w._plan_info
    assert (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity) == (MAX_CTAS, 5, 15)
    w.plan(**_with(RAGGED, kv_indptr=_i32([0, 1200, 1216])))  # 5 chunks: 15 tmp rows fit
    assert cpu_prefill.uploads[-1] == pack_schedule(
        plan_prefill_schedule([0, 3, 5], [1200, 16], 4, 2, MAX_CTAS), MAX_CTAS, 5
    )
    assert cpu_prefill.uploads[-1][:2] == [6, 256]  # 4 chunks of 256 and one of 176
    w.plan(**_with(RAGGED, kv_indptr=_i32([0, 4000, 4016])))  # 16 chunks: 48 tmp rows > 15
    assert cpu_prefill.uploads[-1] == pack_schedule(
        plan_prefill_schedule([0, 3, 5], [4000, 16], 4, 2, MAX_CTAS, allow_split=False), MAX_CTAS, 5
    )  # the unsplit schedule, which always fits
    assert w._plan_info.tmp_v.data_ptr() == plan.tmp_v.data_ptr()
    assert w._plan_info.tmp_lse.data_ptr() == plan.tmp_lse.data_ptr()
    with pytest.raises(
        ValueError,
        match="this plan needs 33 work items, 3 merge rows and 96 "
        "tmp rows; the CUDA graph holds \\(64, 5, 15\\)",
    ):
        w.plan(**_with(RAGGED, kv_indptr=_i32([0, 4000, 4016]), fixed_split_size=125))
    with pytest.raises(ValueError, match="batch size is fixed to the buffers' 2; plan\\(\\) got 1"):
        w.plan(**_with(RAGGED, qo_indptr=_i32([0, 5]), kv_indptr=_i32([0, 37])))
    with pytest.raises(
        ValueError, match="qo_indptr\\[-1\\] \\(6\\) cannot exceed the first plan\\(\\)'s 5"
    ):
        w.plan(**_with(RAGGED, qo_indptr=_i32([0, 3, 6])))
    uploads = len(cpu_prefill.uploads)
    p = _graph_paged(pages=2)
    with pytest.raises(ValueError, match="3 page indices exceed the CUDA-graph buffer's 2"):
        p.plan(**PAGED)
    assert len(cpu_prefill.uploads) == uploads and p._plan_info is None


def test_cuda_graph_custom_masks_need_the_mask_buffers(cpu_prefill: CpuPrefill) -> None:
    mask = torch.rand(MASK_BITS) > 0.5
    with pytest.raises(
        ValueError, match="a custom mask in CUDA-graph mode needs the constructor's custom_mask_buf"
    ):
        _graph_ragged().plan(**RAGGED, custom_mask=mask)
    with pytest.raises(ValueError, match="needs the constructor's mask_indptr_buf"):
        _graph_ragged(custom_mask_buf=torch.zeros(64, dtype=torch.uint8)).plan(
            **RAGGED, custom_mask=mask
        )
    small = _graph_ragged(
        custom_mask_buf=torch.zeros(11, dtype=torch.uint8), mask_indptr_buf=_i32([0, 0, 0])
    )
    with pytest.raises(
        ValueError, match="the packed custom mask has 12 bytes; custom_mask_buf holds 11"
    ):
        small.plan(**RAGGED, custom_mask=mask)
    assert cpu_prefill.uploads == []
    mask_buf = torch.zeros(16, dtype=torch.uint8)
    indptr_buf = _i32([-1, -1, -1])
    w = _graph_ragged(custom_mask_buf=mask_buf, mask_indptr_buf=indptr_buf)
    w.plan(**RAGGED, custom_mask=mask)
    packed, byte_indptr = segment_packbits(
        mask, torch.tensor([0, 63, MASK_BITS]), bitorder="little"
    )
    assert w._custom_mask_buf is mask_buf and w._mask_indptr_buf is indptr_buf
    assert torch.equal(mask_buf[:12], packed) and indptr_buf.tolist() == byte_indptr.tolist()
    w.run(_bf16(5, 8, 128), _bf16(37, 2, 128), _bf16(37, 2, 128))
    assert cpu_prefill.launches[-1]["custom_mask"] is mask_buf
    w.plan(**RAGGED)  # no mask this time: the kernel gets none
    w.run(_bf16(5, 8, 128), _bf16(37, 2, 128), _bf16(37, 2, 128))
    assert cpu_prefill.launches[-1]["custom_mask"] is None
    assert cpu_prefill.launches[-1]["mask_indptr"] is None


def test_head_counts_past_a_grid_dimension_are_refused() -> None:
    with pytest.raises(ValueError, match="num_qo_heads must be <= 65535, got 65536"):
        prefill_api._check_heads(65536, 4096, 128)
    assert prefill_api._check_heads(65535, 13107, 64) == 5


# -- the real module: compiles here, its binding re-checks --------------------------------------


def _bf16_cpu(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


def test_a_tiling_past_the_gpus_shared_memory_is_refused_naming_the_remedy() -> None:
    """plan() checks a CTA's shared memory against the GPU's per-block limit: head_dim
    192/128's default (128 KiB) fits an H100 (227 KiB) and not sm_86/89/120 (99 KiB), where
    CUDA's own refusal would only say "invalid argument"."""
    prefill_api.check_shared_memory(98_624, 101_376, 128, None)
    with pytest.raises(
        ValueError,
        match=r"head_dim 192/128 needs 131400 bytes of shared memory a block, this GPU allows "
        r"101376: choose a smaller tiling with FLASHINFER_PREFILL_TILING \(e.g. 192:m1kv32p",
    ):
        prefill_api.check_shared_memory(131_400, 101_376, 192, 128)
    with pytest.raises(ValueError, match=r"head_dim 256 needs .* \(e.g. 256:m1kv16p"):
        prefill_api.check_shared_memory(196_900, 166_912, 256, None)


def test_prefill_binding_checks_too() -> None:
    """The representative specialization (bf16, head_dim 128) compiles for this machine's
    target; its binding refuses bad arguments with Python exceptions before any launch."""
    module = prefill_api.get_prefill_module(torch.bfloat16, 128)
    assert (module.dtype(), module.head_dim(), module.tile_rows()) == ("bfloat16", 128, TILE_ROWS)
    assert module.pos_encoding() == "NONE"
    q, k, out = _bf16_cpu(8, 4, 128), _bf16_cpu(10, 2, 128), _bf16_cpu(8, 4, 128)
    tmp = torch.empty(1)

    def single(q=q, k=k, out=out, mask=None, chunks=1, window=-1, rope=1.0, slopes=None):  # noqa: ANN001, ANN202
        return module.single_prefill(
            q,
            k,
            k,
            mask,
            tmp,
            tmp,
            out,
            None,
            False,
            True,
            window,
            10,
            chunks,
            1.0,
            0.0,
            rope,
            1e-4,
            slopes,
            False,
        )

    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        single()
    with pytest.raises(ValueError, match="alibi_slopes given to a module built for pos_encoding"):
        single(slopes=torch.ones(4))
    with pytest.raises(ValueError, match="q has head_dim 64, this module is for 128"):
        single(q=_bf16_cpu(8, 4, 64))
    with pytest.raises(ValueError, match="num_qo_heads \\(3\\) must be a positive multiple"):
        single(q=_bf16_cpu(8, 3, 128), out=_bf16_cpu(8, 3, 128))
    with pytest.raises(ValueError, match="num_qo_heads \\(0\\) must be a positive multiple"):
        single(q=_bf16_cpu(8, 0, 128), out=_bf16_cpu(8, 0, 128))  # a GQA group of 0
    with pytest.raises(ValueError, match="k's strides must be multiples of 8"):
        single(k=_bf16_cpu(10, 2, 130)[..., :128])
    with pytest.raises(TypeError, match="q has dtype float16, expected bfloat16"):
        single(q=q.half())
    with pytest.raises(ValueError, match="tmp_v has 1 elements, needs 8192"):
        single(chunks=2)
    with pytest.raises(ValueError, match="window_left, chunk_tokens and num_chunks"):
        single(window=-2)
    with pytest.raises(ValueError, match="custom_mask has 1 bytes, needs 10"):
        single(mask=torch.zeros(1, dtype=torch.uint8))
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="rope_rcp_scale and rope_rcp_theta must be positive"):
            single(rope=bad)

    indptr = torch.tensor([0, 8], dtype=torch.int32)
    plan = torch.zeros(plan_length(1, 0), dtype=torch.int32)

    def batch(k=k, work_capacity=1, grid_work=1, plan=plan, mask=None):  # noqa: ANN001, ANN202
        return module.batch_prefill(
            q,
            k,
            k,
            indptr,
            indptr,
            None,
            None,
            mask,
            None,
            plan,
            tmp,
            tmp,
            out,
            None,
            False,
            work_capacity,
            0,
            0,
            grid_work,
            0,
            True,
            -1,
            1.0,
            0.0,
            1.0,
            1e-4,
            None,
            False,
        )

    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        batch()
    with pytest.raises(ValueError, match="k must be 4-D \\(paged\\) or 3-D \\(ragged\\)"):
        batch(k=_bf16_cpu(2, 10, 2, 128)[None])
    with pytest.raises(ValueError, match="the launch does not match the schedule"):
        batch(grid_work=2)
    with pytest.raises(ValueError, match="custom_mask and mask_indptr go together"):
        batch(mask=torch.zeros(4, dtype=torch.uint8))


# -- tilings and the compiled kernels ------------------------------------------------------------


def test_the_tiling_comes_from_flashinfer_prefill_tiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLASHINFER_PREFILL_TILING picks another CTA shape per head_dim (a module of its own,
    rendered into the config); shapes the kernel cannot take are refused, naming it."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    assert prefill_tiling(128) == DEFAULT_TILINGS[128] == PrefillTiling(1, 64, overlap=True)
    default = gen_prefill_module("bfloat16", 128)
    assert default.name == "prefill_bf16_hd128"
    assert "kPrefillOverlap = true;" in default.renders[0].render().read_text()
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "128:m2kv32, 64:m2kv64")
    assert prefill_tiling(128) == PrefillTiling(2, 32)
    assert prefill_tiling(64) == PrefillTiling(2, 64)
    assert prefill_tiling(256) == DEFAULT_TILINGS[256]
    spec = gen_prefill_module("float16", 128)
    assert spec.name == "prefill_f16_hd128_m2kv32"
    (config,) = spec.renders
    text = config.render().read_text()
    assert "kPrefillMTiles = 2;" in text and "kPrefillTileKV = 32;" in text
    assert "kPrefillMinCTAs = 1;" in text and "kPrefillOverlap = false;" in text
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "128:m1kv64,256:m1kv32p")
    assert prefill_tiling(128) == PrefillTiling(1, 64)
    assert prefill_tiling(256) == PrefillTiling(1, 32, 1, True)
    assert gen_prefill_module("float16", 128).name == "prefill_f16_hd128_m1kv64"
    assert gen_prefill_module("float16", 256).name == "prefill_f16_hd256_m1kv32p"
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "64:m1kv64c2")
    assert prefill_tiling(64) == PrefillTiling(1, 64, 2)
    two = gen_prefill_module("bfloat16", 64)
    assert two.name == "prefill_bf16_hd64_m1kv64c2"
    assert "kPrefillMinCTAs = 2;" in two.renders[0].render().read_text()
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "128:m2kv32p")  # m2: 192 with overlap
    assert prefill_tiling(128) == PrefillTiling(2, 32, overlap=True)
    assert gen_prefill_module("float16", 128).name == "prefill_f16_hd128_m2kv32p"
    explicit = gen_prefill_module("float16", 128, DEFAULT_TILINGS[128])
    assert explicit.name == "prefill_f16_hd128"
    assert "kPrefillMTiles = 1;" in explicit.renders[0].render().read_text()
    for raw, message in (
        ("96:m1kv64", "FLASHINFER_PREFILL_TILING: head_dim 96 is not one of \\(64, 128, 192"),
        ("128:m3kv32", "m_tiles must be 1 or 2"),
        ("128:m1kv48", "tile_kv 16, 32 or 64"),
        ("128-m2kv32", "invalid value '128-m2kv32' for FLASHINFER_PREFILL_TILING"),
        ("128:m1kv64c2", "m1kv64c2 at head_dim 128 needs 96 accumulators a lane; at most 80"),
        ("128:m2kv64p", "m2kv64p at head_dim 128 needs 256 accumulators a lane; at most 160"),
        ("128:m1kv32c2p", "m1kv32c2p at head_dim 128 needs 96 accumulators a lane; at most 64"),
        ("128:m1kv16c2p", "m1kv16c2p at head_dim 128 needs 80 accumulators a lane; at most 64"),
        ("128:m1kv64q", "invalid value '128:m1kv64q' for FLASHINFER_PREFILL_TILING"),
        ("128:m2kv16c2", "ctas must be 1, or 2 with m_tiles 1"),
        ("128:m1kv16c3", "ctas must be 1, or 2 with m_tiles 1"),
    ):
        monkeypatch.setenv("FLASHINFER_PREFILL_TILING", raw)
        with pytest.raises(ValueError, match=message):
            prefill_tiling(128)
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "256:m1kv64p")  # m1: 160 with overlap
    with pytest.raises(
        ValueError, match="m1kv64p at head_dim 256 needs 192 accumulators a lane; at most 160"
    ):
        prefill_tiling(256)
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "64:m2kv64p")  # m2: 192 up to kv32 only
    with pytest.raises(
        ValueError, match="m2kv64p at head_dim 64 needs 192 accumulators a lane; at most 160"
    ):
        prefill_tiling(64)
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "128:m2kv64,256:m2kv16")
    assert prefill_tiling(128) == PrefillTiling(2, 64)  # 192 accumulators: the most that fit
    with pytest.raises(ValueError, match="TILING: m2kv16 at head_dim 256 needs 272 accumulators"):
        prefill_tiling(256)
    with pytest.raises(ValueError, match="m2kv64 at head_dim 256 needs 320 accumulators"):
        gen_prefill_module("float16", 256, PrefillTiling(2, 64))
    with pytest.raises(
        ValueError, match="m1kv16 at head_dim 64: 128 16-byte chunks per tile of 64-dim rows do not"
    ):
        gen_prefill_module("float16", 64, PrefillTiling(1, 16))


def test_mla_prefill_module_checks_its_two_head_dims(monkeypatch) -> None:
    """The head_dim_qk 192 / head_dim_vo 128 build is a module of its own, which reports both
    dims; its binding takes q and k of 192, v and out of 128, refusing the others. Other
    pairs, and RoPE with this one, are refused when the spec is made."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    spec = gen_prefill_module("bfloat16", 192, None, "NONE", None, 128)
    assert spec.name == "prefill_bf16_hd192_vo128"
    assert gen_prefill_module("bfloat16", 128, None, "NONE", None, 128).name == "prefill_bf16_hd128"
    module = prefill_api.get_prefill_module(torch.bfloat16, 192, "NONE", None, 128)
    assert (module.head_dim(), module.head_dim_vo()) == (192, 128)
    q, k, v = _bf16_cpu(8, 4, 192), _bf16_cpu(10, 2, 192), _bf16_cpu(10, 2, 128)
    tmp = torch.empty(1)

    def single(q=q, k=k, v=v, out=_bf16_cpu(8, 4, 128)):  # noqa: ANN001, ANN202
        return module.single_prefill(
            q,
            k,
            v,
            None,
            tmp,
            tmp,
            out,
            None,
            False,
            True,
            -1,
            10,
            1,
            1.0,
            0.0,
            1.0,
            1e-4,
            None,
            False,
        )

    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        single()
    with pytest.raises(ValueError, match="out has head_dim 192, this module is for 128"):
        single(out=_bf16_cpu(8, 4, 192))
    with pytest.raises(ValueError, match="v must end in a contiguous head_dim of 128"):
        single(v=_bf16_cpu(10, 2, 192))
    with pytest.raises(ValueError, match="k must end in a contiguous head_dim of 192"):
        single(k=_bf16_cpu(10, 2, 128))
    with pytest.raises(ValueError, match="q has head_dim 128, this module is for 192"):
        single(q=_bf16_cpu(8, 4, 128))
    for qk, vo in ((128, 64), (256, 128), (64, 128)):
        with pytest.raises(ValueError, match=f"head_dim_qk {qk} with head_dim_vo {vo} is not"):
            gen_prefill_module("bfloat16", qk, None, "NONE", None, vo)
    with pytest.raises(ValueError, match="head_dim must be one of \\(64, 128, 256\\), got 192"):
        gen_prefill_module("bfloat16", 192, None, "NONE", None, 192)
    with pytest.raises(ValueError, match="ROPE_LLAMA' needs head_dim_vo equal to head_dim_qk"):
        gen_prefill_module("bfloat16", 192, None, "ROPE_LLAMA", None, 128)
    # the longer q/K rows leave m2kv32p no room for its 192 accumulators (it spills 56 bytes)
    assert PrefillTiling(2, 32, 1, True) in accepted_tilings(128)
    assert PrefillTiling(2, 32, 1, True) not in accepted_tilings(192, head_dim_vo=128)
    with pytest.raises(ValueError, match="m2kv32p at head_dim 192/128 needs 192 accumulators"):
        gen_prefill_module("bfloat16", 192, PrefillTiling(2, 32, 1, True), "NONE", None, 128)
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "192:m1kv32")
    assert (
        gen_prefill_module("float16", 192, head_dim_vo=128).name == "prefill_f16_hd192_vo128_m1kv32"
    )


# Every tiling PrefillTiling.check accepts (FLASHINFER_PREFILL_TILING may select any): head_dim
# 128's default and those at their register limits, head_dim 128 m2kv64, m2kv32p and m2kv16p
# and 256 m1kv32p (255 of 255), 128 m1kv32c2 (128 of 128) and 64 m1kv32c2p (125), always; the
# rest with --compile-matrix.
_ALWAYS = {
    (128, DEFAULT_TILINGS[128]),
    (128, PrefillTiling(2, 64)),
    (128, PrefillTiling(2, 32, 1, True)),
    (128, PrefillTiling(2, 16, 1, True)),
    (128, PrefillTiling(1, 32, 2)),
    (64, PrefillTiling(1, 32, 2, True)),
    (256, PrefillTiling(1, 32, 1, True)),
}
TILING_CASES = [
    pytest.param(
        dtype,
        head_dim,
        tiling,
        marks=[]
        if dtype == "bfloat16" and (head_dim, tiling) in _ALWAYS
        else [pytest.mark.compile_matrix],
        id=f"{dtype}-{head_dim}-{tiling.name}",
    )
    for dtype in ("float16", "bfloat16")
    for head_dim in HEAD_DIMS
    for tiling in accepted_tilings(head_dim)
]


@pytest.mark.parametrize("dtype,head_dim,tiling", TILING_CASES)
def test_prefill_kernels_do_not_spill(dtype, head_dim, tiling, monkeypatch) -> None:
    """Every tiling keeps its accumulators and state in registers (no stack, no local memory
    in cuobjdump's resource usage): a spill would put local-memory traffic into the loop of
    a kernel bound by its issue rate."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    spec = gen_prefill_module(dtype, head_dim, tiling)
    module = build_without_spills(spec)
    assert (module.head_dim(), module.dtype(), module.tile_rows()) == (head_dim, dtype, TILE_ROWS)


# head_dim_qk 192 / head_dim_vo 128 (q/K and V rows of their own lengths): the default always,
# every other accepted tiling and the fp8 builds with --compile-matrix
MLA_SPILL_CASES = [
    pytest.param(
        dtype,
        tiling,
        kv,
        marks=[]
        if (dtype, tiling, kv) == ("bfloat16", DEFAULT_TILINGS[192], None)
        else [pytest.mark.compile_matrix],
        id=f"{dtype}-{tiling.name}-{kv}",
    )
    for dtype in ("float16", "bfloat16")
    for kv in (None, "float8_e4m3fn", "float8_e5m2")
    for tiling in accepted_tilings(192, kv is not None, 128)
]


@pytest.mark.parametrize("dtype,tiling,kv_dtype", MLA_SPILL_CASES)
def test_mla_prefill_kernels_do_not_spill(dtype, tiling, kv_dtype, monkeypatch) -> None:
    """The 192/128 builds (a K tile's rows half again as long as V's: more copies a token,
    a longer S = Q K^T loop) keep their state in registers on every tiling accepted for them."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    module = build_without_spills(gen_prefill_module(dtype, 192, tiling, "NONE", kv_dtype, 128))
    assert (module.head_dim(), module.head_dim_vo(), module.dtype()) == (192, 128, dtype)
    if (tiling, kv_dtype) == (DEFAULT_TILINGS[192], None):  # Q 48 KiB, K 48, V 32, and more
        assert 128 << 10 < module.shared_bytes() < 129 << 10


FP8_SPILL_CASES = [
    pytest.param(
        dtype,
        head_dim,
        tiling,
        kv,
        marks=[]
        if (dtype, head_dim, tiling, kv) == ("bfloat16", 128, DEFAULT_TILINGS[128], "float8_e4m3fn")
        else [pytest.mark.compile_matrix],
        id=f"{dtype}-{head_dim}-{tiling.name}-{kv}",
    )
    for kv in ("float8_e4m3fn", "float8_e5m2")
    for dtype in ("float16", "bfloat16")
    for head_dim in HEAD_DIMS
    for tiling in (
        accepted_tilings(head_dim, fp8=True)
        if (kv, dtype) == ("float8_e4m3fn", "bfloat16")
        else [DEFAULT_TILINGS[head_dim]]
    )
]


@pytest.mark.parametrize("dtype,head_dim,tiling,kv_dtype", FP8_SPILL_CASES)
def test_fp8_cache_prefill_kernels_do_not_spill(
    dtype, head_dim, tiling, kv_dtype, monkeypatch
) -> None:
    """The fp8-cache builds (a module of their own, named so) widen each landed tile in the
    loop and still keep their state in registers, on every tiling accepted for fp8."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    spec = gen_prefill_module(dtype, head_dim, tiling, "NONE", kv_dtype)
    base = gen_prefill_module(dtype, head_dim, tiling).name
    short = kv_dtype.split("_")[1][:4]  # e4m3, e5m2
    assert spec.name == base.replace(f"_hd{head_dim}", f"_hd{head_dim}_kv{short}")
    module = build_without_spills(spec)
    assert (module.dtype(), module.kv_dtype(), module.head_dim()) == (dtype, kv_dtype, head_dim)


def test_fp8_caches_refuse_the_tilings_at_the_register_limit(monkeypatch) -> None:
    """head_dim 128 m2kv64 and m2kv32p (192 accumulators) spill with the widening: an fp8
    build refuses them, from the API and from FLASHINFER_PREFILL_TILING alike; RoPE too."""
    for tiling in (PrefillTiling(2, 64), PrefillTiling(2, 32, 1, True)):
        assert tiling in accepted_tilings(128) and tiling not in accepted_tilings(128, fp8=True)
        with pytest.raises(ValueError, match="at most 160 fit with an fp8 KV cache"):
            gen_prefill_module("bfloat16", 128, tiling, "NONE", "float8_e5m2")
    monkeypatch.setenv("FLASHINFER_PREFILL_TILING", "128:m2kv64")
    assert prefill_tiling(128) == PrefillTiling(2, 64)
    with pytest.raises(ValueError, match="FLASHINFER_PREFILL_TILING: m2kv64 at head_dim 128"):
        gen_prefill_module("bfloat16", 128, None, "NONE", "float8_e4m3fn")
    with pytest.raises(ValueError, match='"ROPE_LLAMA" needs a 16-bit KV cache'):
        gen_prefill_module("float16", 64, None, "ROPE_LLAMA", "float8_e4m3fn")
    with pytest.raises(TypeError, match="unsupported KV cache dtype"):
        gen_prefill_module("float16", 64, None, "NONE", "int8")


# RoPE and ALiBi builds: the defaults, and the GPU tests' other tilings (test_prefill_gpu.py)
ROPE_TILINGS = [(d, DEFAULT_TILINGS[d]) for d in HEAD_DIMS] + [
    (64, PrefillTiling(2, 32)),
    (128, PrefillTiling(2, 32)),
    (256, PrefillTiling(1, 32)),
]


@pytest.mark.parametrize(
    "dtype,head_dim,tiling,pos_encoding",
    [
        pytest.param(
            dtype,
            head_dim,
            tiling,
            pos_encoding,
            marks=[]
            if (dtype, head_dim, tiling) == ("bfloat16", 128, DEFAULT_TILINGS[128])
            else [pytest.mark.compile_matrix],
            id=f"{dtype}-{head_dim}-{tiling.name}-{pos_encoding}",
        )
        for dtype in ("float16", "bfloat16")
        for head_dim, tiling in ROPE_TILINGS
        for pos_encoding in ("ROPE_LLAMA", "ALIBI")
    ],
)
def test_position_encoding_prefill_kernels_do_not_spill(
    dtype, head_dim, tiling, pos_encoding, monkeypatch
) -> None:
    """The builds that rotate q and k in shared memory (pos_encoding_mode="ROPE_LLAMA") or
    add ALiBi's biases to the scores keep their state in registers too; they are modules of
    their own, named so."""
    monkeypatch.delenv("FLASHINFER_PREFILL_TILING", raising=False)
    spec = gen_prefill_module(dtype, head_dim, tiling, pos_encoding)
    suffix = {"ROPE_LLAMA": "_rope", "ALIBI": "_alibi"}[pos_encoding]
    assert spec.name == gen_prefill_module(dtype, head_dim, tiling).name + suffix
    module = build_without_spills(spec)
    assert module.pos_encoding() == pos_encoding and module.head_dim() == head_dim
