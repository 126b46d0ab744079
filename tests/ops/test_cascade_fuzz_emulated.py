"""Random MultiLevelCascadeAttentionWrapper cases on the emulator (tests/emu): each level's
prefill kernel and the merge kernel run as built, behind the real wrapper, against the float64
reference. Each case draws from its seed the levels (1 to 3; a node shared by a run of
requests at every level but the last, one node per request at the last; nodes with no keys
and partial last pages included), query lengths from 0, dtype, head_dim, tiling, copy landing
and thread order, position encoding, fp8 cache, GQA group, page size, layout, the cache as one
tensor or a (k, v) pair, causal, window, soft cap, scale, the device size that decides each
level's KV split, a NaN input (tests/ops/nan_inputs.py), CUDA-graph mode (each level's
buffers poisoned, the wrapper planned first for more queries, which fixes each level's grid,
then for the case) and q and the cache (each of a pair alone) as views scattered in
poisoned buffers.

The expected output is the reference's semantics: each level a batch prefill of its own
(``causal`` on the last level only; windows, RoPE and ALiBi positions counted within the
level's keys), the levels' states merged in base 2. ``--fuzz-seeds START:COUNT`` picks the
seeds (default 0:6). On a GPU, the cases of GPU_SEEDS run through the built modules at the
default tilings."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest
import torch

from flashinfer import cascade as cascade_api
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper
from flashinfer.jit.core import JitSpec
from flashinfer.jit.prefill import (
    HEAD_DIMS,
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
    prefill_tiling,
)
from flashinfer.testing.reference import attention as reference_attention
from flashinfer.testing.reference import merge_state
from tests.ops.nan_inputs import draw_nan, plant_case_nan
from tests.ops.strided_memory import Watched
from tests.ops.test_cascade_emulated import _module as cascade_module
from tests.ops.test_prefill_emulated import _reference_args, emulate  # noqa: F401
from tests.ops.test_prefill_fuzz_emulated import (
    _workspace,
    draw_score_options,
    placer,
    schedule_for,
)
from tests.ops.test_prefill_gpu import _indptr, _kv_data, _paged_kv, _tolerance

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
PAGE_SIZES = (1, 2, 3, 5, 8, 16, 31, 64)
GPU_SEEDS = range(16)  # a few seconds; the modules are in the GPU pass's prebuilt layer

# a level: its nodes as (requests sharing the node, the node's KV length)
Level = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class CascadeCase:
    seed: int
    dtype: torch.dtype
    head_dim: int
    tiling: PrefillTiling
    land_at_issue: bool
    reverse: bool
    pos_encoding: str
    kv_dtype: torch.dtype | None
    qo_lens: tuple[int, ...]
    levels: tuple[Level, ...]
    heads: tuple[int, int]
    page_size: int
    layout: str
    kv_tuple: bool
    options: tuple[tuple[str, Any], ...]  # plan() keywords
    max_ctas: int
    nan: str  # tests/ops/nan_inputs.py's draw_nan (no values: the last level may mask)
    graph: bool  # CUDA-graph mode, planned first for more queries
    views: str  # "none" or "scattered": q and the cache's tensors in poisoned buffers


def _kv_len(rng: random.Random) -> int:
    return rng.choice((0, 1, rng.randint(1, 40), rng.randint(1, 300)))


def _levels(rng: random.Random, batch: int) -> tuple[Level, ...]:
    """1 to 3 levels over ``batch`` requests: every level but the last cuts the requests into
    runs sharing a node, the last gives each request its own node."""
    levels = []
    for _ in range(rng.randint(0, 2)):
        nodes, left = [], batch
        while left:
            requests = rng.randint(1, left)
            nodes.append((requests, _kv_len(rng)))
            left -= requests
        levels.append(tuple(nodes))
    levels.append(tuple((1, _kv_len(rng)) for _ in range(batch)))
    return tuple(levels)


def draw_case(seed: int) -> CascadeCase:
    rng = random.Random(seed)
    head_dim = rng.choice(HEAD_DIMS)
    kv_dtype = rng.choice(FP8) if rng.random() < 0.2 else None
    pos_encoding = rng.choice(("NONE", "NONE", "NONE", "ROPE_LLAMA", "ALIBI"))
    if pos_encoding == "ROPE_LLAMA" and kv_dtype is not None:
        pos_encoding = "NONE"  # refused: RoPE over an fp8 cache
    batch = rng.randint(1, 5)
    qo_lens = tuple(
        rng.choice((0, 1, 1, rng.randint(1, 12), rng.randint(1, 40))) for _ in range(batch)
    )
    options = draw_score_options(rng, pos_encoding, may_be_causal=True)
    kv_heads = rng.choice((1, 1, 2, 3))
    return CascadeCase(
        seed=seed,
        dtype=rng.choice((torch.bfloat16, torch.float16)),
        head_dim=head_dim,
        tiling=rng.choice(accepted_tilings(head_dim, kv_dtype is not None)),
        land_at_issue=rng.random() < 0.5,
        reverse=rng.random() < 0.5,
        pos_encoding=pos_encoding,
        kv_dtype=kv_dtype,
        qo_lens=qo_lens,
        levels=_levels(rng, batch),
        heads=(kv_heads * rng.choice((1, 2, 3, 4, 8)), kv_heads),
        page_size=rng.choice(PAGE_SIZES),
        layout=rng.choice(("NHD", "HND")),
        kv_tuple=rng.random() < 0.3,
        options=tuple(sorted(options.items())),
        max_ctas=rng.choice((1, 2, 6, 24, 132)),
        nan=draw_nan(rng, every_key_seen=False),
        graph=rng.random() < 0.3,
        views=rng.choice(("none", "scattered")),  # drawn last: the other knobs stay
    )


def _node_rows(case: CascadeCase, level: Level) -> list[tuple[int, int]]:
    """Each node's rows of q: those of the requests it is shared by."""
    starts = _indptr(list(case.qo_lens)).tolist()
    rows, first = [], 0
    for requests, _ in level:
        rows.append((starts[first], starts[first + requests]))
        first += requests
    return rows


