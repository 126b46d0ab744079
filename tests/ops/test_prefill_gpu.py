"""Prefill attention on the GPU against a float64 torch reference: single prefill, batch
prefill over ragged and paged KV (empty requests, shuffled pages, NaN in every cache slot
no request owns), custom masks, long KV that the schedule splits and merges, and CUDA-graph
replay after re-planning. Outputs are poisoned with NaN before each call, so a row the
kernel fails to write shows up as NaN."""

from __future__ import annotations

import functools
import importlib
import itertools
from types import ModuleType
from typing import Any, Callable

import pytest
import torch

from flashinfer.testing.reference import attention as reference_attention
from tests.ops.attention_error import assert_output_close
from tests.ops.nan_inputs import assert_nan_where

NAN = float("nan")
LSE_TOLERANCE = dict(atol=1e-2, rtol=1e-3)  # base-2 LSE, float32 from fp16/bf16 inputs


# The kernel tilings not chosen by default, per head_dim (docs/attention.md): every test
# runs on the default modules and on these, so a tiling is known correct before a benchmark
# makes it the default.
OTHER_TILINGS = {64: (2, 32), 128: (2, 32), 192: (2, 32), 256: (1, 32)}
_other_modules: dict[tuple[Any, int, str, Any, Any], Any] = {}


@pytest.fixture(params=["default", "other"], ids=["default-tiling", "other-tiling"])
def prefill(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """flashinfer.prefill, imported only when a GPU test runs (collection must not need it);
    with "other", its modules are OTHER_TILINGS' builds."""
    module = importlib.import_module("flashinfer.prefill")
    if request.param == "other":
        from flashinfer.jit.prefill import PrefillTiling, gen_prefill_module

        def get_prefill_module(
            dtype: Any,
            head_dim: int,
            pos_encoding: str = "NONE",
            kv_dtype: Any = None,
            head_dim_vo: Any = None,
        ) -> Any:
            key = (dtype, head_dim, pos_encoding, kv_dtype, head_dim_vo)
            if key not in _other_modules:
                tiling = PrefillTiling(*OTHER_TILINGS[head_dim])
                spec = gen_prefill_module(
                    dtype, head_dim, tiling, pos_encoding, kv_dtype, head_dim_vo
                )
                _other_modules[key] = spec.build_and_load()
            return _other_modules[key]

        monkeypatch.setattr(module, "get_prefill_module", get_prefill_module)
        _fresh_occupancy(monkeypatch, module)
    return module


def _fresh_occupancy(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> None:
    """plan()'s cache of CTAs a device holds (_max_ctas, keyed without the tiling) emptied
    for a test on other-tiling modules, so neither tiling plans with the other's occupancy."""
    monkeypatch.setattr(module, "_max_ctas", functools.cache(module._max_ctas.__wrapped__))


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-2, rtol=1e-2)


def _check(
    out: torch.Tensor,
    lse: torch.Tensor,
    want: tuple[torch.Tensor, torch.Tensor],
    equal_nan: bool = False,
) -> None:
    """``out`` and ``lse`` match the reference (``equal_nan``: NaN exactly where it is),
    element by element and, for ``out``, by the relative norm of its error."""
    assert_output_close(out, want[0], equal_nan=equal_nan, **_tolerance(out.dtype))
    torch.testing.assert_close(lse.double(), want[1], equal_nan=equal_nan, **LSE_TOLERANCE)


def _randn(*shape: int, dtype: torch.dtype, device: str = "cuda") -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device)


def _rising_keys(k: torch.Tensor, jump: slice) -> torch.Tensor:
    """``k`` [tokens, heads, dim] with norms growing from 1x to 3x along the sequence, so a
    row's score max creeps up tile after tile by less than the kernel's lag (kept stale:
    exponentials up to 2^8, which fp16's P must hold), and the tokens of ``jump`` 6x stronger
    still (a jump of tens of log2 units: O and the sums rescale)."""
    growth = torch.linspace(1.0, 3.0, k.shape[0], device=k.device)
    growth[jump] *= 6.0
    return (k.float() * growth[:, None, None]).to(k.dtype)


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, NAN)


def _leave_nan_in_freed_blocks(*shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]) -> None:
    """single_prefill allocates its own outputs: free NaN-filled blocks of their sizes first,
    so torch's caching allocator (best effort) hands them out and an unwritten row reads NaN."""
    blocks = [
        torch.full(shape, NAN, dtype=dtype, device="cuda") for shape, dtype in shapes_and_dtypes
    ]
    del blocks


def _to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """[tokens, Hk, D] (NHD) as the kernel takes it for ``layout``: HND is [Hk, tokens, D]."""
    return t.transpose(0, 1).contiguous() if layout == "HND" else t


def _indptr(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def pack_bits_little(bits: torch.Tensor) -> torch.Tensor:
    """``bits`` flattened and packed 8 to a byte, the first in the least significant bit
    (numpy's packbits with bitorder="little"), the last byte zero-padded."""
    flat = bits.flatten().to(torch.int32)
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)]).view(-1, 8)
    weights = 1 << torch.arange(8, dtype=torch.int32, device=bits.device)
    return (flat * weights).sum(dim=1).to(torch.uint8)


