"""The prefill kernel's own source, run on the CPU by the emulator (tests/emu), through the real
wrappers and planner, against the float64 reference: every accepted tiling on single, ragged
(custom mask) and paged (shuffled pages, NaN in every slot no request owns) prefill, float16, KV
split across CTAs and merged by the cascade kernel, page ids outside the cache, and fp8 KV
caches (prefill and tensor-core decode). Sizes are small: the emulator runs each CUDA thread as
a fiber. cp.async copies land when issued in some tests (a stage overwritten while a warp still
reads it shows) and when waited for in others (a read before its wait shows); some run a CTA's
threads last first (a shared write read before the barrier that publishes it shows). The same
cases at GPU sizes are in tests/ops/test_prefill_gpu.py."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import pytest
import torch

from flashinfer import cascade as cascade_api
from flashinfer import decode as decode_api
from flashinfer import prefill as prefill_api
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.jit.prefill import (
    DEFAULT_TILINGS,
    HEAD_DIMS,
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
)
from flashinfer.testing.reference import attention as reference_attention
from tests.conftest import REPO_ROOT
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.emu.profile import PROFILED
from tests.ops.test_decode import check_batch_decode, check_fp8_decode
from tests.ops.test_decode import check_nans_propagate as check_decode_nans_propagate
from tests.ops.test_prefill_gpu import (
    NAN,
    _batch_data,
    _cache_of,
    _check,
    _check_broken_pages,
    _check_out_of_range_page_ids,
    _expected_batch,
    _indptr,
    _paged_kv,
    _randn,
    _rising_keys,
    check_nans_propagate,
)

MAX_CTAS = 6  # a GPU this small splits a long KV over CTAs, so the merge kernel runs too

TILINGS = [(d, t) for d in HEAD_DIMS for t in accepted_tilings(d)]
TILING_IDS = [f"hd{d}-{t.name}" for d, t in TILINGS]


OUTPUTS = {  # each launch's outputs and partial-state scratch, NaN-filled before it
    "batch_prefill": ("out", "lse", "tmp_v", "tmp_lse"),
    "single_prefill": ("out", "lse", "tmp_v", "tmp_lse"),
}


@functools.cache
def _module(
    dtype: torch.dtype,
    head_dim: int,
    tiling: PrefillTiling,
    land_at_issue: bool,
    reverse: bool,
    pos_encoding: str,
    kv_dtype: torch.dtype | None,
    head_dim_vo: int | None,
) -> EmulatedModule:
    spec = gen_prefill_module(dtype, head_dim, tiling, pos_encoding, kv_dtype, head_dim_vo)
    return EmulatedModule(spec, OUTPUTS, land_at_issue, reverse)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedModule]]:
    """emulate(dtype, head_dim, tiling=default, land_at_issue=False, reverse=False,
    pos_encoding="NONE", kv_dtype=None, head_dim_vo=None): the wrappers' prefill module is
    then the emulated build (with that schedule, see tests/emu/engine.py, for that position
    encoding, KV cache dtype and V head_dim, which the wrappers must then ask for), on CPU
    tensors; plan() uploads its schedule for real."""

    def install(
        dtype: torch.dtype,
        head_dim: int,
        tiling: PrefillTiling | None = None,
        land_at_issue: bool = False,
        reverse: bool = False,
        pos_encoding: str = "NONE",
        kv_dtype: torch.dtype | None = None,
        head_dim_vo: int | None = None,
    ) -> EmulatedModule:
        tiling = tiling or DEFAULT_TILINGS[head_dim]
        module = _module(
            dtype, head_dim, tiling, land_at_issue, reverse, pos_encoding, kv_dtype, head_dim_vo
        )
        module.launches.clear()

        def get_prefill_module(
            d: torch.dtype,
            h: int,
            asked: str = "NONE",
            asked_kv: Any = None,
            asked_vo: int | None = None,
        ) -> EmulatedModule:
            assert asked == pos_encoding, f"the wrapper asked for the {asked} build"
            assert asked_kv in (kv_dtype or d, None), f"the wrapper asked for a {asked_kv} cache"
            assert (h, asked_vo or h) == (head_dim, head_dim_vo or head_dim), (h, asked_vo)
            return module

        monkeypatch.setattr(prefill_api, "get_prefill_module", get_prefill_module)
        return module

    monkeypatch.setattr(prefill_api, "_max_ctas", lambda *a: MAX_CTAS)
    monkeypatch.setattr(prefill_api, "get_device_sm_count", lambda device: MAX_CTAS)
    with on_cpu_tensors(monkeypatch, decode_api, prefill_api, cascade_api):
        yield install


def _workspace() -> torch.Tensor:
    return torch.empty(16 << 20, dtype=torch.uint8)


def _position_encoding(options: dict[str, Any]) -> dict[str, Any]:
    """The reference's arguments for the options' pos_encoding_mode."""
    mode = options.get("pos_encoding_mode", "NONE")
    if mode == "ROPE_LLAMA":
        return dict(rope=(options.get("rope_scale") or 1.0, options.get("rope_theta") or 1e4))
    return dict(alibi=True) if mode == "ALIBI" else {}


def _reference_args(options: dict[str, Any]) -> dict[str, Any]:
    """The reference's arguments for a prefill call with ``options`` (its keywords)."""
    reference = {k: v for k, v in options.items() if k in ("causal", "window_left", "sm_scale")}
    if "logits_soft_cap" in options:
        reference["soft_cap"] = options["logits_soft_cap"]
    reference.update(_position_encoding(options))
    return reference