def _plan_tables(
    case: CascadeCase, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor
) -> list[list[torch.Tensor]]:
    """plan()'s four per-level arrays, cut from one page table of every level's nodes in
    order (level after level)."""
    tables: list[list[torch.Tensor]] = [[], [], [], []]
    node = 0
    for level in case.levels:
        end = node + len(level)
        pages = indptr[node : end + 1]
        rows = _node_rows(case, level)
        tables[0].append(_indptr([b - a for a, b in rows]))
        tables[1].append(pages - pages[0])
        tables[2].append(indices[pages[0] : pages[-1]])
        tables[3].append(last[node:end])
        node = end
    return tables


def _graph_wrapper(
    case: CascadeCase, indices: torch.Tensor, device: torch.device
) -> MultiLevelCascadeAttentionWrapper:
    """A CUDA-graph-mode wrapper, each level's buffers poisoned with -7 (plan() must write
    what the kernels read), its page-index buffer 3 entries longer than the level needs."""

    def poisoned(n: int) -> torch.Tensor:
        return torch.full((n,), -7, dtype=torch.int32, device=device)

    nodes = [len(level) for level in case.levels]
    return MultiLevelCascadeAttentionWrapper(
        len(case.levels),
        _workspace(device),
        case.layout,
        use_cuda_graph=True,
        qo_indptr_buf_arr=[poisoned(n + 1) for n in nodes],
        paged_kv_indptr_buf_arr=[poisoned(n + 1) for n in nodes],
        paged_kv_indices_buf_arr=[poisoned(indices.numel() + 3) for _ in nodes],
        paged_kv_last_page_len_buf_arr=[poisoned(n) for n in nodes],
    )


def _first_plan(case: CascadeCase) -> CascadeCase:
    """The case with more queries per request (each at least the case's), as a CUDA-graph
    wrapper is planned first: that plan fixes each level's captured grid."""
    rng = random.Random(case.seed + 1)
    qo_lens = tuple(q + rng.choice((0, 1, rng.randint(1, 30))) for q in case.qo_lens)
    return dataclasses.replace(case, qo_lens=qo_lens)


def _expected(
    case: CascadeCase, q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]
) -> torch.Tensor:
    """Each level's float64 states, node by node, merged in base 2 (reference.merge_state: a
    row no level's key reaches gives zeros)."""
    options = dict(case.options)
    causal = options.pop("causal", False)
    out = torch.zeros(*q.shape[:2], case.head_dim, dtype=torch.float64, device=q.device)
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64, device=q.device)
    node = 0
    for index, level in enumerate(case.levels):
        is_last = index == len(case.levels) - 1
        reference = _reference_args(dict(options, causal=causal and is_last))
        for start, end in _node_rows(case, level):
            o, s = reference_attention(q[start:end], ks[node], vs[node], **reference)
            rows = slice(start, end)
            out[rows], lse[rows] = merge_state(out[rows], lse[rows], o, s)
            node += 1
    return out


