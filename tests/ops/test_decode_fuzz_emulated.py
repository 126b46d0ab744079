"""Random decode cases on the emulator (tests/emu) against the float64 reference: as
tests/ops/test_prefill_fuzz_emulated.py does for prefill, each case draws every knob at once
from its seed: the kernel (CUDA cores, or tensor cores, where decode runs the prefill kernel
at one of its tilings with the GQA group packed into the tile's rows, one or several query
tokens per request), batch or single decode, dtype, head_dim, copy landing and thread order,
position encoding, fp8 cache, request lengths from 0, GQA group up to the 1024-thread block,
page size, layout, the cache as one tensor or a (k, v) pair, scale, soft cap, window, the KV
split (the planner's on a device of some size, a fixed split or none), CUDA-graph mode
re-planned after longer requests (by plan(), or as engines do it: the buffers written, then
fast_decode_plan), and q and the cache (each of a pair alone) as views scattered in
poisoned buffers.
``--fuzz-seeds START:COUNT`` picks the seeds (default 0:6). On a GPU, the cases of GPU_SEEDS
run through the built modules (tensor cores: the prefill build at its default tiling)."""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from typing import Any

import pytest
import torch

import flashinfer
from flashinfer import decode as decode_api
from flashinfer import prefill as prefill_api
from flashinfer.decode import fast_decode_plan
from flashinfer.jit.core import JitSpec
from flashinfer.jit.decode import gen_decode_module
from flashinfer.jit.prefill import (
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
    prefill_tiling,
)
from tests.ops.nan_inputs import draw_nan, plant_case_nan
from tests.ops.strided_memory import Watched
from tests.ops.test_decode import _reference_args, check_decoded
from tests.ops.test_decode_emulated import emulate as emulate_decode  # noqa: F401
from tests.ops.test_prefill_emulated import _reference_args as _prefill_reference_args
from tests.ops.test_prefill_emulated import emulate as emulate_prefill  # noqa: F401
from tests.ops.test_prefill_fuzz_emulated import Place, placer
from tests.ops.test_prefill_gpu import (
    _cache_of,
    _check,
    _expected_batch,
    _kv_data,
    _page_table,
    _paged_kv,
    _to_layout,
)

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
PAGE_SIZES = (1, 2, 3, 5, 8, 16, 31, 64)
HEAD_DIMS = (64, 128, 256)
Q_LENS = (1, 1, 2, 3, 5)  # tensor-core batch decode's q_len_per_req
GPU_SEEDS = range(24)  # a few seconds; the modules are in the GPU pass's prebuilt layer


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    seed: int
    api: str  # "batch" or "single"
    tiling: PrefillTiling | None  # tensor cores: the prefill kernel's; None: CUDA cores
    q_len: int  # query tokens per request (tensor-core batch decode only: more than 1)
    dtype: torch.dtype
    head_dim: int
    land_at_issue: bool
    reverse: bool
    pos_encoding: str
    kv_dtype: torch.dtype | None
    lens: tuple[int, ...]
    heads: tuple[int, int]
    page_size: int
    layout: str
    kv_tuple: bool
    options: tuple[tuple[str, Any], ...]  # plan() / single decode keywords
    split: tuple[tuple[str, Any], ...]  # plan()'s fixed_split_size or disable_split_kv
    max_ctas: int
    graph: bool  # batch: CUDA-graph mode, planned first for longer requests
    fast_replan: bool  # graph: the case planned by fast_decode_plan over buffers written first
    nan: str  # tests/ops/nan_inputs.py's draw_nan
    views: str  # "none" or "scattered": q, k/v or the cache's tensors in poisoned buffers