def _single(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> None:
    out, lse = prefill_api.single_prefill_with_kv_cache(q, k, v, return_lse=True, **options)
    _check(out, lse, reference_attention(q, k, v, **_reference_args(options)))


def _paged(
    qo_lens: list[int],
    kv_lens: list[int],
    heads: tuple[int, int],
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype = torch.bfloat16,
    **options: Any,
) -> None:
    """Batch paged prefill, NaN-poisoned outputs, against the reference per request."""
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, head_dim, dtype, device="cpu")
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=len(qo_lens))
    wrapper = prefill_api.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout=layout)
    wrapper.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        *heads,
        head_dim,
        page_size,
        q_data_type=dtype,
        **options,
    )
    out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
    wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
    _check(out, lse, _expected_batch(q, qo_lens, ks, vs, **_reference_args(options)))


@pytest.mark.parametrize("head_dim,tiling", TILINGS, ids=TILING_IDS)
def test_single_prefill_on_every_tiling(emulate, head_dim: int, tiling: PrefillTiling) -> None:
    """Causal, fewer queries than keys, GQA 4: three query tiles, masked and skipped KV tiles."""
    emulate(torch.bfloat16, head_dim, tiling, reverse=True)
    torch.manual_seed(head_dim + tiling.tile_kv)
    q = _randn(70, 8, head_dim, dtype=torch.bfloat16, device="cpu")
    k, v = (_randn(200, 2, head_dim, dtype=torch.bfloat16, device="cpu") for _ in range(2))
    _single(q, k, v, causal=True)


@pytest.mark.parametrize("head_dim,tiling", TILINGS, ids=TILING_IDS)
def test_batch_paged_on_every_tiling(emulate, head_dim: int, tiling: PrefillTiling) -> None:
    """One-token, empty and multi-tile requests on shuffled HND pages of 16, causal with a
    soft cap, then a sliding window; copies land when issued."""
    emulate(torch.bfloat16, head_dim, tiling, land_at_issue=True)
    torch.manual_seed(head_dim * tiling.m_tiles)
    for options in (dict(causal=True, logits_soft_cap=20.0), dict(window_left=40)):
        _paged([1, 0, 37, 90], [33, 5, 150, 90], (4, 2), head_dim, 16, "HND", **options)


@pytest.mark.parametrize("head_dim,tiling", TILINGS, ids=TILING_IDS)
def test_batch_ragged_custom_mask_on_every_tiling(
    emulate, head_dim: int, tiling: PrefillTiling
) -> None:
    """A random boolean mask per request (rows that see no key included), ragged NHD KV;
    causal=True too, which a custom mask overrides (as in the reference)."""
    emulate(torch.bfloat16, head_dim, tiling, land_at_issue=True, reverse=True)
    torch.manual_seed(head_dim - tiling.tile_kv)
    qo_lens, kv_lens, heads = [3, 50, 20], [40, 100, 20], (2, 1)
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, head_dim, torch.bfloat16, device="cpu")
    masks = [torch.rand(m, n) < 0.6 for m, n in zip(qo_lens, kv_lens)]
    masks[1][7] = False
    wrapper = prefill_api.BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    wrapper.plan(
        _indptr(qo_lens),
        _indptr(kv_lens),
        *heads,
        head_dim,
        custom_mask=torch.cat([m.flatten() for m in masks]),
        causal=True,
        q_data_type=torch.bfloat16,
    )
    out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
    wrapper.run(q, torch.cat(ks), torch.cat(vs), out=out, lse=lse, return_lse=True)
    _check(out, lse, _expected_batch(q, qo_lens, ks, vs, masks))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_float16_single_and_paged(emulate, head_dim: int) -> None:
    """float16 on the default tiling: HND single prefill with a scale and a window, NHD
    pages of 1 token."""
    emulate(torch.float16, head_dim, reverse=True)
    torch.manual_seed(head_dim)
    q = _randn(40, 4, head_dim, dtype=torch.float16, device="cpu")
    k, v = (_randn(90, 4, head_dim, dtype=torch.float16, device="cpu") for _ in range(2))
    out, lse = prefill_api.single_prefill_with_kv_cache(
        q,
        k.transpose(0, 1).contiguous(),
        v.transpose(0, 1).contiguous(),
        kv_layout="HND",
        sm_scale=0.3,
        window_left=30,
        return_lse=True,
    )
    _check(out, lse, reference_attention(q, k, v, sm_scale=0.3, window_left=30))
    _paged([5, 17], [9, 40], (4, 4), head_dim, 1, "NHD", torch.float16, causal=True)