def _expected_batch(
    q: torch.Tensor,
    qo_lens: list[int],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    masks: list[torch.Tensor] | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of each request (q rows by qo_lens), concatenated."""
    outs, lses = [], []
    starts = itertools.accumulate([0, *qo_lens])
    for b, (start, n) in enumerate(zip(starts, qo_lens)):
        mask = None if masks is None else masks[b]
        out, lse = reference_attention(q[start : start + n], ks[b], vs[b], mask=mask, **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


# -- paged caches ----------------------------------------------------------------------------------


def _new_cache(
    num_pages: int,
    page_size: int,
    kv_heads: int,
    head_dim: int,
    layout: str,
    dtype: torch.dtype,
    device: torch.device | str = "cuda",
) -> torch.Tensor:
    """The 5-D form, [num_pages, 2, page_size, Hk, D] (NHD) or [num_pages, 2, Hk, page_size, D]."""
    page = (page_size, kv_heads, head_dim) if layout == "NHD" else (kv_heads, page_size, head_dim)
    return torch.empty(num_pages, 2, *page, dtype=dtype, device=device)


def _page_table(
    kv_lens: list[int], page_size: int, num_pages: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr, indices, last_page_len), int32 on the host, over shuffled pages of
    [0, num_pages); a request with no KV has no pages and last_page_len 1."""
    pages = [-(-n // page_size) for n in kv_lens]
    indices = torch.randperm(num_pages, generator=generator)[: sum(pages)].to(torch.int32)
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 1 for n, p in zip(kv_lens, pages)], dtype=torch.int32
    )
    return _indptr(pages), indices, last


def _write_pages(
    cache: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    indptr: torch.Tensor,
    indices: torch.Tensor,
    page_size: int,
    layout: str,
) -> None:
    """NaN everywhere, then request b's token t at slot t % page_size of its page t // page_size
    (``cache`` the 5-D form or a (k, v) pair of 4-D caches)."""
    parts = (cache[:, 0], cache[:, 1]) if isinstance(cache, torch.Tensor) else cache
    for part in parts:
        part.fill_(NAN)
    for b, (k, v) in enumerate(zip(ks, vs)):
        position = torch.arange(k.shape[0], device=parts[0].device)
        pages = indices[indptr[b] : indptr[b + 1]].to(parts[0].device).long()
        pages = pages[position // page_size]
        slots = position % page_size
        for part, values in zip(parts, (k, v)):
            if layout == "NHD":
                part[pages, slots] = values
            else:
                part[pages, :, slots] = values


def _paged_kv(
    ks: list[torch.Tensor], vs: list[torch.Tensor], page_size: int, layout: str, seed: int
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cache, indptr, indices, last_page_len) holding ks/vs, with 5 spare pages: the 5-D
    cache, or a (k, v) pair of 4-D ones (each a view of every other page of its own 5-D
    tensor) when the values' head_dim differs from the keys'."""
    kv_lens = [k.shape[0] for k in ks]
    num_pages = sum(-(-n // page_size) for n in kv_lens) + 5
    indptr, indices, last = _page_table(
        kv_lens, page_size, num_pages, torch.Generator().manual_seed(seed)
    )
    kv_heads, dims = ks[0].shape[1], (ks[0].shape[2], vs[0].shape[2])
    args = (ks[0].dtype, ks[0].device)
    if dims[0] == dims[1]:
        cache = _new_cache(num_pages, page_size, kv_heads, dims[0], layout, *args)
    else:
        cache = tuple(
            _new_cache(num_pages, page_size, kv_heads, dim, layout, *args)[:, 0] for dim in dims
        )
    _write_pages(cache, ks, vs, indptr, indices, page_size, layout)
    return cache, indptr, indices, last


def _break_page_ids(
    indices: torch.Tensor, indptr: torch.Tensor, bad: dict[tuple[int, int], int]
) -> None:
    """bad[(request, page)] = an id outside the cache, written into the request's page table."""
    for (request, page), page_id in bad.items():
        indices[indptr[request] + page] = page_id


def _on_broken_pages(
    request: int,
    kv_len: int,
    page_size: int,
    bad: dict[tuple[int, int], int],
    device: str = "cuda",
) -> torch.Tensor:
    """Which of the request's tokens sit on a page _break_page_ids broke (never scored)."""
    return torch.tensor(
        [(request, j // page_size) in bad for j in range(kv_len)], dtype=torch.bool, device=device
    )


def _kv_data(
    kv_lens: list[int],
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str = "cuda",
    head_dim_vo: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each request's keys [kv_len, Hk, D] and values [kv_len, Hk, head_dim_vo or D]."""
    dim_vo = head_dim_vo or head_dim
    ks = [_randn(n, kv_heads, head_dim, dtype=dtype, device=device) for n in kv_lens]
    vs = [_randn(n, kv_heads, dim_vo, dtype=dtype, device=device) for n in kv_lens]
    return ks, vs


def _batch_data(
    qo_lens: list[int],
    kv_lens: list[int],
    qo_heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str = "cuda",
    head_dim_vo: int | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """q [sum(qo_lens), Hq, D] and each request's keys and values (of head_dim_vo)."""
    return (
        _randn(sum(qo_lens), qo_heads, head_dim, dtype=dtype, device=device),
        *_kv_data(kv_lens, kv_heads, head_dim, dtype, device, head_dim_vo),
    )


def _workspace() -> torch.Tensor:
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


# -- single prefill ----------------------------------------------------------------------------

SINGLE_CASES = [  # (qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype)
    (1, 1, 8, 8, 128, "NHD", torch.float16),
    (1, 777, 32, 8, 128, "HND", torch.bfloat16),
    (7, 7, 4, 4, 64, "NHD", torch.bfloat16),
    (63, 200, 32, 4, 64, "HND", torch.float16),
    (64, 64, 16, 2, 256, "NHD", torch.bfloat16),
    (65, 1000, 8, 1, 128, "NHD", torch.float16),
    (300, 128, 8, 8, 128, "HND", torch.bfloat16),  # causal: rows 0..171 see no key
    (1000, 1000, 32, 8, 128, "NHD", torch.bfloat16),
    (517, 2049, 16, 4, 256, "HND", torch.float16),
    (2048, 2048, 16, 16, 64, "NHD", torch.float16),
    (4000, 4096, 32, 8, 128, "HND", torch.float16),
    (4096, 4096, 8, 1, 256, "NHD", torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("qo_len,kv_len,qo_heads,kv_heads,head_dim,layout,dtype", SINGLE_CASES)
def test_single_prefill_matches_the_reference(
    prefill, qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    torch.manual_seed(qo_len * 7919 + kv_len)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    for causal in (False, True):
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(
            q,
            _to_layout(k, layout),
            _to_layout(v, layout),
            causal=causal,
            kv_layout=layout,
            return_lse=True,
        )
        assert out.shape == q.shape and out.dtype == dtype
        assert lse.shape == (qo_len, qo_heads) and lse.dtype == torch.float32
        _check(out, lse, reference_attention(q, k, v, causal=causal))


VARIANTS = [  # (causal, sm_scale, logits_soft_cap, window_left)
    (True, None, None, 0),  # each query sees its diagonal key only
    (True, None, None, 127),
    (False, None, None, 50),  # no upper bound: keys from diagonal - 50 to the end
    (True, 0.05, 30.0, -1),
    (False, 0.3, 5.0, 300),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_len,kv_len,qo_heads,kv_heads,head_dim,layout,dtype",
    [
        (100, 900, 32, 8, 128, "NHD", torch.bfloat16),
        (513, 513, 8, 2, 64, "HND", torch.float16),
        (37, 2000, 16, 16, 256, "NHD", torch.bfloat16),
    ],
)
def test_single_prefill_window_soft_cap_scale_and_lse(
    prefill, qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    torch.manual_seed(kv_len)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    kk, vv = _to_layout(k, layout), _to_layout(v, layout)
    for causal, sm_scale, cap, window in VARIANTS:
        options = dict(
            causal=causal,
            kv_layout=layout,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
        )
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(q, kk, vv, return_lse=True, **options)
        _check(
            out,
            lse,
            reference_attention(
                q, k, v, causal=causal, window_left=window, soft_cap=cap, sm_scale=sm_scale
            ),
        )
        _leave_nan_in_freed_blocks((q.shape, dtype))
        plain = prefill.single_prefill_with_kv_cache(q, kk, vv, **options)
        assert isinstance(plain, torch.Tensor) and torch.equal(plain, out)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_len,kv_len,qo_heads,kv_heads,head_dim,layout,dtype",
    [
        (77, 301, 16, 4, 128, "NHD", torch.bfloat16),
        (128, 128, 8, 8, 64, "HND", torch.float16),
        (3, 1000, 32, 8, 256, "NHD", torch.float16),
    ],
)
def test_single_prefill_custom_mask_bool_and_packed(
    prefill, qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    """A custom mask replaces causal (passed True here and ignored, as in the reference);
    window_left still applies; a row masked out whole gives 0 and lse -inf."""
    from flashinfer import quantization

    torch.manual_seed(qo_len)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    kk, vv = _to_layout(k, layout), _to_layout(v, layout)
    mask = torch.rand(qo_len, kv_len, device="cuda") > 0.5
    mask[qo_len // 2] = False
    packed = pack_bits_little(mask)
    assert torch.equal(quantization.packbits(mask.flatten(), bitorder="little"), packed)
    for form, window in itertools.product(("bool", "packed"), (-1, 40)):
        given = dict(custom_mask=mask) if form == "bool" else dict(packed_custom_mask=packed)
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(
            q, kk, vv, causal=True, kv_layout=layout, window_left=window, return_lse=True, **given
        )
        _check(out, lse, reference_attention(q, k, v, window_left=window, mask=mask))


@pytest.mark.gpu
@pytest.mark.parametrize("qo_len,kv_len,causal", [(16384, 16384, True), (128, 16384, False)])
def test_single_prefill_long_sequences(prefill, qo_len: int, kv_len: int, causal: bool) -> None:
    """16k tokens; with few query rows the KV is split across CTAs and merged."""
    dtype, qo_heads, kv_heads, head_dim = torch.bfloat16, 32, 8, 128
    torch.manual_seed(1)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
    out, lse = prefill.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True)
    _check(out, lse, reference_attention(q, k, v, causal=causal))


# -- batch prefill: ragged KV --------------------------------------------------------------------

RAGGED_CASES = [  # (qo_lens, kv_lens, qo_heads, kv_heads, head_dim, layout, dtype)
    # qo 0 with kv 64, an empty request, qo 300 with kv 0 (rows: 0 and lse -inf)
    ([5, 0, 100, 0, 1, 300], [5, 64, 250, 0, 1000, 0], 32, 8, 128, "NHD", torch.bfloat16),
    ([1, 17, 64, 65, 129], [1, 17, 64, 1000, 129], 8, 8, 64, "HND", torch.float16),
    ([512, 1024], [2048, 1024], 16, 2, 256, "NHD", torch.float16),
    ([33, 7, 700], [900, 7, 700], 32, 4, 128, "HND", torch.bfloat16),
    ([200, 3], [100, 3000], 16, 4, 64, "NHD", torch.bfloat16),  # qo > kv in request 0
    # odd GQA groups: a token's rows straddle the warps' 16- and 32-row boundaries
    ([45, 1, 130], [45, 500, 300], 9, 3, 128, "NHD", torch.bfloat16),
    ([19, 64], [700, 64], 10, 2, 64, "HND", torch.float16),
]

BATCH_VARIANTS = [  # (causal, sm_scale, logits_soft_cap, window_left)
    (False, None, None, -1),
    (True, None, None, -1),
    (True, 0.1, 20.0, 63),
]


def _check_ragged_variants(
    prefill: ModuleType,
    q: torch.Tensor,
    qo_lens: list[int],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    layout: str,
    refs: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    scales: dict | None = None,
) -> None:
    """The ragged wrapper over each request's keys and values (in ``layout``; the values'
    head_dim may differ), planned in each of BATCH_VARIANTS, into NaN-poisoned outputs,
    against the reference on ``refs``' keys and values (default: ``ks``/``vs``), ``scales``
    passed to run()."""
    k_ref, v_ref = refs or (ks, vs)
    kv_heads, head_dim, head_dim_vo = ks[0].shape[1], q.shape[2], vs[0].shape[2]
    kv_lens = [t.shape[0] for t in ks]
    k, v = _to_layout(torch.cat(ks), layout), _to_layout(torch.cat(vs), layout)
    wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace(), kv_layout=layout)
    for causal, sm_scale, cap, window in BATCH_VARIANTS:
        wrapper.plan(
            _indptr(qo_lens).cuda(),
            _indptr(kv_lens).cuda(),
            q.shape[1],
            kv_heads,
            head_dim,
            head_dim_vo=head_dim_vo,
            causal=causal,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
            q_data_type=q.dtype,
            kv_data_type=ks[0].dtype,
        )
        out = torch.full((*q.shape[:2], head_dim_vo), NAN, dtype=q.dtype, device="cuda")
        lse = torch.full(q.shape[:2], NAN, device="cuda")
        got, got_lse = wrapper.run(q, k, v, out=out, lse=lse, return_lse=True, **(scales or {}))
        assert got is out and got_lse is lse
        options = dict(causal=causal, window_left=window, soft_cap=cap, sm_scale=sm_scale)
        _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, **options))


@pytest.mark.gpu
@pytest.mark.parametrize("qo_lens,kv_lens,qo_heads,kv_heads,head_dim,layout,dtype", RAGGED_CASES)
def test_batch_ragged_prefill_matches_the_reference(
    prefill, qo_lens, kv_lens, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    torch.manual_seed(len(qo_lens))
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    _check_ragged_variants(prefill, q, qo_lens, ks, vs, layout)


# -- batch prefill: paged KV ---------------------------------------------------------------------

PAGED_CASES = [  # (qo_lens, kv_lens, page_size, qo_heads, kv_heads, head_dim, layout, dtype)
    ([3, 50, 1, 200], [40, 50, 700, 333], 16, 32, 8, 128, "NHD", torch.bfloat16),
    ([1, 17, 30], [1, 100, 9], 1, 8, 8, 64, "HND", torch.float16),  # qo > kv in request 2
    ([128, 0, 60], [1000, 33, 0], 16, 16, 2, 256, "HND", torch.bfloat16),
    ([64, 513], [64, 513], 1, 32, 4, 128, "NHD", torch.float16),
    ([100, 1, 9], [2500, 31, 16], 16, 8, 1, 64, "NHD", torch.bfloat16),
    ([256, 40], [256, 1111], 16, 16, 4, 256, "NHD", torch.float16),
    ([20, 1], [3000, 4095], 16, 32, 8, 128, "HND", torch.float16),
    ([5, 90], [77, 90], 1, 8, 2, 64, "NHD", torch.bfloat16),
    # page sizes that are not powers of two (the kernel divides by a multiply-high), and 64
    ([7, 70, 1], [300, 70, 129], 7, 16, 4, 128, "NHD", torch.bfloat16),
    ([12, 40], [100, 41], 3, 8, 8, 256, "HND", torch.float16),
    ([33, 2, 64], [2000, 65, 64], 64, 8, 2, 64, "HND", torch.float16),
    ([50, 9], [130, 400], 5, 14, 2, 256, "NHD", torch.bfloat16),  # GQA group 7
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_lens,kv_lens,page_size,qo_heads,kv_heads,head_dim,layout,dtype", PAGED_CASES
)
def test_batch_paged_prefill_matches_the_reference(
    prefill, qo_lens, kv_lens, page_size, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    """Shuffled pages; unused pages and the tail of each last page hold NaN, which the
    kernel must never read into a score. The 5-D cache and a (k, v) pair give the same
    bits."""
    torch.manual_seed(sum(kv_lens))
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=len(qo_lens))
    pair = (cache[:, 0].contiguous(), cache[:, 1].contiguous())
    wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout=layout)
    for causal, sm_scale, cap, window in BATCH_VARIANTS:
        wrapper.plan(
            _indptr(qo_lens),
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            causal=causal,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
            q_data_type=dtype,
        )
        out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device="cuda")
        got, got_lse = wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
        assert got is out and got_lse is lse
        _check(
            out,
            lse,
            _expected_batch(
                q,
                qo_lens,
                ks,
                vs,
                causal=causal,
                window_left=window,
                soft_cap=cap,
                sm_scale=sm_scale,
            ),
        )
        assert torch.equal(wrapper.run(q, pair), out)


def _check_broken_pages(
    module: ModuleType,
    workspace: torch.Tensor,
    qo_lens: list[int],
    kv_lens: list[int],
    head_dim: int,
    bad_ids: Callable[[int], dict[tuple[int, int], int]],
    causal: bool,
) -> None:
    """Batch paged prefill (bf16, 8 query / 2 KV heads, shuffled NHD pages of 16, on the
    workspace's device) after _break_page_ids wrote bad_ids(pages in the cache)'s ids outside
    the cache: their tokens are not scored (as decode skips them), so the result is
    attention over the other tokens, causal positions unchanged."""
    device, dtype, qo_heads, kv_heads, page_size = workspace.device.type, torch.bfloat16, 8, 2, 16
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype, device)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "NHD", seed=3)
    bad = bad_ids(cache.shape[0])
    _break_page_ids(indices, indptr, bad)
    masks = []
    for request, (m, n) in enumerate(zip(qo_lens, kv_lens)):
        rows, cols = torch.arange(m, device=device)[:, None], torch.arange(n, device=device)
        everything = torch.ones(m, n, dtype=torch.bool, device=device)
        visible = cols <= rows + n - m if causal else everything
        masks.append(visible & ~_on_broken_pages(request, n, page_size, bad, device=device))
    wrapper = module.BatchPrefillWithPagedKVCacheWrapper(workspace)
    wrapper.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        qo_heads,
        kv_heads,
        head_dim,
        page_size,
        causal=causal,
        q_data_type=dtype,
    )
    out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device=device)
    wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
    _check(out, lse, _expected_batch(q, qo_lens, ks, vs, masks))


def _check_out_of_range_page_ids(
    module: ModuleType, workspace: torch.Tensor, head_dim: int, causal: bool
) -> None:
    """_check_broken_pages on three requests with a page id past the cache, one at its size,
    a negative one and a huge one (the GPU and the emulated test's case)."""
    _check_broken_pages(
        module,
        workspace,
        [5, 40, 1],
        [70, 100, 33],
        head_dim,
        lambda pages: {(0, 1): pages + 7, (1, 0): -3, (1, 5): pages, (2, 2): 1 << 30},
        causal,
    )


def check_nans_propagate(module: ModuleType, workspace: torch.Tensor, head_dim: int) -> None:
    """A NaN input gives NaN exactly where the float64 reference has it, and the reference
    elsewhere, as in the reference library (LSE m + log2(d), NaN when d is): never an LSE of
    -inf (a state over no keys, which a merge drops) nor zeros. Batch paged causal prefill
    (bf16, 4 query / 2 KV heads, pages of 16, KV split into chunks of 8 pages) of requests
    40 x 700 and 7 x 60 tokens:
    - request 0's key 680 of KV head 0 has a NaN: rows 20-39 (which see it) of heads 0-1 are
      NaN, out and LSE, through a chunk's partial state the merge must keep; rows 0-19 skip
      it (masked in their tile) and stay finite;
    - request 1's query row 2, head 3, is NaN: all its scores;
    - request 1's value 3 of KV head 1 has a NaN at dim 9 (every row sees it): that dim of
      heads 2-3 is NaN, their LSE finite.
    Outputs are poisoned with -7, so a NaN is the kernel's."""
    device, dtype, page_size, heads = workspace.device.type, torch.bfloat16, 16, (4, 2)
    qo_lens, kv_lens = [40, 7], [700, 60]
    q, ks, vs = _batch_data(qo_lens, kv_lens, *heads, head_dim, dtype, device)
    ks[0][680, 0, 5] = NAN
    q[40 + 2, 3] = NAN
    vs[1][3, 1, 9] = NAN
    nan_out = torch.zeros(q.shape, dtype=torch.bool)
    nan_out[20:40, :2] = True
    nan_out[40:, 2:, 9] = True
    nan_out[42, 3] = True
    nan_lse = nan_out.all(dim=-1)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "NHD", seed=5)
    wrapper = module.BatchPrefillWithPagedKVCacheWrapper(workspace)
    wrapper.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        *heads,
        head_dim,
        page_size,
        causal=True,
        q_data_type=dtype,
        fixed_split_size=8,
    )
    out, lse = torch.full_like(q, -7.0), torch.full(q.shape[:2], -7.0, device=device)
    wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
    want, want_lse = _expected_batch(q, qo_lens, ks, vs, causal=True)
    assert_nan_where("the reference's out", want, nan_out)
    assert_nan_where("out", out, nan_out)
    assert_nan_where("lse", lse, nan_lse)
    torch.testing.assert_close(out.double(), want, equal_nan=True, **_tolerance(dtype))
    torch.testing.assert_close(lse.double(), want_lse, equal_nan=True, **LSE_TOLERANCE)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_nans_propagate_through_split_and_merge(prefill, head_dim: int) -> None:
    torch.manual_seed(head_dim)
    check_nans_propagate(prefill, _workspace(), head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,causal", [(64, False), (128, True), (256, True)])
def test_out_of_range_page_ids_are_skipped_not_scored(prefill, head_dim: int, causal: bool) -> None:
    """A page id past the cache or negative: its tokens are not scored."""
    torch.manual_seed(head_dim)
    _check_out_of_range_page_ids(prefill, _workspace(), head_dim, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,causal", [(64, True), (128, False), (128, True), (256, False)])
def test_page_entries_looked_up_tiles_ahead(
    prefill, monkeypatch: pytest.MonkeyPatch, head_dim: int, causal: bool
) -> None:
    """One CTA per query tile and KV head walks all of a request's 47 to 188 K/V tiles (the
    planner is told the device holds two CTAs, so it splits no KV), over shuffled pages with
    ids outside the cache here and there: the page-table entries and rows the loop carries
    tiles ahead (prefill.cuh's Lookahead) are those tiles', and an entry outside the cache
    is skipped there as anywhere."""
    monkeypatch.setattr(prefill, "_max_ctas", lambda *a: 2)
    torch.manual_seed(head_dim + causal)
    _check_broken_pages(
        prefill,
        _workspace(),
        [3, 60],
        [3000, 1700],
        head_dim,
        lambda pages: {
            **{(0, page): pages + page for page in (5, 13, 14, 40, 99, 150, 187)},
            **{(1, page): -1 - page for page in (0, 20, 21, 22, 23, 105)},
        },
        causal,
    )


def _accepted_tilings() -> list[tuple[int, int, str]]:
    """(head_dim_qk, head_dim_vo, name) of every tiling PrefillTiling.check accepts."""
    from flashinfer.jit.prefill import HEAD_DIM_PAIRS, accepted_tilings

    return [(d, vo, t.name) for d, vo in HEAD_DIM_PAIRS for t in accepted_tilings(d, False, vo)]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,head_dim_vo,tiling_name", _accepted_tilings())
def test_every_tiling_masks_and_skips_as_the_reference(
    head_dim: int, head_dim_vo: int, tiling_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tiling FLASHINFER_PREFILL_TILING may select (head_dim 192 with v of 128 too), on
    the paths its shape changes: pages of 7 tokens with out-of-range page ids, a custom mask
    and a window together, a GQA group of 3 (rows straddling warps), a query longer than its
    KV and a one-token request; then causal with a soft cap, where warps skip the tiles past
    their rows' diagonals."""
    from flashinfer.jit.prefill import PrefillTiling, gen_prefill_module

    module = importlib.import_module("flashinfer.prefill")
    tiling = PrefillTiling.from_name(tiling_name)
    assert tiling is not None
    tile_kv = tiling.tile_kv
    built: dict[Any, Any] = {}

    def get_prefill_module(
        dtype: Any, dim: int, pos_encoding: str = "NONE", kv_dtype: Any = None, vo: Any = None
    ) -> Any:
        key = (dtype, pos_encoding, kv_dtype, vo)
        if key not in built:
            spec = gen_prefill_module(dtype, dim, tiling, pos_encoding, kv_dtype, vo)
            built[key] = spec.build_and_load()
        return built[key]

    monkeypatch.setattr(module, "get_prefill_module", get_prefill_module)
    _fresh_occupancy(monkeypatch, module)
    dtype, qo_heads, kv_heads, page_size, window = torch.bfloat16, 6, 2, 7, 40
    qo_lens, kv_lens = [150, 1, 90], [120, 333, 200]
    torch.manual_seed(head_dim + tile_kv)
    q, ks, vs = _batch_data(
        qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype, "cuda", head_dim_vo
    )
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, "HND", seed=tile_kv)
    num_pages = (cache if isinstance(cache, torch.Tensor) else cache[0]).shape[0]
    bad = {(0, 3): num_pages + 1, (1, 0): -1, (2, 10): 1 << 29}
    _break_page_ids(indices, indptr, bad)
    custom = [torch.rand(m, n, device="cuda") > 0.25 for m, n in zip(qo_lens, kv_lens)]
    masks, causal = [], []
    for request, (m, n) in enumerate(zip(qo_lens, kv_lens)):
        rows, cols = torch.arange(m, device="cuda")[:, None], torch.arange(n, device="cuda")
        diagonal, scored = rows + n - m, ~_on_broken_pages(request, n, page_size, bad)
        masks.append(custom[request] & (cols >= diagonal - window) & scored)
        causal.append((cols <= diagonal) & scored)  # request 0's first 30 rows see none
    wrapper = module.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout="HND")
    table = (_indptr(qo_lens), indptr, indices, last, qo_heads, kv_heads, head_dim, page_size)

    def check(visible: list[torch.Tensor], soft_cap: float | None = None, **options: Any) -> None:
        wrapper.plan(
            *table, head_dim_vo=head_dim_vo, logits_soft_cap=soft_cap, q_data_type=dtype, **options
        )
        out = torch.full((*q.shape[:2], head_dim_vo), NAN, dtype=dtype, device="cuda")
        lse = torch.full(q.shape[:2], NAN, device="cuda")
        wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
        _check(out, lse, _expected_batch(q, qo_lens, ks, vs, visible, soft_cap=soft_cap))

    check(masks, custom_mask=torch.cat([c.flatten() for c in custom]), window_left=window)
    check(causal, soft_cap=20.0, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scores_rising_past_the_running_max(prefill, head_dim: int, dtype: torch.dtype) -> None:
    """Keys whose scores creep up past a row's max and then jump (``_rising_keys``)."""
    torch.manual_seed(head_dim)
    q = _randn(300, 8, head_dim, dtype=dtype)
    k = _rising_keys(_randn(2000, 2, head_dim, dtype=dtype), slice(1200, 1260))
    v = _randn(2000, 2, head_dim, dtype=dtype)
    for causal in (False, True):
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True)
        _check(out, lse, reference_attention(q, k, v, causal=causal))


@pytest.mark.gpu
def test_a_window_past_every_key_is_no_window(prefill) -> None:
    """window_left of 2^63 - 1 with queries longer than the KV: every key is in the window
    (the kernel's position - window_left arithmetic must not wrap)."""
    torch.manual_seed(300)
    dtype = torch.float16
    q = _randn(300, 8, 128, dtype=dtype)
    k, v = _randn(100, 2, 128, dtype=dtype), _randn(100, 2, 128, dtype=dtype)
    for window in ((1 << 63) - 1, 1 << 31):
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(
            q, k, v, window_left=window, return_lse=True
        )
        _check(out, lse, reference_attention(q, k, v))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_batch_prefill_custom_mask(prefill, kind: str) -> None:
    """Per-request masks, flattened and concatenated (the reference's custom_mask); causal
    is ignored with a mask, window_left still applies."""
    dtype, qo_heads, kv_heads, head_dim, page_size = torch.float16, 8, 2, 64, 16
    qo_lens, kv_lens = [20, 0, 64, 5], [50, 10, 64, 300]
    torch.manual_seed(5)
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    masks = [torch.rand(m, n, device="cuda") > 0.3 for m, n in zip(qo_lens, kv_lens)]
    masks[0][3] = False  # a query that sees no key
    flat = torch.cat([m.flatten() for m in masks])
    if kind == "ragged":
        wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace())
        kv_args = (torch.cat(ks), torch.cat(vs))
        table = (_indptr(kv_lens),)
    else:
        wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace())
        cache, *table = _paged_kv(ks, vs, page_size, "NHD", seed=5)
        kv_args = (cache,)
    for window in (-1, 16):
        extra = (page_size,) if kind == "paged" else ()
        wrapper.plan(
            _indptr(qo_lens),
            *table,
            qo_heads,
            kv_heads,
            head_dim,
            *extra,
            custom_mask=flat,
            causal=True,
            window_left=window,
            q_data_type=dtype,
        )
        out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device="cuda")
        wrapper.run(q, *kv_args, out=out, lse=lse, return_lse=True)
        _check(out, lse, _expected_batch(q, qo_lens, ks, vs, masks, window_left=window))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_long_kv_is_split_and_merged(prefill, kind: str) -> None:
    """Two requests with few query rows and 9k / 12k keys: too few CTAs to fill the GPU, so
    the schedule splits the KV and merges partial states. PDL on and off give the same bits."""
    dtype, qo_heads, kv_heads, head_dim, page_size = torch.bfloat16, 32, 8, 128, 16
    qo_lens, kv_lens = [16, 100], [9000, 12000]
    torch.manual_seed(9)
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    if kind == "ragged":
        wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace())
        kv_args = (torch.cat(ks), torch.cat(vs))
        table = (_indptr(kv_lens),)
    else:
        wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace())
        cache, *table = _paged_kv(ks, vs, page_size, "NHD", seed=9)
        kv_args = (cache,)
    extra = (page_size,) if kind == "paged" else ()
    for causal in (False, True):
        wrapper.plan(
            _indptr(qo_lens),
            *table,
            qo_heads,
            kv_heads,
            head_dim,
            *extra,
            causal=causal,
            q_data_type=dtype,
        )
        out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device="cuda")
        wrapper.run(q, *kv_args, out=out, lse=lse, return_lse=True)
        _check(out, lse, _expected_batch(q, qo_lens, ks, vs, causal=causal))
    without = wrapper.run(q, *kv_args, enable_pdl=False)
    assert torch.equal(wrapper.run(q, *kv_args, enable_pdl=True), without)


