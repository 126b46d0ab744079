"""Random prefill cases on the emulator (tests/emu), against the float64 reference: where
tests/ops/test_prefill_emulated.py puts each feature on a few chosen shapes, each case here
draws every knob at once from its seed (API, dtype, head dims, tiling, copy landing and
thread order, position encoding, fp8 cache, lengths including empty requests and fewer keys
than queries, GQA group, page size, layout, causal, window, soft cap, scale, custom mask in
either form, split-KV device size, CUDA-graph mode re-planned after a larger batch, q and
K/V as views scattered in poisoned buffers), so the features' interactions get tried too.

``--fuzz-seeds START:COUNT`` picks the seeds (default 0:6, what CI runs); a failure names its
case, and ``--fuzz-seeds N:1`` runs seed N alone again. On a GPU, the cases of GPU_SEEDS run
through the built modules at their default tilings."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

import pytest
import torch

from flashinfer import prefill as prefill_api
from flashinfer.jit.core import JitSpec
from flashinfer.jit.prefill import (
    HEAD_DIMS,
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
    prefill_tiling,
)
from tests.ops.nan_inputs import draw_nan, plant_case_nan
from tests.ops.strided_memory import Watched
from tests.ops.test_prefill_emulated import _reference_args, emulate  # noqa: F401
from tests.ops.test_prefill_gpu import (
    NAN,
    _batch_data,
    _cache_of,
    _check,
    _expected_batch,
    _indptr,
    _paged_kv,
    _to_layout,
    pack_bits_little,
)

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
PAGE_SIZES = (1, 2, 3, 5, 8, 16, 31, 64)
GPU_SEEDS = range(24)  # a few seconds; the modules are in the GPU pass's prebuilt layer


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    """One drawn case: the module to emulate and the call to make."""

    seed: int
    api: str  # "single", "ragged" or "paged"
    dtype: torch.dtype
    head_dim: int
    head_dim_vo: int | None
    tiling: PrefillTiling
    land_at_issue: bool
    reverse: bool
    pos_encoding: str
    kv_dtype: torch.dtype | None
    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    heads: tuple[int, int]
    page_size: int
    layout: str
    mask: str  # "none", "bool" or "packed"
    options: tuple[tuple[str, Any], ...]  # plan() / single prefill keywords
    max_ctas: int
    graph: bool  # batch: CUDA-graph mode, planned first for more queries (fixing the grid)
    nan: str  # tests/ops/nan_inputs.py's draw_nan
    views: str  # "none"; "scattered": q and K/V as views scattered in poisoned buffers;
    # "pairs": so, and a paged cache as a (k, v) pair, each scattered alone (drawn last)


Place = Callable[[str, torch.Tensor], torch.Tensor]  # (name, operand) -> what the call gets


def placer(views: str, seed: int, inputs: Watched) -> Place:
    """Where a case's read-only operands go: as they are (``views`` "none"), or each in its
    own scattered view (strided_memory.scattered, drawn from the seed and the operand's
    name) whose buffer ``inputs`` checks after the call."""
    if views == "none":
        return lambda name, t: t
    return lambda name, t: inputs.scattered(name, t, random.Random(f"{seed} {name}"))


def _lengths(rng: random.Random, api: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Query and key lengths: a batch of 1 to 4 requests (single: one, neither empty), mostly
    more keys than queries, sometimes fewer, sometimes an empty side."""
    batch = 1 if api == "single" else rng.randint(1, 4)
    qo_lens, kv_lens = [], []
    for _ in range(batch):
        qo = rng.choice((1, 1, rng.randint(1, 24), rng.randint(1, 90)))
        shape = rng.random()
        if shape < 0.6:
            kv = qo + rng.randint(0, 200)
        elif shape < 0.8:
            kv = rng.randint(1, max(1, qo))  # fewer keys: causal rows that see none
        else:
            kv = rng.randint(1, 260)
        if api != "single" and rng.random() < 0.12:
            qo, kv = rng.choice(((0, kv), (qo, 0), (0, 0)))
        qo_lens.append(qo)
        kv_lens.append(kv)
    return tuple(qo_lens), tuple(kv_lens)