@pytest.mark.parametrize(
    "dtype,tiling",
    [
        (torch.bfloat16, PrefillTiling(1, 64)),
        (torch.float16, PrefillTiling(1, 64)),
        (torch.float16, PrefillTiling(1, 16)),
        (torch.bfloat16, PrefillTiling(2, 64)),
        (torch.bfloat16, PrefillTiling(1, 64, overlap=True)),
        (torch.float16, PrefillTiling(1, 64, overlap=True)),
    ],
    ids=["bf16-m1kv64", "f16-m1kv64", "f16-m1kv16", "bf16-m2kv64", "bf16-m1kv64p", "f16-m1kv64p"],
)
def test_scores_rising_past_the_running_max(
    emulate, dtype: torch.dtype, tiling: PrefillTiling
) -> None:
    """Keys whose scores creep up past a row's max and then jump (``_rising_keys``), on
    lazy-rescale tilings in both dtypes (the overlapping m1kv64p, whose O rescale follows its
    softmax, included) and on the eager m2kv64."""
    emulate(dtype, 128, tiling, reverse=True)
    torch.manual_seed(tiling.tile_kv + tiling.m_tiles)
    q = _randn(24, 4, 128, dtype=dtype, device="cpu")
    k, v = (_randn(200, 2, 128, dtype=dtype, device="cpu") for _ in range(2))
    k = _rising_keys(k, slice(130, 150))
    _single(q, k, v)
    _single(q, k, v, causal=True)


def test_long_kv_is_split_over_ctas_and_merged(emulate) -> None:
    """On a 6-CTA device a short query over 900 keys runs as several KV chunks whose partial
    states the cascade merge kernel combines; the batch planner splits likewise."""
    module = emulate(torch.bfloat16, 128)
    torch.manual_seed(5)
    q = _randn(5, 2, 128, dtype=torch.bfloat16, device="cpu")
    k, v = (_randn(900, 2, 128, dtype=torch.bfloat16, device="cpu") for _ in range(2))
    _single(q, k, v, logits_soft_cap=10.0)
    assert module.launches[-1]["num_chunks"] > 1
    _paged([3, 4], [700, 20], (2, 2), 128, 16, "NHD", causal=True)
    assert module.launches[-1]["grid_merge"] > 0


@pytest.mark.parametrize("head_dim", [64, 128])
def test_nans_propagate_through_split_and_merge(emulate, head_dim: int) -> None:
    """(tests/ops/test_prefill_gpu.py's check) A NaN key, query row or value: NaN out and
    LSE where the reference has them, through the chunks' merge."""
    module = emulate(torch.bfloat16, head_dim, reverse=head_dim == 64)
    check_nans_propagate(prefill_api, _workspace(), head_dim)
    assert module.launches[-1]["grid_merge"] > 0


def test_nans_propagate_through_tensor_core_decode(emulate) -> None:
    """tests/ops/test_decode.py's NaN check in tensor-core mode."""
    module = emulate(torch.bfloat16, 128, land_at_issue=True)
    check_decode_nans_propagate("cpu", 128, 3, use_tensor_cores=True)
    assert module.launches[-1]["grid_merge"] > 0