# -- CUDA graphs -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ragged", "paged"])
def test_cuda_graph_replay_after_replanning(prefill, kind: str) -> None:
    """run() captured once; then plan() with other lengths (same batch, no more query rows
    than the first plan), new data written into the captured tensors, replay. The second
    plan splits a 9k KV that the first did not have; the third is decode-like."""
    dtype, qo_heads, kv_heads, head_dim, page_size = torch.float16, 16, 4, 128, 16
    steps = [  # (qo_lens, kv_lens); the first plan has the most query rows
        ([64, 1, 500, 7], [64, 3000, 2000, 7]),
        ([300, 200, 1, 71], [9000, 200, 1, 100]),
        ([1, 1, 1, 1], [1, 5, 10000, 1]),
    ]
    batch = len(steps[0][0])
    max_q = sum(steps[0][0])
    max_kv = max(sum(kv) for _, kv in steps)
    num_pages = 1000  # the largest step needs 628
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    qo_indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    kv_indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    q = torch.empty(max_q, qo_heads, head_dim, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    if kind == "ragged":
        wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(
            _workspace(),
            use_cuda_graph=True,
            qo_indptr_buf=qo_indptr_buf,
            kv_indptr_buf=kv_indptr_buf,
        )
        k = torch.empty(max_kv, kv_heads, head_dim, dtype=dtype, device="cuda")
        v = torch.empty_like(k)
        kv_args = (k, v)
    else:
        wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(
            _workspace(),
            use_cuda_graph=True,
            qo_indptr_buf=qo_indptr_buf,
            paged_kv_indptr_buf=kv_indptr_buf,
            paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32, device="cuda"),
            paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device="cuda"),
        )
        cache = _new_cache(num_pages, page_size, kv_heads, head_dim, "NHD", dtype)
        kv_args = (cache,)
    assert wrapper.is_cuda_graph_enabled

    def load(qo_lens: list[int], kv_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """New q and KV written in place, plan() for them; returns the expected rows."""
        q.copy_(torch.randn_like(q))
        ks, vs = _kv_data(kv_lens, kv_heads, head_dim, dtype)
        if kind == "ragged":
            k[: sum(kv_lens)].copy_(torch.cat(ks))
            v[: sum(kv_lens)].copy_(torch.cat(vs))
            wrapper.plan(
                _indptr(qo_lens),
                _indptr(kv_lens),
                qo_heads,
                kv_heads,
                head_dim,
                causal=True,
                q_data_type=dtype,
            )
        else:
            indptr, indices, last = _page_table(kv_lens, page_size, num_pages, generator)
            _write_pages(cache, ks, vs, indptr, indices, page_size, "NHD")
            wrapper.plan(
                _indptr(qo_lens),
                indptr,
                indices,
                last,
                qo_heads,
                kv_heads,
                head_dim,
                page_size,
                causal=True,
                q_data_type=dtype,
            )
        return _expected_batch(q, qo_lens, ks, vs, causal=True)

    want = load(*steps[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, *kv_args, out=out)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, *kv_args, out=out)
    for step, (qo_lens, kv_lens) in enumerate(steps):
        if step:
            want = load(qo_lens, kv_lens)
        out.fill_(NAN)
        graph.replay()
        rows = sum(qo_lens)
        torch.testing.assert_close(out[:rows].double(), want[0], **_tolerance(dtype))


# -- RoPE and ALiBi inside attention ---------------------------------------------------------------

ROPE_CASES = [  # (qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype, rope_scale, theta)
    (1, 777, 32, 8, 128, "HND", torch.bfloat16, None, None),
    (63, 200, 32, 4, 64, "NHD", torch.float16, 2.0, 5e5),
    (517, 2049, 16, 4, 256, "HND", torch.float16, None, 1e6),
    (1000, 1000, 32, 8, 128, "NHD", torch.bfloat16, 8.0, None),
    (128, 16384, 8, 2, 128, "NHD", torch.bfloat16, None, 5e5),  # positions past 16k
    (300, 90, 16, 4, 128, "HND", torch.bfloat16, None, None),  # queries at negative positions
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_len,kv_len,qo_heads,kv_heads,head_dim,layout,dtype,rope_scale,rope_theta", ROPE_CASES
)
def test_single_prefill_rope_llama(
    prefill, qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype, rope_scale, rope_theta
) -> None:
    """pos_encoding_mode="ROPE_LLAMA": q and k rotated in the kernel, queries at their
    bottom-right aligned positions (negative ones where there are fewer keys than queries),
    keys at their index; causal and not (a long KV split over CTAs keeps its keys'
    positions)."""
    torch.manual_seed(kv_len + head_dim)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    rope = (rope_scale or 1.0, rope_theta or 1e4)
    for causal in (False, True):
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(
            q,
            _to_layout(k, layout),
            _to_layout(v, layout),
            causal=causal,
            kv_layout=layout,
            pos_encoding_mode="ROPE_LLAMA",
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            return_lse=True,
        )
        _check(out, lse, reference_attention(q, k, v, causal=causal, rope=rope))


ALIBI_CASES = [  # (qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype, sm_scale)
    (1, 777, 32, 8, 128, "HND", torch.bfloat16, None),
    (63, 200, 12, 4, 64, "NHD", torch.float16, 0.05),  # 12 heads: the slopes past 8
    (517, 2049, 16, 4, 256, "HND", torch.float16, None),
    (1000, 1000, 32, 8, 128, "NHD", torch.bfloat16, None),
    (128, 16384, 8, 2, 128, "NHD", torch.bfloat16, 0.2),  # biases past 16k
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_len,kv_len,qo_heads,kv_heads,head_dim,layout,dtype,sm_scale", ALIBI_CASES
)
def test_single_prefill_alibi(
    prefill, qo_len, kv_len, qo_heads, kv_heads, head_dim, layout, dtype, sm_scale
) -> None:
    """pos_encoding_mode="ALIBI": each score gains its head's slope times (key index - query
    index), query indices counted from the request's first query as the reference does (the
    LSE is the reference's); causal and not."""
    torch.manual_seed(kv_len + head_dim + 1)
    q = _randn(qo_len, qo_heads, head_dim, dtype=dtype)
    k = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    v = _randn(kv_len, kv_heads, head_dim, dtype=dtype)
    for causal in (False, True):
        _leave_nan_in_freed_blocks((q.shape, dtype), (q.shape[:2], torch.float32))
        out, lse = prefill.single_prefill_with_kv_cache(
            q,
            _to_layout(k, layout),
            _to_layout(v, layout),
            causal=causal,
            kv_layout=layout,
            pos_encoding_mode="ALIBI",
            sm_scale=sm_scale,
            return_lse=True,
        )
        want = reference_attention(q, k, v, causal=causal, sm_scale=sm_scale, alibi=True)
        _check(out, lse, want)


@pytest.mark.gpu
@pytest.mark.parametrize("pos_encoding", ["ROPE_LLAMA", "ALIBI"])
@pytest.mark.parametrize("head_dim,layout", [(64, "HND"), (128, "NHD"), (256, "NHD")])
def test_batch_prefill_position_encodings_agree_with_single_prefill(
    prefill, pos_encoding, head_dim, layout
) -> None:
    """The reference library's own check: each request of a paged batch (pages of 5, one
    long request split over CTAs) against single prefill of its rows with RoPE or ALiBi,
    and both against the float64 reference."""
    torch.manual_seed(head_dim)
    dtype, qo_heads, kv_heads, page_size = torch.float16, 8, 2, 5
    qo_lens, kv_lens = [37, 1, 17, 3], [97, 54, 17, 6000]
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=2)
    wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout=layout)
    wrapper.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        qo_heads,
        kv_heads,
        head_dim,
        page_size,
        causal=True,
        pos_encoding_mode=pos_encoding,
        q_data_type=dtype,
    )
    out, lse = wrapper.run(q, cache, return_lse=True)
    encoding = dict(rope=(1.0, 1e4)) if pos_encoding == "ROPE_LLAMA" else dict(alibi=True)
    _check(out, lse, _expected_batch(q, qo_lens, ks, vs, causal=True, **encoding))
    for b, start in enumerate(itertools.accumulate([0, *qo_lens[:-1]])):
        rows = slice(start, start + qo_lens[b])
        single = prefill.single_prefill_with_kv_cache(
            q[rows], ks[b], vs[b], causal=True, pos_encoding_mode=pos_encoding
        )
        torch.testing.assert_close(out[rows], single, **_tolerance(dtype))