def draw_score_options(
    rng: random.Random, pos_encoding: str, may_be_causal: bool
) -> dict[str, Any]:
    """plan()'s score keywords: causal (where no custom mask overrides it), window, soft cap
    (not with ALiBi), scale, RoPE's scale and theta, and ``pos_encoding`` as its mode."""
    options: dict[str, Any] = {}
    if may_be_causal and rng.random() < 0.6:
        options["causal"] = True
    if rng.random() < 0.3:
        options["window_left"] = rng.randint(0, 120)
    if pos_encoding != "ALIBI" and rng.random() < 0.3:
        options["logits_soft_cap"] = round(rng.uniform(2.0, 50.0), 2)
    if rng.random() < 0.3:
        options["sm_scale"] = round(rng.uniform(0.02, 0.3), 4)
    if pos_encoding == "ROPE_LLAMA" and rng.random() < 0.5:
        options.update(rope_scale=rng.choice((0.5, 2.0)), rope_theta=rng.choice((1e4, 5e5)))
    if pos_encoding != "NONE":
        options["pos_encoding_mode"] = pos_encoding
    return options


def draw_case(seed: int) -> FuzzCase:
    rng = random.Random(seed)
    api = rng.choice(("single", "ragged", "paged", "paged"))
    dtype = rng.choice((torch.bfloat16, torch.float16))
    head_dim, head_dim_vo = rng.choice([(d, None) for d in HEAD_DIMS] + [(192, 128)])
    kv_dtype = rng.choice(FP8) if rng.random() < 0.2 else None
    pos_encoding = rng.choice(("NONE", "NONE", "NONE", "ROPE_LLAMA", "ALIBI"))
    if pos_encoding == "ROPE_LLAMA" and (kv_dtype is not None or head_dim_vo is not None):
        pos_encoding = "NONE"  # refused: fp8 caches and unequal head dims
    tiling = rng.choice(accepted_tilings(head_dim, kv_dtype is not None, head_dim_vo))
    qo_lens, kv_lens = _lengths(rng, api)
    kv_heads = rng.choice((1, 1, 2, 3))
    group = rng.choice((1, 2, 3, 4, 5, 8))
    mask = rng.choice(("none", "none", "none", "bool", "packed"))
    options = draw_score_options(rng, pos_encoding, may_be_causal=mask == "none")
    return FuzzCase(
        seed=seed,
        api=api,
        dtype=dtype,
        head_dim=head_dim,
        head_dim_vo=head_dim_vo,
        tiling=tiling,
        land_at_issue=rng.random() < 0.5,
        reverse=rng.random() < 0.5,
        pos_encoding=pos_encoding,
        kv_dtype=kv_dtype,
        qo_lens=qo_lens,
        kv_lens=kv_lens,
        heads=(kv_heads * group, kv_heads),
        page_size=rng.choice(PAGE_SIZES),
        layout=rng.choice(("NHD", "HND")),
        mask=mask,
        options=tuple(sorted(options.items())),
        max_ctas=rng.choice((1, 2, 6, 24, 132)),
        graph=api != "single" and rng.random() < 0.3,  # drawn after the rest: they stay
        nan=draw_nan(rng, mask == "none" and options.keys().isdisjoint(("causal", "window_left"))),
        views=rng.choice(("none", "none", "scattered", "pairs")),
    )