def test_cuda_graph_grid_past_the_plans_items(emulate) -> None:
    """In CUDA-graph mode the grid is the first plan's capacity: after a re-plan with fewer
    work items, split over KV chunks, the CTAs past the plan's count (their item words
    zeroed) write nothing, neither output rows nor the chunks' partial states."""
    module = emulate(torch.bfloat16, 128)
    torch.manual_seed(17)
    heads, page_size, batch = (4, 2), 16, 2
    num_pages = 64
    wrapper = prefill_api.BatchPrefillWithPagedKVCacheWrapper(
        _workspace(),
        use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32),
        paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32),
        paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32),
        paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32),
    )
    items = []
    for qo_lens, kv_lens in (([130, 90], [300, 200]), ([3, 1], [700, 9])):
        q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, 128, torch.bfloat16, device="cpu")
        cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "NHD", seed=len(items))
        wrapper.plan(
            _indptr(qo_lens),
            indptr,
            indices,
            last,
            *heads,
            128,
            page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
        wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
        _check(out, lse, _expected_batch(q, qo_lens, ks, vs, causal=True))
        launch = module.launches[-1]
        items.append((launch["grid_work"], wrapper._plan_info.schedule.num_work))
    (first_grid, first_items), (grid, planned) = items
    assert first_grid == grid >= first_items > planned and launch["grid_merge"] > 0


@pytest.mark.parametrize("causal", [False, True])
def test_out_of_range_page_ids_are_skipped_not_scored(emulate, causal: bool) -> None:
    """Page ids past the cache or negative: their tokens are not scored, never read."""
    emulate(torch.bfloat16, 128, land_at_issue=causal, reverse=not causal)
    torch.manual_seed(11)
    _check_out_of_range_page_ids(prefill_api, _workspace(), 128, causal)


LOOKAHEAD_TILINGS = [
    (DEFAULT_TILINGS[128], False),
    (DEFAULT_TILINGS[128], True),
    (PrefillTiling(1, 64), True),
    (PrefillTiling(2, 32, overlap=True), False),
]


@pytest.mark.parametrize(
    "tiling,land_at_issue",
    LOOKAHEAD_TILINGS,
    ids=[f"{t.name}-{'issue' if land else 'wait'}" for t, land in LOOKAHEAD_TILINGS],
)
def test_page_entries_looked_up_tiles_ahead(
    emulate, monkeypatch: pytest.MonkeyPatch, tiling: PrefillTiling, land_at_issue: bool
) -> None:
    """One CTA per KV head runs a request's 7 to 14 K/V tiles (a device of two CTAs: no KV
    split), over shuffled pages with ids outside the cache from the fourth tile on: the
    page-table entries and rows the loop carries for the tiles two to four ahead
    (prefill.cuh's Lookahead) are those tiles', and an entry outside the cache is skipped
    there as anywhere."""
    module = emulate(
        torch.bfloat16, 128, tiling, land_at_issue=land_at_issue, reverse=not land_at_issue
    )
    monkeypatch.setattr(prefill_api, "_max_ctas", lambda *a: 2)
    monkeypatch.setattr(prefill_api, "get_device_sm_count", lambda device: 2)
    torch.manual_seed(tiling.tile_kv + land_at_issue)
    _check_broken_pages(
        prefill_api,
        _workspace(),
        [6],
        [448],
        128,
        lambda pages: {(0, 12): pages, (0, 17): -1, (0, 21): pages + 100, (0, 27): 1 << 30},
        causal=False,
    )
    assert module.launches[-1]["grid_merge"] == 0  # one KV chunk: every tile in one CTA


@pytest.mark.parametrize("q_len", [1, 3])
def test_tensor_core_decode(emulate, q_len: int) -> None:
    """BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) runs the prefill kernel with
    each request's GQA group packed into the tile's rows: one token per request (an empty
    request among them), or q_len draft tokens seeing the keys causally; a soft cap."""
    emulate(torch.bfloat16, 128, land_at_issue=q_len > 1, reverse=q_len == 1)
    torch.manual_seed(q_len)
    kv_lens = [1, 40, 0, 17] if q_len == 1 else [q_len, 40, q_len + 1, 17]
    heads, page_size = (8, 2), 16
    qo_lens = [q_len] * len(kv_lens)
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, 128, torch.bfloat16, device="cpu")
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "NHD", seed=7)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(_workspace(), use_tensor_cores=True)
    wrapper.plan(
        indptr,
        indices,
        last,
        *heads,
        128,
        page_size,
        q_data_type=torch.bfloat16,
        logits_soft_cap=15.0,
        q_len_per_req=q_len,
    )
    out, lse = wrapper.run(q, cache, return_lse=True)
    _check(out, lse, _expected_batch(q, qo_lens, ks, vs, causal=True, soft_cap=15.0))


def test_tensor_core_batch_decode_check(emulate) -> None:
    """tests/ops/test_decode.py's batch decode check in tensor-core mode, as its GPU tests run
    it: empty, one-token and page-straddling requests; plain, soft-capped, windowed; the
    cache as a (k, v) pair."""
    emulate(torch.bfloat16, 128, reverse=True)
    lens, heads = [1, 17, 0, 300, 33], (8, 2)
    check_batch_decode("cpu", lens, *heads, 128, 16, "HND", torch.bfloat16, True, kv_tuple=True)