# (kv_dtype, qo_lens, kv_lens, page_size, qo_heads, kv_heads, head_dim, layout, dtype)
FP8_CASES = [
    (
        torch.float8_e4m3fn,
        [1, 17, 300, 2048, 0],
        [33, 500, 4096, 2048, 5],
        16,
        32,
        8,
        128,
        "NHD",
        torch.bfloat16,
    ),
    (torch.float8_e5m2, [100, 7, 1000], [100, 3000, 1500], 1, 8, 2, 64, "HND", torch.float16),
    (torch.float8_e4m3fn, [64, 513], [9000, 513], 16, 16, 4, 256, "NHD", torch.float16),
    (torch.float8_e5m2, [2048] * 4, [2048] * 4, 16, 32, 8, 128, "HND", torch.bfloat16),
]
K_SCALE, V_SCALE = 0.5, 2.0  # the fp8 cache's dequantization scales


def _cache_of(
    ks: list[torch.Tensor], vs: list[torch.Tensor], kv_dtype: torch.dtype | None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], dict]:
    """(keys, values) as a cache of ``kv_dtype`` holds them (None: as they are; fp8:
    quantized), as the reference reads them (dequantized by K_SCALE and V_SCALE), and the
    scales run() takes for them."""
    if kv_dtype is None:
        return ks, vs, ks, vs, {}
    ks, vs = [k.to(kv_dtype) for k in ks], [v.to(kv_dtype) for v in vs]
    k_ref, v_ref = [k.float() * K_SCALE for k in ks], [v.float() * V_SCALE for v in vs]
    return ks, vs, k_ref, v_ref, dict(k_scale=K_SCALE, v_scale=V_SCALE)


