"""The CUDA-core decode kernel's own source, run on the CPU by the emulator (tests/emu),
through the real wrappers and planner, against the float64 reference: every head_dim and
block shape (GQA groups folded two heads a thread, one head a thread, odd groups ending in a
partial warp, groups past 256 threads), paged caches with shuffled pages and NaN in every
slot no request owns, empty and one-token requests, soft cap, window, KV split across CTAs
and merged by the merge kernel, page ids outside the cache, two wrappers sharing one float
workspace, single decode, RoPE and ALiBi inside the kernel, and fp8 KV caches (their
builds). Some tests land cp.async copies when issued, some run a CTA's threads last first
(see tests/emu/engine.py). The same cases at GPU sizes are in tests/ops/test_decode.py's GPU
tests."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest
import torch

from flashinfer import cascade as cascade_api
from flashinfer import decode as decode_api
from flashinfer import prefill as prefill_api
from flashinfer.jit.decode import gen_decode_module
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.emu.profile import PROFILED
from tests.ops.test_decode import (
    DECODE_VARIANTS,
    POS_VARIANTS,
    check_batch_decode,
    check_decoded,
    check_fp8_decode,
    check_nans_propagate,
    check_position_encoding_decode,
    check_single_decode,
    check_split_chunks_with_unscored_pages,
    paged_decode_batch,
)

MAX_CTAS = 6  # a GPU this small splits a long KV over CTAs, so the merge kernel runs too


OUTPUTS = {  # each launch's outputs and partial-state scratch, NaN-filled before it
    "batch_decode": ("out", "lse", "tmp_v", "tmp_lse"),
    "single_decode": ("out", "lse", "tmp_v", "tmp_lse"),
}


@functools.cache
def _module(
    dtype: torch.dtype,
    head_dim: int,
    land_at_issue: bool,
    reverse: bool,
    pos_encoding: str,
    kv_dtype: torch.dtype | None,
) -> EmulatedModule:
    spec = gen_decode_module(dtype, head_dim, pos_encoding, kv_dtype)
    return EmulatedModule(spec, OUTPUTS, land_at_issue, reverse)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedModule]]:
    """emulate(dtype, head_dim, land_at_issue=False, reverse=False, pos_encoding="NONE",
    kv_dtype=None): the wrappers' decode module is then the emulated build (with that
    schedule, for that position encoding and KV cache dtype, which the wrappers must then ask
    for), on CPU tensors; plan() uploads its schedule for real."""

    def install(
        dtype: torch.dtype,
        head_dim: int,
        land_at_issue: bool = False,
        reverse: bool = False,
        pos_encoding: str = "NONE",
        kv_dtype: torch.dtype | None = None,
    ) -> EmulatedModule:
        module = _module(dtype, head_dim, land_at_issue, reverse, pos_encoding, kv_dtype)
        module.launches.clear()

        def get_decode_module(
            d: torch.dtype, h: int, asked: str = "NONE", asked_kv: torch.dtype | None = None
        ) -> EmulatedModule:
            assert asked == pos_encoding, f"the wrapper asked for the {asked} build"
            assert asked_kv in (kv_dtype or d, None), f"the wrapper asked for a {asked_kv} cache"
            return module

        monkeypatch.setattr(decode_api, "get_decode_module", get_decode_module)
        return module

    monkeypatch.setattr(decode_api, "_max_ctas", lambda *a: MAX_CTAS)
    monkeypatch.setattr(decode_api, "get_device_sm_count", lambda device: MAX_CTAS)
    with on_cpu_tensors(monkeypatch, decode_api, prefill_api, cascade_api):
        yield install


def _workspace() -> torch.Tensor:
    return torch.empty(16 << 20, dtype=torch.uint8)


# (qo_heads, kv_heads, head_dim, page_size, layout, dtype): groups of 1, 2 and 8 (two heads a
# thread), 3 and 5 (one head a thread, blocks ending in a partial warp), 33 at head_dim 64 and
# 128 (past 256 threads: the 1024-thread kernel, partial last warp)
BATCH_CASES = [
    (4, 4, 128, 16, "NHD", torch.bfloat16),
    (8, 4, 64, 1, "HND", torch.float16),
    (16, 2, 128, 5, "NHD", torch.float16),
    (6, 2, 256, 16, "HND", torch.bfloat16),
    (5, 1, 128, 3, "NHD", torch.bfloat16),
    (33, 1, 64, 16, "HND", torch.float16),
    (33, 1, 128, 8, "NHD", torch.bfloat16),
]


@pytest.mark.parametrize(
    "qo_heads,kv_heads,head_dim,page_size,layout,dtype",
    BATCH_CASES,
    ids=[f"{c[0]}x{c[1]}-hd{c[2]}-p{c[3]}-{c[4]}-{str(c[5])[6:]}" for c in BATCH_CASES],
)
def test_batch_decode_matches_the_reference(
    emulate, qo_heads, kv_heads, head_dim, page_size, layout, dtype
) -> None:
    """Requests of 0, 1, a few tiles and a ragged last tile; plain, soft-capped, windowed
    (tests/ops/test_decode.py's check)."""
    lens = [0, 1, 4 * 4096 // head_dim + 7, 29]
    module = emulate(dtype, head_dim, land_at_issue=head_dim == 128, reverse=page_size == 1)
    check_batch_decode(
        "cpu", lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype, kv_tuple=qo_heads > 8
    )
    assert len(module.launches) == len(DECODE_VARIANTS)


@pytest.mark.parametrize("head_dim,group", [(64, 4), (128, 3), (256, 2)])
def test_split_chunks_with_unscored_pages_merge_to_the_reference(
    emulate, head_dim: int, group: int
) -> None:
    """(tests/ops/test_decode.py's check) Requests of 300, 1 and 90 tokens."""
    module = emulate(torch.bfloat16, head_dim, reverse=True)
    check_split_chunks_with_unscored_pages(
        "cpu", [300, 1, 90], 2 * group, 2, head_dim, torch.bfloat16
    )
    assert module.launches[-1]["grid_merge"] > 0  # the merge kernel ran


@pytest.mark.parametrize("head_dim,group", [(64, 4), (128, 3), (256, 2)])
def test_nans_propagate_through_split_and_merge(emulate, head_dim: int, group: int) -> None:
    """(tests/ops/test_decode.py's check) A NaN key, query head or value: NaN out and LSE
    where the reference has them, through the block's parts and the chunks' merge."""
    module = emulate(torch.bfloat16, head_dim, reverse=group == 3)
    check_nans_propagate("cpu", head_dim, group)
    assert module.launches[-1]["grid_merge"] > 0


def test_two_wrappers_sharing_a_float_workspace_keep_their_own_schedules(emulate) -> None:
    """Wrapper B's plan() between A's plan() and run() does not change what A runs."""
    dtype, heads, kv_heads, dim, page_size = torch.float16, 8, 2, 64, 4
    emulate(dtype, dim)
    workspace = _workspace()
    a = decode_api.BatchDecodeWithPagedKVCacheWrapper(workspace)
    b = decode_api.BatchDecodeWithPagedKVCacheWrapper(workspace)
    q_a, ks_a, vs_a, cache_a, table_a = paged_decode_batch(
        "cpu", [200, 150], heads, kv_heads, dim, page_size, "NHD", dtype, seed=1
    )
    _, _, _, cache_b, table_b = paged_decode_batch(
        "cpu", [3] * 6, heads, kv_heads, dim, page_size, "NHD", dtype, seed=2
    )
    a.plan(*table_a, heads, kv_heads, dim, page_size, q_data_type=dtype)
    b.plan(*table_b, heads, kv_heads, dim, page_size, q_data_type=dtype)
    out, lse = a.run(q_a, cache_a, return_lse=True)
    check_decoded(out, lse, q_a, ks_a, vs_a, dim**-0.5)


def test_cuda_graph_grid_past_the_plans_items(emulate) -> None:
    """In CUDA-graph mode the grid is the capacity (batch plus the split chunks a GPU
    holds), past the plan's items: those CTAs (their item words zeroed) write nothing,
    neither output rows nor the partial states of request 0's chunks."""
    dtype, heads, kv_heads, dim, page_size = torch.bfloat16, 4, 2, 128, 16
    module = emulate(dtype, dim)
    q, ks, vs, cache, (indptr, indices, last) = paged_decode_batch(
        "cpu", [700, 5], heads, kv_heads, dim, page_size, "NHD", dtype, seed=3
    )
    wrapper = decode_api.BatchDecodeWithPagedKVCacheWrapper(
        _workspace(),
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros_like(indptr),
        paged_kv_indices_buffer=torch.zeros_like(indices),
        paged_kv_last_page_len_buffer=torch.zeros_like(last),
    )
    wrapper.plan(indptr, indices, last, heads, kv_heads, dim, page_size, q_data_type=dtype)
    out, lse = wrapper.run(q, cache, return_lse=True)
    check_decoded(out, lse, q, ks, vs, dim**-0.5)
    launch, schedule = module.launches[-1], wrapper._plan_info.schedule
    assert launch["grid_work"] > schedule.num_work and schedule.num_merge == 1


@pytest.mark.parametrize(
    "kv_len,qo_heads,kv_heads,head_dim,layout,dtype",
    [
        (1, 4, 4, 128, "NHD", torch.float16),
        (333, 8, 2, 64, "HND", torch.bfloat16),
        (700, 7, 1, 256, "NHD", torch.float16),
        (600, 35, 1, 64, "NHD", torch.bfloat16),
    ],
)
def test_single_decode_matches_the_reference(
    emulate, kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    """One request, split into chunks merged by the merge kernel when long; plain, capped,
    windowed; NHD and HND; a group of 35 (a partial warp in the 1024-thread kernel)."""
    module = emulate(dtype, head_dim, land_at_issue=kv_len % 2 == 1)
    check_single_decode(kv_len, qo_heads, kv_heads, head_dim, layout, dtype, device="cpu")
    if kv_len >= 600:
        assert module.launches[0]["num_chunks"] > 1  # split and merged


# (pos_encoding, qo_heads, kv_heads, head_dim, page_size, layout, dtype, reverse): two heads a
# thread at head_dim 64 and 128, one head a thread at 256, a group of 33 (the 1024-thread kernel)
POS_CASES = [
    ("ROPE_LLAMA", 8, 2, 128, 16, "NHD", torch.bfloat16, True),
    ("ROPE_LLAMA", 8, 4, 64, 3, "HND", torch.float16, False),
    ("ROPE_LLAMA", 3, 1, 256, 16, "NHD", torch.bfloat16, True),
    ("ROPE_LLAMA", 33, 1, 64, 16, "HND", torch.bfloat16, False),
    ("ALIBI", 8, 2, 128, 16, "HND", torch.bfloat16, False),
    ("ALIBI", 3, 1, 256, 5, "NHD", torch.float16, True),
    ("ALIBI", 33, 1, 64, 16, "NHD", torch.bfloat16, True),
]


@pytest.mark.parametrize(
    "pos_encoding,qo_heads,kv_heads,head_dim,page_size,layout,dtype,reverse",
    POS_CASES,
    ids=[f"{c[0]}-{c[1]}x{c[2]}-hd{c[3]}-{'reverse' if c[7] else 'forward'}" for c in POS_CASES],
)
def test_position_encoding_inside_decode(
    emulate,
    monkeypatch,
    pos_encoding,
    qo_heads,
    kv_heads,
    head_dim,
    page_size,
    layout,
    dtype,
    reverse,
) -> None:
    """pos_encoding_mode in the CUDA-core kernel. "ROPE_LLAMA": the query rotated at its
    request's last position, each K tile after it lands at its tokens' indices; "ALIBI": each
    score gains its head's slope times the key's index (each thread's own heads' slopes);
    both also past a window's start and in the second chunk of a split request (a GPU of 32
    CTAs splits the 300 keys), then single decode (tests/ops/test_decode.py's check)."""
    module = emulate(dtype, head_dim, reverse=reverse, pos_encoding=pos_encoding)
    monkeypatch.setattr(decode_api, "_max_ctas", lambda *a: 32)
    lens = [0, 1, 300, 45]
    args = (pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype)
    check_position_encoding_decode("cpu", *args)
    batch_launches = [launch for launch in module.launches if "plan" in launch]
    assert len(batch_launches) == len(POS_VARIANTS[pos_encoding])
    assert batch_launches[0]["grid_merge"] > 0  # the 300 keys ran as two chunks
    assert module.launches[-1]["num_chunks"] == 2  # and in single decode


# (kv_dtype, pos_encoding, qo_heads, kv_heads, head_dim, page_size, layout, dtype, reverse):
# two heads a thread at head_dim 128, one at 64 (a 128-token fp8 tile, the most a block's
# page-table lookups cover), the 1024-thread kernel at 64 and 256, ALiBi
FP8_CASES = [
    (torch.float8_e4m3fn, "NONE", 8, 2, 128, 16, "NHD", torch.bfloat16, True),
    (torch.float8_e5m2, "NONE", 3, 1, 64, 5, "HND", torch.float16, False),
    (torch.float8_e4m3fn, "NONE", 33, 1, 64, 16, "NHD", torch.float16, True),
    (torch.float8_e5m2, "ALIBI", 6, 2, 256, 1, "HND", torch.bfloat16, True),
]


@pytest.mark.parametrize(
    "kv_dtype,pos_encoding,qo_heads,kv_heads,head_dim,page_size,layout,dtype,reverse",
    FP8_CASES,
    ids=[f"{str(c[0])[12:]}-{c[1]}-{c[2]}x{c[3]}-hd{c[4]}" for c in FP8_CASES],
)
def test_fp8_cache_inside_decode(
    emulate,
    monkeypatch,
    kv_dtype,
    pos_encoding,
    qo_heads,
    kv_heads,
    head_dim,
    page_size,
    layout,
    dtype,
    reverse,
) -> None:
    """An fp8 KV cache: rows land as fp8 (two tiles' worth of tokens in a 16-bit tile's
    bytes) and widen where they are read; k_scale and v_scale dequantize; NaN in every slot
    no request owns; a 300-key request split in two chunks (a GPU of 32 CTAs), a window, and
    single decode (tests/ops/test_decode.py's check)."""
    module = emulate(dtype, head_dim, reverse=reverse, pos_encoding=pos_encoding, kv_dtype=kv_dtype)
    monkeypatch.setattr(decode_api, "_max_ctas", lambda *a: 32)
    lens = [0, 1, 300, 45]
    args = (pos_encoding, lens, qo_heads, kv_heads, head_dim, page_size, layout, dtype)
    check_fp8_decode("cpu", kv_dtype, *args)
    batch_launches = [launch for launch in module.launches if "plan" in launch]
    assert batch_launches[0]["grid_merge"] > 0  # the 300 keys ran as two chunks
    assert module.launches[-1]["num_chunks"] == 2  # and in single decode


# (qo_heads, kv_heads, head_dim, kv_dtype): two heads a thread (group 8, 4 warps of tokens),
# one head a thread over a partial warp (group 3), head_dim 64 and 256, the 1024-thread
# kernel (group 33), an fp8 cache
PROFILE_CASES = [
    (32, 4, 128, None),
    (6, 2, 128, None),
    (4, 4, 64, None),
    (4, 2, 256, None),
    (33, 1, 128, None),
    (8, 2, 128, torch.float8_e4m3fn),
]


@PROFILED
@pytest.mark.parametrize(
    "qo_heads,kv_heads,head_dim,kv_dtype",
    PROFILE_CASES,
    ids=[f"{c[0]}x{c[1]}-hd{c[2]}-{str(c[3])[6:]}" for c in PROFILE_CASES],
)
def test_shared_memory_without_bank_conflicts_and_kv_copies_of_whole_sectors(
    emulate, qo_heads: int, kv_heads: int, head_dim: int, kv_dtype: torch.dtype | None
) -> None:
    """The memory profile (tests/emu/profile.py) of batch decode over pages of 16 (requests
    split over CTAs and merged): every shared-memory access of the kernels (the K/V tiles'
    copies and reads, the token offsets, the partial states' merge) takes the fewest
    wavefronts, and the K/V copies read whole 32-byte sectors."""
    module = emulate(torch.bfloat16, head_dim, kv_dtype=kv_dtype)
    args = ([300, 77, 1], qo_heads, kv_heads, head_dim, 16, "NHD", torch.bfloat16)
    with module.profiling() as profile:
        if kv_dtype is None:
            check_batch_decode("cpu", *args)
        else:
            check_fp8_decode("cpu", kv_dtype, "NONE", *args)
    kinds = ("shared load", "shared store", "cp.async to shared", "cp.async from global")
    assert {s.kind for s in profile.in_file("decode.cuh")} >= set(kinds)
    assert not profile.excessive(("decode.cuh",), kinds), profile.table()