# (kv_dtype, dtype, head_dim, tiling, land_at_issue, reverse): the overlapping defaults at
# head_dim 128 and 256 (K a tile ahead of V: two tiles widened a step), head_dim 64 m1kv32
# (a token's 8 threads over its 4 fp8 chunks; a tile's 128 chunks over 256 threads), m2's
# 128 threads without overlap
FP8_CASES = [
    (torch.float8_e4m3fn, torch.bfloat16, 128, DEFAULT_TILINGS[128], False, True),
    (torch.float8_e5m2, torch.float16, 64, PrefillTiling(1, 32), True, False),
    (torch.float8_e4m3fn, torch.float16, 256, DEFAULT_TILINGS[256], True, True),
    (torch.float8_e5m2, torch.bfloat16, 128, PrefillTiling(2, 32), False, False),
]


@pytest.mark.parametrize(
    "kv_dtype,dtype,head_dim,tiling,land_at_issue,reverse",
    FP8_CASES,
    ids=[f"{str(c[0])[12:]}-{str(c[1])[6:]}-hd{c[2]}-{c[3].name}" for c in FP8_CASES],
)
def test_fp8_cache_in_prefill(
    emulate,
    kv_dtype: torch.dtype,
    dtype: torch.dtype,
    head_dim: int,
    tiling: PrefillTiling,
    land_at_issue: bool,
    reverse: bool,
) -> None:
    """An fp8 KV cache (plan's kv_data_type): tiles land as fp8 and widen into 16-bit rows in
    shared memory; k_scale and v_scale dequantize. Paged (shuffled HND pages of 16, fp8 NaN
    in every slot no request owns; causal), ragged (NHD, a window) and single prefill (a soft
    cap), into NaN-poisoned outputs, against the float64 reference on the dequantized keys
    and values."""
    module = emulate(dtype, head_dim, tiling, land_at_issue, reverse, kv_dtype=kv_dtype)
    torch.manual_seed(head_dim + tiling.tile_kv)
    qo_lens, kv_lens, heads = [1, 0, 37, 90], [33, 5, 150, 90], (4, 2)
    q, ks16, vs16 = _batch_data(qo_lens, kv_lens, *heads, head_dim, dtype, device="cpu")
    ks, vs, k_ref, v_ref, scales = _cache_of(ks16, vs16, kv_dtype)

    cache, indptr, indices, last = _paged_kv(ks, vs, 16, "HND", seed=3)
    paged = prefill_api.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout="HND")
    paged.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        *heads,
        head_dim,
        16,
        causal=True,
        q_data_type=dtype,
        kv_data_type=kv_dtype,
    )
    out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
    paged.run(q, cache, out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, causal=True))

    ragged = prefill_api.BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    ragged.plan(
        _indptr(qo_lens),
        _indptr(kv_lens),
        *heads,
        head_dim,
        window_left=40,
        q_data_type=dtype,
        kv_data_type=kv_dtype,
    )
    out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN)
    ragged.run(q, torch.cat(ks), torch.cat(vs), out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, window_left=40))

    q3 = q[sum(qo_lens[:3]) :]
    out, lse = prefill_api.single_prefill_with_kv_cache(
        q3, ks[3], vs[3], causal=True, logits_soft_cap=20.0, return_lse=True, **scales
    )
    _check(out, lse, reference_attention(q3, k_ref[3], v_ref[3], causal=True, soft_cap=20.0))
    assert {launch["k"].dtype for launch in module.launches} == {kv_dtype}


def test_fp8_cache_in_tensor_core_decode(emulate, monkeypatch) -> None:
    """use_tensor_cores=True over an fp8 cache runs the fp8 prefill build (as the reference
    runs its prefill kernel): tests/ops/test_decode.py's fp8 check (scales, NaN in unowned
    slots, a soft cap, a window, single decode) on it."""
    kv_dtype, dtype = torch.float8_e4m3fn, torch.bfloat16
    module = emulate(dtype, 128, kv_dtype=kv_dtype, reverse=True)
    monkeypatch.setattr(decode_api, "get_decode_module", None)  # the CUDA-core build is not run
    check_fp8_decode("cpu", kv_dtype, "NONE", [0, 1, 300, 45], 8, 2, 128, 16, "NHD", dtype, True)
    assert module.launches and {launch["k"].dtype for launch in module.launches} == {kv_dtype}