def _check_single_of_the_longest(
    prefill: ModuleType,
    q: torch.Tensor,
    qo_lens: list[int],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    refs: tuple[list[torch.Tensor], list[torch.Tensor]],
    layout: str,
    scales: dict,
) -> None:
    """Causal single prefill of the request with the most keys (its keys and values in
    ``layout``), into NaN-left blocks, against the reference on ``refs``' keys and values."""
    b = max(range(len(ks)), key=lambda r: ks[r].shape[0])
    start = sum(qo_lens[:b])
    q_b = q[start : start + qo_lens[b]]

    _leave_nan_in_freed_blocks(((*q_b.shape[:2], vs[b].shape[2]), q.dtype))
    out, lse = prefill.single_prefill_with_kv_cache(
        q_b,
        _to_layout(ks[b], layout),
        _to_layout(vs[b], layout),
        causal=True,
        kv_layout=layout,
        return_lse=True,
        **scales,
    )
    _check(out, lse, reference_attention(q_b, refs[0][b], refs[1][b], causal=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kv_dtype,qo_lens,kv_lens,page_size,qo_heads,kv_heads,head_dim,layout,dtype",
    FP8_CASES,
    ids=[f"{str(c[0])[12:]}-hd{c[6]}-{c[7]}-page{c[3]}" for c in FP8_CASES],
)
def test_fp8_cache_prefill_matches_the_reference(
    prefill, kv_dtype, qo_lens, kv_lens, page_size, qo_heads, kv_heads, head_dim, layout, dtype
) -> None:
    """An fp8 KV cache (plan's kv_data_type, k_scale and v_scale) in paged prefill (shuffled
    pages, fp8 NaN in every slot no request owns) in each of BATCH_VARIANTS, ragged prefill
    (causal) and single prefill of the longest request, into NaN-poisoned outputs, against
    the float64 reference on the dequantized keys and values."""
    torch.manual_seed(sum(kv_lens) + head_dim)
    q, ks16, vs16 = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, head_dim, dtype)
    ks, vs, k_ref, v_ref, scales = _cache_of(ks16, vs16, kv_dtype)
    cache, indptr, indices, last = _paged_kv(ks, vs, page_size, layout, seed=len(qo_lens))
    paged = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout=layout)
    for causal, sm_scale, cap, window in BATCH_VARIANTS:
        paged.plan(
            _indptr(qo_lens),
            indptr,
            indices,
            last,
            qo_heads,
            kv_heads,
            head_dim,
            page_size,
            causal=causal,
            sm_scale=sm_scale,
            logits_soft_cap=cap,
            window_left=window,
            q_data_type=dtype,
            kv_data_type=kv_dtype,
        )
        out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device="cuda")
        paged.run(q, cache, out=out, lse=lse, return_lse=True, **scales)
        options = dict(causal=causal, window_left=window, soft_cap=cap, sm_scale=sm_scale)
        _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, **options))

    ragged = prefill.BatchPrefillWithRaggedKVCacheWrapper(_workspace(), kv_layout=layout)
    ragged.plan(
        _indptr(qo_lens),
        _indptr(kv_lens),
        qo_heads,
        kv_heads,
        head_dim,
        causal=True,
        q_data_type=dtype,
        kv_data_type=kv_dtype,
    )
    out, lse = _nan_like(q), torch.full(q.shape[:2], NAN, device="cuda")
    ragged_k, ragged_v = _to_layout(torch.cat(ks), layout), _to_layout(torch.cat(vs), layout)
    ragged.run(q, ragged_k, ragged_v, out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, causal=True))
    _check_single_of_the_longest(prefill, q, qo_lens, ks, vs, (k_ref, v_ref), layout, scales)