def _group(rng: random.Random, head_dim: int) -> int:
    """A GQA group the block of group * head_dim / 8 threads can take (<= 1024)."""
    group = rng.choice((1, 1, 2, 3, 4, 5, 7, 8, 16, 33))
    return min(group, 1024 * 8 // head_dim)


def _lens(rng: random.Random, api: str, q_len: int) -> tuple[int, ...]:
    """Each request's KV length: from 0 in a batch (at least q_len: plan() wants a request's
    query tokens in the cache), 1 to 400 for single decode."""
    if api == "single":
        return (rng.randint(1, 400),)
    lens = (
        rng.choice((0, 1, rng.randint(1, 40), rng.randint(1, 400)))
        for _ in range(rng.randint(1, 6))
    )
    return tuple(n if q_len == 1 else max(n, q_len) for n in lens)


def draw_case(seed: int) -> DecodeCase:
    rng = random.Random(seed)
    api = rng.choice(("batch", "batch", "batch", "single"))
    tensor_cores = rng.random() < 0.4
    head_dim = rng.choice(HEAD_DIMS)
    kv_dtype = rng.choice(FP8) if rng.random() < 0.25 else None
    tiling = rng.choice(accepted_tilings(head_dim, kv_dtype is not None)) if tensor_cores else None
    q_len = rng.choice(Q_LENS) if tensor_cores and api == "batch" else 1
    pos_encoding = rng.choice(("NONE", "NONE", "ROPE_LLAMA", "ALIBI"))
    if pos_encoding == "ROPE_LLAMA" and kv_dtype is not None:
        pos_encoding = "NONE"  # refused: RoPE over an fp8 cache
    options: dict[str, Any] = {}
    if rng.random() < 0.3:
        options["sm_scale"] = round(rng.uniform(0.02, 0.3), 4)
    if pos_encoding != "ALIBI" and rng.random() < 0.3:
        options["logits_soft_cap"] = round(rng.uniform(2.0, 50.0), 2)
    if rng.random() < 0.3:
        options["window_left"] = rng.randint(0, 120)
    if pos_encoding == "ROPE_LLAMA" and rng.random() < 0.5:
        options.update(rope_scale=rng.choice((0.5, 2.0)), rope_theta=rng.choice((1e4, 5e5)))
    if pos_encoding != "NONE":
        options["pos_encoding_mode"] = pos_encoding
    split: dict[str, Any] = {}
    if rng.random() < 0.25:
        split = rng.choice((dict(fixed_split_size=rng.randint(1, 6)), dict(disable_split_kv=True)))
    kv_heads = rng.choice((1, 1, 2, 3))
    case = DecodeCase(
        seed=seed,
        api=api,
        tiling=tiling,
        q_len=q_len,
        dtype=rng.choice((torch.bfloat16, torch.float16)),
        head_dim=head_dim,
        land_at_issue=rng.random() < 0.5,
        reverse=rng.random() < 0.5,
        pos_encoding=pos_encoding,
        kv_dtype=kv_dtype,
        lens=_lens(rng, api, q_len),
        heads=(kv_heads * _group(rng, head_dim), kv_heads),
        page_size=rng.choice(PAGE_SIZES),
        layout=rng.choice(("NHD", "HND")),
        kv_tuple=rng.random() < 0.3,
        options=tuple(sorted(options.items())),
        split=tuple(split.items()),
        max_ctas=rng.choice((1, 2, 6, 24, 132)),
        graph=api == "batch" and rng.random() < 0.3,
        fast_replan=rng.random() < 0.5,
        nan=draw_nan(rng, q_len == 1 and "window_left" not in options),
        views=rng.choice(("none", "scattered")),  # drawn last: the other knobs stay
    )
    if not case.graph:
        case = dataclasses.replace(case, fast_replan=False)
    if case.graph and case.tiling is None and dict(case.split).get("fixed_split_size"):
        # a captured CUDA-core grid holds the chunks the device runs at once; a fixed split
        # into more is refused (test_decode.py's test_cuda_graph_fixed_split_past_...)
        case = dataclasses.replace(case, split=())
    return case


def _run(
    case: DecodeCase, place: Place, q: torch.Tensor, ks, vs, scales
) -> tuple[torch.Tensor, torch.Tensor]:
    options = dict(case.options)
    tensor_cores = case.tiling is not None
    if case.api == "single":
        k, v = (place(name, _to_layout(t[0], case.layout)) for name, t in (("k", ks), ("v", vs)))
        out, lse = flashinfer.single_decode_with_kv_cache(
            place("q", q[0]),
            k,
            v,
            kv_layout=case.layout,
            use_tensor_cores=tensor_cores,
            return_lse=True,
            **options,
            **scales,
        )
        return out[None], lse[None]
    device = q.device
    cache, indptr, indices, last = _paged_kv(ks, vs, case.page_size, case.layout, case.seed)
    if case.kv_tuple:
        kv = tuple(place(f"paged_kv_cache[{i}]", cache[:, i]) for i in (0, 1))
    else:
        kv = place("paged_kv_cache", cache)
    tables = [(indptr, indices, last)]
    buffers: dict[str, torch.Tensor] = {}
    if case.graph:  # planned first for longer requests, the tables copied into poisoned buffers
        rng = random.Random(case.seed + 1)
        first_lens = [n + rng.choice((0, 1, rng.randint(1, 300))) for n in case.lens]
        pages = sum(-(-n // case.page_size) for n in first_lens)
        generator = torch.Generator().manual_seed(case.seed + 1)
        tables.insert(0, _page_table(first_lens, case.page_size, pages, generator))
        batch = len(case.lens)
        buffers = {
            name: torch.full((n,), -7, dtype=torch.int32, device=device)
            for name, n in (
                ("paged_kv_indptr_buffer", batch + 1),
                ("paged_kv_indices_buffer", pages + 3),
                ("paged_kv_last_page_len_buffer", batch),
            )
        }
    # CUDA-graph mode keeps partial states for as many KV chunks as the GPU holds: 128 MiB, as
    # engines give it
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty((128 if case.graph else 16) << 20, dtype=torch.uint8, device=device),
        kv_layout=case.layout,
        use_cuda_graph=case.graph,
        use_tensor_cores=tensor_cores,
        **buffers,
    )
    for index, table in enumerate(tables):
        plan = wrapper.plan
        if case.fast_replan and index == len(tables) - 1:
            # as engines re-plan a captured decode: they write the buffers, then
            # fast_decode_plan (which copies nothing and assumes full last pages)
            for buffer, t in zip(buffers.values(), table):
                buffer[: t.numel()].copy_(t)
            plan = functools.partial(fast_decode_plan, wrapper)
        plan(
            *table,
            *case.heads,
            case.head_dim,
            case.page_size,
            q_data_type=case.dtype,
            kv_data_type=case.kv_dtype or case.dtype,
            q_len_per_req=case.q_len,
            **options,
            **dict(case.split),
        )
    out, lse = torch.full_like(q, math.nan), torch.full(q.shape[:2], math.nan, device=device)
    wrapper.run(place("q", q), kv, out=out, lse=lse, return_lse=True, **scales)
    return out, lse


def _on_device(case: DecodeCase, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan() schedules for a device of the case's ``max_ctas`` CTAs."""
    for api in (decode_api, prefill_api):
        monkeypatch.setattr(api, "_max_ctas", lambda *a: case.max_ctas)
        monkeypatch.setattr(api, "get_device_sm_count", lambda device: case.max_ctas)


def _emulate(
    case: DecodeCase, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case's module emulated behind the APIs: the CUDA-core decode build, or the prefill
    build at the case's tiling (the decode build then never reached)."""
    knobs = (case.land_at_issue, case.reverse, case.pos_encoding, case.kv_dtype)
    if case.tiling is None:
        request.getfixturevalue("emulate_decode")(case.dtype, case.head_dim, *knobs)
    else:
        request.getfixturevalue("emulate_prefill")(case.dtype, case.head_dim, case.tiling, *knobs)

        def refuse(*args: Any) -> None:
            raise AssertionError("tensor-core decode reached the CUDA-core decode kernel")

        monkeypatch.setattr(decode_api, "get_decode_module", refuse)


def run_case(case: DecodeCase, device: str) -> None:
    """The case's call on ``device`` against the float64 reference; the module behind the
    APIs is the caller's (emulated on the CPU, built on a GPU)."""
    torch.manual_seed(case.seed)
    ks16, vs16 = _kv_data(list(case.lens), case.heads[1], case.head_dim, case.dtype, device)
    ks, vs, k_ref, v_ref, scales = _cache_of(ks16, vs16, case.kv_dtype)
    rows = len(case.lens) * case.q_len
    q = torch.randn(rows, case.heads[0], case.head_dim, dtype=case.dtype, device=device)
    where = plant_case_nan(case.nan, case.seed, q, (ks, k_ref), (vs, v_ref))
    inputs = Watched()
    out, lse = _run(case, placer(case.views, case.seed, inputs), q, ks, vs, scales)
    nan = case.nan != "none"
    try:
        if case.q_len == 1:
            want = _reference_args(case.head_dim, case.pos_encoding, dict(case.options))
            check_decoded(
                out,
                lse,
                q,
                k_ref,
                v_ref,
                tensor_cores=case.tiling is not None,
                equal_nan=nan,
                **want,
            )
        else:  # a request's tokens see the cache up to their own, as a causal prefill
            options = dict(case.options, causal=True)
            want = _expected_batch(
                q, [case.q_len] * len(case.lens), k_ref, v_ref, **_prefill_reference_args(options)
            )
            _check(out, lse, want, equal_nan=nan)
        inputs.check()
    except AssertionError as err:
        raise AssertionError(f"{case!r} NaN: {where}\n{err}") from None


def test_random_decode_case(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, fuzz_seed: int
) -> None:
    case = draw_case(fuzz_seed)
    _emulate(case, request, monkeypatch)
    _on_device(case, monkeypatch)
    run_case(case, "cpu")


def gpu_case(seed: int) -> DecodeCase:
    """Seed's case as the GPU test runs it: a tensor-core case at the prefill build's
    default tiling (the emulator's schedule knobs mean nothing there)."""
    case = draw_case(seed)
    if case.tiling is None:
        return case
    return dataclasses.replace(
        case, tiling=prefill_tiling(case.head_dim, case.kv_dtype is not None)
    )


def gpu_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of the builds GPU_SEEDS' cases load (scripts/gpu_modules.py builds them):
    the CUDA-core decode build, or the prefill build tensor cores run."""
    specs = []
    for c in map(draw_case, GPU_SEEDS):
        knobs = (c.dtype, c.head_dim, c.pos_encoding, c.kv_dtype)
        if c.tiling is None:
            specs.append(("decode", gen_decode_module(*knobs)))
        else:
            specs.append(("prefill", gen_prefill_module(*knobs[:2], None, *knobs[2:])))
    return specs


@pytest.mark.gpu
@pytest.mark.parametrize("seed", GPU_SEEDS)
def test_random_decode_case_on_gpu(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    case = gpu_case(seed)
    _on_device(case, monkeypatch)
    run_case(case, "cuda")


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs."""
    cases = [draw_case(seed) for seed in range(300)]
    seen = {
        f.name: {repr(getattr(c, f.name)) for c in cases} for f in dataclasses.fields(DecodeCase)
    }
    assert len(seen["api"]) == 2 and len(seen["dtype"]) == 2
    assert len(seen["head_dim"]) == len(HEAD_DIMS) and len(seen["pos_encoding"]) == 3
    assert len(seen["kv_dtype"]) == 3 and len(seen["page_size"]) == len(PAGE_SIZES)
    assert len(seen["layout"]) == 2 and len(seen["kv_tuple"]) == 2
    scattered = [c for c in cases if c.views == "scattered"]
    assert {(c.api, c.tiling is None) for c in scattered} == {
        (api, cuda_cores) for api in ("batch", "single") for cuda_cores in (True, False)
    }
    assert {c.kv_tuple for c in scattered if c.api == "batch"} == {True, False}
    assert len(scattered) < len(cases)
    assert seen["q_len"] == {repr(n) for n in Q_LENS}
    assert {name for c in cases for name, _ in c.options + c.split} == {
        "sm_scale",
        "logits_soft_cap",
        "window_left",
        "rope_scale",
        "rope_theta",
        "pos_encoding_mode",
        "fixed_split_size",
        "disable_split_kv",
    }
    assert any(0 in c.lens for c in cases)
    groups = {c.heads[0] // c.heads[1] for c in cases}
    assert {1, 3, 33}.issubset(groups)
    tensor_core = [c for c in cases if c.tiling is not None]
    assert {c.api for c in tensor_core} == {"batch", "single"}
    assert len({(c.head_dim, c.tiling) for c in tensor_core}) > 15
    assert any(c.kv_dtype is not None for c in tensor_core)
    assert any(c.pos_encoding != "NONE" and c.q_len > 1 for c in tensor_core)
    assert {c.nan for c in cases} == {"none", "key", "query", "value"}
    graphs = [c for c in cases if c.graph]
    assert {c.api for c in graphs} == {"batch"} and {c.tiling is None for c in graphs} == {
        True,
        False,
    }
    assert any(c.q_len > 1 for c in graphs) and any(c.split for c in graphs)
    assert {c.fast_replan for c in graphs} == {True, False}
    assert {c.tiling is None for c in graphs if c.fast_replan} == {True, False}