ROPE_TILINGS = [
    (128, DEFAULT_TILINGS[128], False),
    (128, PrefillTiling(1, 64), True),
    (128, PrefillTiling(2, 32, overlap=True), True),
    (64, DEFAULT_TILINGS[64], True),
    (256, DEFAULT_TILINGS[256], False),
]


@pytest.mark.parametrize(
    "head_dim,tiling,reverse",
    ROPE_TILINGS,
    ids=[f"hd{d}-{t.name}-{'reverse' if r else 'forward'}" for d, t, r in ROPE_TILINGS],
)
def test_rope_inside_attention(
    emulate, head_dim: int, tiling: PrefillTiling, reverse: bool
) -> None:
    """pos_encoding_mode="ROPE_LLAMA": the kernel rotates Q once and each K tile after it lands
    (queries at their bottom-right aligned positions, keys at their index in the request,
    positions running on across KV chunks), in the overlapped and the plain loop: a causal
    single prefill with fewer queries than keys, then a batch over shuffled pages whose long
    request is split over CTAs, with another rope_scale and rope_theta."""
    module = emulate(torch.bfloat16, head_dim, tiling, reverse=reverse, pos_encoding="ROPE_LLAMA")
    torch.manual_seed(head_dim + tiling.tile_kv)
    q = _randn(70, 8, head_dim, dtype=torch.bfloat16, device="cpu")
    k, v = (_randn(200, 2, head_dim, dtype=torch.bfloat16, device="cpu") for _ in range(2))
    _single(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA")
    options = dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e5)
    _paged([3, 1], [700, 65], (4, 2), head_dim, 16, "NHD", causal=True, **options)
    assert module.launches[-1]["grid_merge"] > 0  # the 700 keys ran as several chunks


def test_rope_queries_before_the_first_key(emulate) -> None:
    """With fewer keys than queries the bottom-right alignment puts a request's first
    queries at negative positions, which rotate backwards (seed 22 of the fuzz cases: the
    kernel summed the position as unsigned and rotated them by about 2^32 positions)."""
    emulate(torch.bfloat16, 64, pos_encoding="ROPE_LLAMA")
    torch.manual_seed(22)
    q = _randn(40, 6, 64, dtype=torch.bfloat16, device="cpu")
    k, v = (_randn(9, 2, 64, dtype=torch.bfloat16, device="cpu") for _ in range(2))
    _single(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    _single(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5)
    _paged([30, 2], [3, 50], (4, 1), 64, 8, "NHD", pos_encoding_mode="ROPE_LLAMA")


@pytest.mark.parametrize(
    "options,layout",
    [
        (dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=1e6), "HND"),
        (dict(pos_encoding_mode="ALIBI"), "NHD"),
    ],
    ids=["ROPE_LLAMA", "ALIBI"],
)
def test_position_encoding_tensor_core_decode(emulate, options: dict, layout: str) -> None:
    """Tensor-core decode with RoPE (each request's one query rotated at its last position)
    and ALiBi (the query is index 0, as in the CUDA-core kernel and the reference's decode)."""
    emulate(torch.bfloat16, 128, reverse=True, pos_encoding=options["pos_encoding_mode"])
    torch.manual_seed(23)
    kv_lens, heads, page_size = [1, 40, 0, 300], (8, 2), 16
    qo_lens = [1] * len(kv_lens)
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, 128, torch.bfloat16, device="cpu")
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=3)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(_workspace(), layout, use_tensor_cores=True)
    wrapper.plan(
        indptr, indices, last, *heads, 128, page_size, q_data_type=torch.bfloat16, **options
    )
    out, lse = wrapper.run(q, cache, return_lse=True)
    want = _expected_batch(q, qo_lens, ks, vs, **_position_encoding(options))
    _check(out, lse, want)


# (head_dim, tiling, reverse): the defaults, a plain and an overlapped m2 loop
ALIBI_TILINGS = [
    (128, DEFAULT_TILINGS[128], True),
    (64, PrefillTiling(2, 32), False),
    (256, DEFAULT_TILINGS[256], True),
    (128, PrefillTiling(2, 32, overlap=True), False),
]