# -- head_dim_qk 192, head_dim_vo 128 (DeepSeek's MLA prefill) -----------------------------------

MLA_CASES = [  # (qo_lens, kv_lens, qo_heads, kv_heads, layout, dtype, kv_dtype)
    # engines' shape: as many KV heads as query heads (16: 128 heads over 8 GPUs), a prefix
    ([1, 300, 2048, 0, 17], [1, 300, 4096, 50, 900], 16, 16, "NHD", torch.bfloat16, None),
    ([128, 1000], [128, 3000], 8, 8, "HND", torch.float16, None),
    ([7, 513], [2000, 513], 16, 4, "NHD", torch.bfloat16, None),  # GQA 4
    ([64, 1, 700], [64, 1500, 700], 16, 16, "HND", torch.bfloat16, torch.float8_e4m3fn),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "qo_lens,kv_lens,qo_heads,kv_heads,layout,dtype,kv_dtype",
    MLA_CASES,
    ids=[f"{c[2]}x{c[3]}-{c[4]}-{str(c[5])[6:]}-{str(c[6])[6:] or 'kv-same'}" for c in MLA_CASES],
)
def test_mla_head_dims_match_the_reference(
    prefill, qo_lens, kv_lens, qo_heads, kv_heads, layout, dtype, kv_dtype
) -> None:
    """q and k of head_dim 192, v and the output of 128: the ragged wrapper (as engines run
    DeepSeek's prefill, head_dim_vo=128) in each of BATCH_VARIANTS, the paged wrapper over a
    (k, v) pair of caches (shuffled pages of 16, NaN in every slot no request owns, causal)
    and single prefill of the longest request, into NaN-poisoned outputs [.., 128], against
    the float64 reference; an fp8 cache with k_scale and v_scale."""
    torch.manual_seed(sum(kv_lens))
    q, ks, vs = _batch_data(qo_lens, kv_lens, qo_heads, kv_heads, 192, dtype, head_dim_vo=128)
    ks, vs, k_ref, v_ref, scales = _cache_of(ks, vs, kv_dtype)
    kv_data_type = kv_dtype or dtype
    out_shape = (q.shape[0], qo_heads, 128)

    _check_ragged_variants(prefill, q, qo_lens, ks, vs, layout, (k_ref, v_ref), scales)

    cache, indptr, indices, last = _paged_kv(ks, vs, 16, layout, seed=len(qo_lens))
    paged = prefill.BatchPrefillWithPagedKVCacheWrapper(_workspace(), kv_layout=layout)
    paged.plan(
        _indptr(qo_lens),
        indptr,
        indices,
        last,
        qo_heads,
        kv_heads,
        192,
        16,
        head_dim_vo=128,
        causal=True,
        q_data_type=dtype,
        kv_data_type=kv_data_type,
    )
    out = torch.full(out_shape, NAN, dtype=dtype, device="cuda")
    lse = torch.full(q.shape[:2], NAN, device="cuda")
    paged.run(q, cache, out=out, lse=lse, return_lse=True, **scales)
    _check(out, lse, _expected_batch(q, qo_lens, k_ref, v_ref, causal=True))
    assert paged.run(q, cache, **scales).shape == out_shape
    _check_single_of_the_longest(prefill, q, qo_lens, ks, vs, (k_ref, v_ref), layout, scales)