def _masks(case: FuzzCase, generator: torch.Generator) -> list[torch.Tensor] | None:
    """Each request's random [qo_len, kv_len] mask, with a row that sees nothing."""
    if case.mask == "none":
        return None
    masks = []
    for qo, kv in zip(case.qo_lens, case.kv_lens):
        m = torch.rand(qo, kv, generator=generator) < 0.6
        if qo > 1:
            m[qo // 2] = False
        masks.append(m)
    return masks


def _batch_mask_args(masks: list[torch.Tensor] | None, form: str) -> dict[str, torch.Tensor]:
    """plan()'s mask keyword: the flattened booleans, or each request's bits packed (little
    order) at the byte offset the reference reads them from, the running sum of
    qo_len * kv_len."""
    if masks is None:
        return {}
    if form == "bool":
        return dict(custom_mask=torch.cat([m.flatten() for m in masks]))
    offsets = _indptr([m.numel() for m in masks]).tolist()
    packed = torch.zeros(max(offsets[-1], 1), dtype=torch.uint8, device=masks[0].device)
    for start, m in zip(offsets, masks):
        if m.numel():
            bits = pack_bits_little(m)
            packed[start : start + bits.numel()] = bits
    return dict(packed_custom_mask=packed)


def _run_single(
    case: FuzzCase, place: Place, q, ks, vs, masks, scales
) -> tuple[torch.Tensor, torch.Tensor]:
    options = dict(case.options)
    if masks is not None:
        given = masks[0] if case.mask == "bool" else pack_bits_little(masks[0])
        options["custom_mask" if case.mask == "bool" else "packed_custom_mask"] = given
    return prefill_api.single_prefill_with_kv_cache(
        q,
        place("k", _to_layout(ks[0], case.layout)),
        place("v", _to_layout(vs[0], case.layout)),
        kv_layout=case.layout,
        return_lse=True,
        **options,
        **scales,
    )


def _workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(16 << 20, dtype=torch.uint8, device=device)


def _graph_wrapper(
    case: FuzzCase, first_qo: list[int], pages: int | None, device: torch.device
) -> Any:
    """A CUDA-graph-mode wrapper, paged over a page table of ``pages`` entries (None:
    ragged), its buffers poisoned with -7 (plan() must write what the kernel reads), the
    mask buffer large enough for the first plan's masks."""
    batch = len(case.qo_lens)

    def poisoned(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.full((n,), -7 if dtype == torch.int32 else 0xF9, dtype=dtype, device=device)

    mask_bytes = sum(q * k for q, k in zip(first_qo, case.kv_lens)) + 16
    buffers = dict(
        qo_indptr_buf=poisoned(batch + 1),
        custom_mask_buf=poisoned(mask_bytes, torch.uint8),
        mask_indptr_buf=poisoned(batch + 1),
    )
    if pages is not None:
        wrapper_type = prefill_api.BatchPrefillWithPagedKVCacheWrapper
        buffers.update(
            paged_kv_indptr_buf=poisoned(batch + 1),
            paged_kv_indices_buf=poisoned(pages + 3),
            paged_kv_last_page_len_buf=poisoned(batch),
        )
    else:
        wrapper_type = prefill_api.BatchPrefillWithRaggedKVCacheWrapper
        buffers.update(kv_indptr_buf=poisoned(batch + 1))
    return wrapper_type(_workspace(device), case.layout, use_cuda_graph=True, **buffers)


def _first_plan(case: FuzzCase) -> tuple[list[int], list[torch.Tensor] | None]:
    """The query lengths (each at least the case's) and masks of the plan a CUDA-graph
    wrapper gets first, which fixes the captured grid the case then runs with."""
    rng = random.Random(case.seed + 1)
    qo_lens = [q + rng.choice((0, 1, rng.randint(1, 60))) for q in case.qo_lens]
    if case.mask == "none":
        return qo_lens, None
    generator = torch.Generator().manual_seed(case.seed + 1)
    return qo_lens, [
        torch.rand(q, k, generator=generator) < 0.5 for q, k in zip(qo_lens, case.kv_lens)
    ]


def _run_batch(
    case: FuzzCase, place: Place, q, ks, vs, masks, scales
) -> tuple[torch.Tensor, torch.Tensor]:
    common = dict(
        head_dim_vo=case.head_dim_vo,
        q_data_type=case.dtype,
        kv_data_type=case.kv_dtype or case.dtype,
        **dict(case.options),
    )
    device = q.device
    plans = [(list(case.qo_lens), masks)]
    if case.graph:
        plans.insert(0, _first_plan(case))
    if case.api == "ragged":
        kv_indptr = _indptr(list(case.kv_lens))
        if case.graph:
            wrapper = _graph_wrapper(case, plans[0][0], None, device)
        else:
            wrapper = prefill_api.BatchPrefillWithRaggedKVCacheWrapper(
                _workspace(device), case.layout
            )
        for qo_lens, plan_masks in plans:
            wrapper.plan(
                _indptr(qo_lens),
                kv_indptr,
                *case.heads,
                case.head_dim,
                **common,
                **_batch_mask_args(plan_masks, case.mask),
            )
        token_dim = 1 if case.layout == "HND" else 0
        run_args: tuple = tuple(
            place(name, torch.cat([_to_layout(t, case.layout) for t in ts], dim=token_dim))
            for name, ts in (("k", ks), ("v", vs))
        )
    else:
        cache, indptr, indices, last = _paged_kv(ks, vs, case.page_size, case.layout, case.seed)
        if case.graph:
            wrapper = _graph_wrapper(case, plans[0][0], indices.numel(), device)
        else:
            wrapper = prefill_api.BatchPrefillWithPagedKVCacheWrapper(
                _workspace(device), case.layout
            )
        for qo_lens, plan_masks in plans:
            wrapper.plan(
                _indptr(qo_lens),
                indptr,
                indices,
                last,
                *case.heads,
                case.head_dim,
                case.page_size,
                **common,
                **_batch_mask_args(plan_masks, case.mask),
            )
        if isinstance(cache, torch.Tensor) and case.views == "pairs":
            cache = (cache[:, 0], cache[:, 1])
        if isinstance(cache, torch.Tensor):
            run_args = (place("paged_kv_cache", cache),)
        else:
            run_args = (tuple(place(f"paged_kv_cache[{i}]", c) for i, c in enumerate(cache)),)
    out_shape = (*q.shape[:2], case.head_dim_vo or case.head_dim)
    out = torch.full(out_shape, NAN, dtype=q.dtype, device=device)
    lse = torch.full(q.shape[:2], NAN, device=device)
    wrapper.run(q, *run_args, out=out, lse=lse, return_lse=True, **scales)
    return out, lse


def run_case(case: FuzzCase, device: str) -> None:
    """The case's call on ``device`` against the float64 reference; the module behind the
    APIs is the caller's (emulated on the CPU, built on a GPU)."""
    torch.manual_seed(case.seed)
    q, ks16, vs16 = _batch_data(
        list(case.qo_lens),
        list(case.kv_lens),
        *case.heads,
        case.head_dim,
        case.dtype,
        device=device,
        head_dim_vo=case.head_dim_vo,
    )
    ks, vs, k_ref, v_ref, scales = _cache_of(ks16, vs16, case.kv_dtype)
    masks = _masks(case, torch.Generator().manual_seed(case.seed))
    if masks is not None:
        masks = [m.to(device) for m in masks]
    where = plant_case_nan(case.nan, case.seed, q, (ks, k_ref), (vs, v_ref))
    inputs = Watched()
    place = placer(case.views, case.seed, inputs)
    run = _run_single if case.api == "single" else _run_batch
    out, lse = run(case, place, place("q", q), ks, vs, masks, scales)
    reference = _reference_args(dict(case.options))
    want = _expected_batch(q, list(case.qo_lens), k_ref, v_ref, masks, **reference)
    try:
        _check(out, lse, want, equal_nan=case.nan != "none")
        inputs.check()
    except AssertionError as err:
        raise AssertionError(f"{case!r} NaN: {where}\n{err}") from None


def schedule_for(max_ctas: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill's plan() (cascade's levels' too) schedules for a device of ``max_ctas`` CTAs."""
    monkeypatch.setattr(prefill_api, "_max_ctas", lambda *a: max_ctas)
    monkeypatch.setattr(prefill_api, "get_device_sm_count", lambda device: max_ctas)


def test_random_prefill_case(emulate, monkeypatch: pytest.MonkeyPatch, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(
        case.dtype,
        case.head_dim,
        case.tiling,
        case.land_at_issue,
        case.reverse,
        case.pos_encoding,
        case.kv_dtype,
        case.head_dim_vo,
    )
    schedule_for(case.max_ctas, monkeypatch)
    run_case(case, "cpu")


def gpu_case(seed: int) -> FuzzCase:
    """Seed's case as the GPU test runs it: at the module's default tiling (the emulator's
    schedule knobs mean nothing there)."""
    case = draw_case(seed)
    fp8 = case.kv_dtype is not None
    return dataclasses.replace(case, tiling=prefill_tiling(case.head_dim, fp8, case.head_dim_vo))


def gpu_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of the builds GPU_SEEDS' cases load (scripts/gpu_modules.py builds them)."""
    return [
        (
            "prefill",
            gen_prefill_module(
                c.dtype, c.head_dim, None, c.pos_encoding, c.kv_dtype, c.head_dim_vo
            ),
        )
        for c in map(draw_case, GPU_SEEDS)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", GPU_SEEDS)
def test_random_prefill_case_on_gpu(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    case = gpu_case(seed)
    schedule_for(case.max_ctas, monkeypatch)
    run_case(case, "cuda")


def test_draws_cover_every_knob() -> None:
    """The seeds CI runs are few; over a few hundred draws every value of every knob occurs,
    so a long campaign (--fuzz-seeds 0:300) reaches all of them."""
    cases = [draw_case(seed) for seed in range(300)]
    seen = {f.name: {repr(getattr(c, f.name)) for c in cases} for f in dataclasses.fields(FuzzCase)}
    assert seen["api"] == {"'single'", "'ragged'", "'paged'"}
    assert len(seen["dtype"]) == 2 and len(seen["head_dim"]) == len(HEAD_DIMS) + 1
    assert seen["pos_encoding"] == {"'NONE'", "'ROPE_LLAMA'", "'ALIBI'"}
    assert len(seen["kv_dtype"]) == 3 and seen["mask"] == {"'none'", "'bool'", "'packed'"}
    assert len(seen["page_size"]) == len(PAGE_SIZES) and len(seen["layout"]) == 2
    assert {name for c in cases for name, _ in c.options} == {
        "causal",
        "window_left",
        "logits_soft_cap",
        "sm_scale",
        "pos_encoding_mode",
        "rope_scale",
        "rope_theta",
    }
    assert seen["nan"] == {"'none'", "'key'", "'query'", "'value'"}
    scattered = [c for c in cases if c.views != "none"]
    assert {c.api for c in scattered} == {"single", "ragged", "paged"}
    assert len({c.kv_dtype for c in scattered}) == 3 and len(scattered) < len(cases)
    assert any(c.views == "pairs" and c.api == "paged" and not c.head_dim_vo for c in cases)
    assert any(0 in c.qo_lens for c in cases) and any(0 in c.kv_lens for c in cases)
    assert any(q > k > 0 for c in cases for q, k in zip(c.qo_lens, c.kv_lens))
    graphs = [c for c in cases if c.graph]
    assert {c.api for c in graphs} == {"ragged", "paged"} and {c.mask for c in graphs} == {
        "none",
        "bool",
        "packed",
    }
    tilings = {(c.head_dim, c.tiling) for c in cases}
    assert len(tilings) > 20