@pytest.mark.parametrize(
    "head_dim,tiling,reverse",
    ALIBI_TILINGS,
    ids=[f"hd{d}-{t.name}-{'reverse' if r else 'forward'}" for d, t, r in ALIBI_TILINGS],
)
def test_alibi_inside_attention(
    emulate, head_dim: int, tiling: PrefillTiling, reverse: bool
) -> None:
    """pos_encoding_mode="ALIBI": each score gains its head's slope times (key index - query
    index), the query's index in its request as the reference counts it (so the LSE is the
    reference's): a causal single prefill with fewer queries than keys (GQA 4: each row of a
    tile its own head's slope), one that is not causal with a custom sm_scale, then a batch
    over shuffled pages whose long request is split over CTAs, windowed."""
    module = emulate(torch.bfloat16, head_dim, tiling, reverse=reverse, pos_encoding="ALIBI")
    torch.manual_seed(head_dim + tiling.tile_kv + 1)
    q = _randn(70, 8, head_dim, dtype=torch.bfloat16, device="cpu")
    k, v = (_randn(200, 2, head_dim, dtype=torch.bfloat16, device="cpu") for _ in range(2))
    _single(q, k, v, causal=True, pos_encoding_mode="ALIBI")
    _single(q[:9], k, v, sm_scale=0.05, pos_encoding_mode="ALIBI")
    options = dict(causal=True, window_left=300, pos_encoding_mode="ALIBI")
    _paged([3, 1], [700, 65], (4, 2), head_dim, 16, "NHD", **options)
    assert module.launches[-1]["grid_merge"] > 0  # the 700 keys ran as several chunks


# (dtype, tiling, kv_dtype, land_at_issue, reverse) at head_dim_qk 192, head_dim_vo 128: the
# overlapped default, m1's plain loop (a token's 8 threads over K's 24 chunks and V's 16),
# m2's 128 threads, and an fp8 cache (K's and V's rows widened at their own lengths)
MLA_CASES = [
    (torch.bfloat16, DEFAULT_TILINGS[192], None, False, True),
    (torch.float16, PrefillTiling(1, 32), None, True, False),
    (torch.bfloat16, PrefillTiling(2, 32), None, False, False),
    (torch.bfloat16, DEFAULT_TILINGS[192], torch.float8_e4m3fn, True, True),
]


@pytest.mark.parametrize(
    "dtype,tiling,kv_dtype,land_at_issue,reverse",
    MLA_CASES,
    ids=[f"{str(c[0])[6:]}-{c[1].name}-{str(c[2])[6:]}" for c in MLA_CASES],
)
def test_mla_head_dims(
    emulate,
    dtype: torch.dtype,
    tiling: PrefillTiling,
    kv_dtype: torch.dtype | None,
    land_at_issue: bool,
    reverse: bool,
) -> None:
    """q and k of head_dim 192, v and the output of 128 (DeepSeek's MLA prefill, which
    engines run through the ragged wrapper with head_dim_vo=128): a causal ragged batch (an
    empty request, one of 700 keys split in chunks of 256 and merged at 128 dims), the paged
    wrapper over a (k, v) pair of HND pages with NaN in every slot no request owns, and GQA 2
    single prefill with a window, into NaN-poisoned outputs against the float64 reference."""
    module = emulate(dtype, 192, tiling, land_at_issue, reverse, kv_dtype=kv_dtype, head_dim_vo=128)
    torch.manual_seed(tiling.tile_kv + tiling.m_tiles)
    qo_lens, kv_lens, heads = [5, 0, 60, 3], [5, 7, 90, 700], (4, 4)
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, 192, dtype, device="cpu", head_dim_vo=128)
    ks, vs, k_ref, v_ref, scales = _cache_of(ks, vs, kv_dtype)
    kv_data_type = kv_dtype or dtype
    out_shape = (q.shape[0], heads[0], 128)

    ragged = prefill_api.BatchPrefillWithRaggedKVCacheWrapper(_workspace())
    ragged.plan(
        _indptr(qo_lens),
        _indptr(kv_lens),
        *heads,
        192,
        head_dim_vo=128,
        causal=True,
        q_data_type=dtype,
        kv_data_type=kv_data_type,
        fixed_split_size=256,
    )
    out, lse = torch.full(out_shape, NAN, dtype=dtype), torch.full(q.shape[:2], NAN)
    ragged.run(q, torch.cat(ks), torch.cat(vs), out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, causal=True))
    assert module.launches[-1]["grid_merge"] > 0  # the 700 keys ran as several chunks
    out2 = ragged.run(q, torch.cat(ks), torch.cat(vs), **scales)
    assert out2.shape == out_shape and torch.equal(out2, out)

    cache, indptr, indices, last = _paged_kv(ks, vs, 16, "HND", seed=5)
    assert isinstance(cache, tuple)
    paged = prefill_api.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout="HND")
    paged.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        *heads,
        192,
        16,
        head_dim_vo=128,
        window_left=50,
        q_data_type=dtype,
        kv_data_type=kv_data_type,
    )
    out, lse = torch.full(out_shape, NAN, dtype=dtype), torch.full(q.shape[:2], NAN)
    paged.run(q, cache, out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, window_left=50))

    q2 = _randn(70, 8, 192, dtype=dtype, device="cpu")
    out, lse = prefill_api.single_prefill_with_kv_cache(
        q2, ks[2][:, :2], vs[2][:, :2], causal=True, window_left=30, return_lse=True, **scales
    )
    assert out.shape == (70, 8, 128)
    want = reference_attention(q2, k_ref[2][:, :2], v_ref[2][:, :2], causal=True, window_left=30)
    _check(out, lse, want)