def run_case(case: CascadeCase, device: str) -> None:
    """The case's call on ``device`` against the float64 reference; the modules behind the
    wrapper are the caller's (emulated on the CPU, built on a GPU)."""
    torch.manual_seed(case.seed)
    node_lens = [n for level in case.levels for _, n in level]
    ks, vs = _kv_data(node_lens, case.heads[1], case.head_dim, case.dtype, device)
    if case.kv_dtype is not None:  # run() takes no scales: the cache holds the values
        ks, vs = [k.to(case.kv_dtype) for k in ks], [v.to(case.kv_dtype) for v in vs]
    q = torch.randn(
        sum(case.qo_lens), case.heads[0], case.head_dim, dtype=case.dtype, device=device
    )
    where = plant_case_nan(case.nan, case.seed, q, (ks, ks), (vs, vs))  # the reference's too
    cache, indptr, indices, last = _paged_kv(ks, vs, case.page_size, case.layout, case.seed)

    if case.graph:
        wrapper = _graph_wrapper(case, indices, q.device)
        plans = [_first_plan(case), case]
    else:
        wrapper = MultiLevelCascadeAttentionWrapper(
            len(case.levels), _workspace(q.device), case.layout
        )
        plans = [case]
    for plan in plans:
        wrapper.plan(
            *_plan_tables(plan, indptr, indices, last),
            *case.heads,
            case.head_dim,
            case.page_size,
            q_data_type=case.dtype,
            kv_data_type=case.kv_dtype or case.dtype,
            **dict(case.options),
        )
    inputs = Watched()
    place = placer(case.views, case.seed, inputs)
    if case.kv_tuple:
        kv = tuple(place(f"paged_kv_cache[{i}]", cache[:, i]) for i in (0, 1))
    else:
        kv = place("paged_kv_cache", cache)
    out = wrapper.run(place("q", q), kv)
    want = _expected(case, q, [k.float() for k in ks], [v.float() for v in vs])
    try:
        assert out.shape == q.shape and out.dtype == q.dtype
        torch.testing.assert_close(
            out.double(), want, equal_nan=case.nan != "none", **_tolerance(case.dtype)
        )
        inputs.check()
    except AssertionError as err:
        raise AssertionError(f"{case!r} NaN: {where}\n{err}") from None


def test_random_cascade_case(emulate, monkeypatch: pytest.MonkeyPatch, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(
        case.dtype,
        case.head_dim,
        case.tiling,
        case.land_at_issue,
        case.reverse,
        case.pos_encoding,
        case.kv_dtype,
    )
    monkeypatch.setattr(cascade_api, "get_cascade_module", cascade_module)
    schedule_for(case.max_ctas, monkeypatch)
    run_case(case, "cpu")


def gpu_case(seed: int) -> CascadeCase:
    """Seed's case as the GPU test runs it: at the prefill build's default tiling (the
    emulator's schedule knobs mean nothing there)."""
    case = draw_case(seed)
    return dataclasses.replace(
        case, tiling=prefill_tiling(case.head_dim, case.kv_dtype is not None)
    )


def gpu_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of the prefill builds GPU_SEEDS' cases load (scripts/gpu_modules.py builds
    them; the merge's is registered)."""
    return [
        ("prefill", gen_prefill_module(c.dtype, c.head_dim, None, c.pos_encoding, c.kv_dtype))
        for c in map(draw_case, GPU_SEEDS)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", GPU_SEEDS)
def test_random_cascade_case_on_gpu(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    case = gpu_case(seed)
    schedule_for(case.max_ctas, monkeypatch)
    run_case(case, "cuda")


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs."""
    cases = [draw_case(seed) for seed in range(300)]
    seen = {
        f.name: {repr(getattr(c, f.name)) for c in cases} for f in dataclasses.fields(CascadeCase)
    }
    assert len(seen["dtype"]) == 2 and len(seen["head_dim"]) == len(HEAD_DIMS)
    assert seen["pos_encoding"] == {"'NONE'", "'ROPE_LLAMA'", "'ALIBI'"}
    assert len(seen["kv_dtype"]) == 3 and len(seen["page_size"]) == len(PAGE_SIZES)
    assert len(seen["layout"]) == 2 and len(seen["kv_tuple"]) == 2
    assert {(c.kv_tuple, c.graph) for c in cases if c.views == "scattered"} == {
        (True, True),
        (True, False),
        (False, True),
        (False, False),
    }
    assert {len(c.levels) for c in cases} == {1, 2, 3}
    assert {c.nan for c in cases} == {"none", "key", "query"}
    assert {len(c.levels) for c in cases if c.graph} == {1, 2, 3}
    assert any(any(n > 1 for n, _ in level) for c in cases for level in c.levels[:-1])
    assert any(0 in c.qo_lens for c in cases)
    assert any(n == 0 for c in cases for level in c.levels for _, n in level)
    assert {name for c in cases for name, _ in c.options} == {
        "causal",
        "window_left",
        "logits_soft_cap",
        "sm_scale",
        "pos_encoding_mode",
        "rope_scale",
        "rope_theta",
    }
    assert len({(c.head_dim, c.tiling) for c in cases}) > 20