# (head_dim, head_dim_vo, tiling, kv_dtype, pos_encoding): the defaults (a K/V token's copies
# by 4 threads), 2 and 8 threads a token, DeepSeek's 192/128, fp8 landing and widening at
# 64 (8 and 2 threads a token), 128 (rows of 8 fp8 chunks) and 192, RoPE rotating Q and K rows
# in shared memory
PROFILE_CASES = [
    *((d, d, DEFAULT_TILINGS[d], None, "NONE") for d in HEAD_DIMS),
    (128, 128, PrefillTiling(2, 64), None, "NONE"),
    (128, 128, PrefillTiling(1, 32), None, "NONE"),
    (192, 128, DEFAULT_TILINGS[192], None, "NONE"),
    (64, 64, PrefillTiling(1, 32), torch.float8_e5m2, "NONE"),
    (64, 64, PrefillTiling(2, 64), torch.float8_e4m3fn, "NONE"),
    (128, 128, DEFAULT_TILINGS[128], torch.float8_e4m3fn, "NONE"),
    (192, 128, DEFAULT_TILINGS[192], torch.float8_e4m3fn, "NONE"),
    (64, 64, DEFAULT_TILINGS[64], None, "ROPE_LLAMA"),
]


@PROFILED
@pytest.mark.parametrize(
    "head_dim,head_dim_vo,tiling,kv_dtype,pos_encoding",
    PROFILE_CASES,
    ids=[f"hd{c[0]}-{c[1]}-{c[2].name}-{str(c[3])[6:]}-{c[4]}" for c in PROFILE_CASES],
)
def test_shared_memory_without_bank_conflicts_and_kv_copies_of_whole_sectors(
    emulate,
    head_dim: int,
    head_dim_vo: int,
    tiling: PrefillTiling,
    kv_dtype: torch.dtype | None,
    pos_encoding: str,
) -> None:
    """The memory profile (tests/emu/profile.py) of a causal single prefill: every shared-
    memory access of the kernel (ldmatrix; Q's, K's and V's copies into their tiles; fp8's
    landing copies and widening; RoPE's rotation) takes the fewest wavefronts, the copies
    from global memory read whole 32-byte sectors (a GPU would read each twice otherwise),
    and the output's stores (8 bytes a lane; not the LSE's, one float a row) write whole
    sectors."""
    vo = head_dim_vo if head_dim_vo != head_dim else None
    module = emulate(
        torch.bfloat16,
        head_dim,
        tiling,
        pos_encoding=pos_encoding,
        kv_dtype=kv_dtype,
        head_dim_vo=vo,
    )
    torch.manual_seed(head_dim)
    q = _randn(90, 4, head_dim, dtype=torch.bfloat16, device="cpu")
    k16 = _randn(150, 2, head_dim, dtype=torch.bfloat16, device="cpu")
    v16 = _randn(150, 2, head_dim_vo, dtype=torch.bfloat16, device="cpu")
    (k,), (v,), (k_ref,), (v_ref,), scales = _cache_of([k16], [v16], kv_dtype)
    options = dict(causal=True, pos_encoding_mode=pos_encoding)
    with module.profiling() as profile:
        out, lse = prefill_api.single_prefill_with_kv_cache(
            q, k, v, return_lse=True, **options, **scales
        )
    _check(out, lse, reference_attention(q, k_ref, v_ref, **_reference_args(options)))
    files = ("prefill.cuh", "attention_rope.cuh")
    copies = ("ldmatrix", "cp.async to shared", "cp.async from global")
    assert {s.kind for f in files for s in profile.in_file(f)} >= set(copies)
    kinds = ("shared load", "shared store", *copies)
    assert not profile.excessive(files, kinds), profile.table()
    source = (REPO_ROOT / "include/flashinfer/prefill.cuh").read_text().splitlines()
    lse = {
        f"include/flashinfer/prefill.cuh:{n}" for n, line in enumerate(source, 1) if "lse[" in line
    }
    stores = [s for s in profile.in_file("prefill.cuh") if s.kind == "global store"]
    output = [s for s in stores if s.where not in lse]
    assert output and all(s.cost == s.ideal for s in output), profile.table()
