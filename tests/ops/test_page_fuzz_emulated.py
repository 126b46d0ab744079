"""Random paged-KV appends on the emulator (tests/emu), the kernel's own source behind the real
API: each case draws from its seed the cache form (one tensor or a (k, v) pair, page_size 1's
squeezed forms too), layout, dtype (16-bit, float32, fp8), page size, heads, head_dim (vector
and element-wise rows), requests with existing and appended lengths from 0, a shuffled page
table with spare pages, the index dtype, the copy landing, the appended keys' memory:
contiguous, or views into one fused qkv buffer, possibly one element off the 16-byte boundary,
and the cache's: dense, or each of its tensors a view scattered in a NaN-filled buffer
(tests/ops/strided_memory.py; as several layers' caches in one buffer), strides in 16-byte
vectors, or in elements (always where a row is not whole vectors).

Every appended token must land in its slot, bit for bit, and no other slot of any page, nor
any byte of a scattered cache's buffer outside it, may change (tests/ops/test_page.py's
check). ``--fuzz-seeds START:COUNT`` picks the seeds (default
0:6)."""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

import torch

import flashinfer
from tests.ops.strided_memory import Watched
from tests.ops.test_page import _assert_only, _expected_slots, _gpu_cache
from tests.ops.test_page_emulated import emulate  # noqa: F401
from tests.ops.test_prefill_gpu import _indptr, _page_table

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)


@dataclasses.dataclass(frozen=True)
class PageCase:
    seed: int
    form: str  # "single", "tuple", or (page_size 1) "single_squeezed", "tuple_squeezed"
    layout: str
    dtype: torch.dtype
    page_size: int
    heads: int
    dim: int
    old_lens: tuple[int, ...]  # tokens each request holds before the append
    add_lens: tuple[int, ...]  # tokens appended to each
    index_dtype: torch.dtype
    land_at_issue: bool
    memory: str  # "contiguous", "fused" or "fused_unaligned"
    cache: str  # "dense" or "scattered" (drawn last)


def draw_case(seed: int) -> PageCase:
    rng = random.Random(seed)
    page_size = rng.choice((1, 1, 2, 3, 4, 16, rng.randint(1, 20)))
    forms = ("single", "tuple") + (("single_squeezed", "tuple_squeezed") if page_size == 1 else ())
    batch = rng.randint(1, 5)
    return PageCase(
        seed=seed,
        form=rng.choice(forms),
        layout=rng.choice(("NHD", "HND")),
        dtype=rng.choice(DTYPES),
        page_size=page_size,
        heads=rng.randint(1, 6),
        dim=rng.choice((64, 128, 256, rng.randint(1, 160))),
        old_lens=tuple(
            rng.choice((0, rng.randint(1, 10), rng.randint(1, 60))) for _ in range(batch)
        ),
        add_lens=tuple(rng.choice((0, 1, rng.randint(1, 20))) for _ in range(batch)),
        index_dtype=rng.choice((torch.int32, torch.int64)),
        land_at_issue=rng.random() < 0.5,
        memory=rng.choice(("contiguous", "fused", "fused_unaligned")),
        cache=rng.choice(("dense", "scattered")),
    )


def _cache_placer(case: PageCase, watched: Watched) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Where _gpu_cache puts each full cache tensor: as made (a dense cache), or scattered
    (the 5-D tensor of the single forms, or each of a pair alone), ``watched`` checking
    the buffer outside the view."""
    if case.cache == "dense":
        return lambda name, t: t
    rng = random.Random(f"{case.seed} cache")

    def vec(t: torch.Tensor) -> int:
        """Strides in elements where a row is not whole vectors, and in a third of the rest
        (each tensor of a pair drawn alone): the kernel must then copy element-wise."""
        row = 16 // t.element_size()
        return row if case.dim % row == 0 and rng.random() < 0.7 else 1

    return lambda name, t: watched.scattered_around(name, t, rng, vec(t))


def _appended(case: PageCase, nnz: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The appended keys and values [nnz, heads, dim]: their own tensors, or views into one
    buffer whose rows hold query heads, keys and values (and, unaligned, start one element
    into its storage)."""
    gen = torch.Generator().manual_seed(case.seed)
    shape = (nnz, case.heads, case.dim)
    if case.memory == "contiguous":
        return tuple(torch.randn(*shape, generator=gen).to(case.dtype) for _ in range(2))
    q_heads, skip = 2, 1 if case.memory == "fused_unaligned" else 0
    row = (q_heads + 2 * case.heads) * case.dim
    flat = torch.randn(skip + nnz * row, generator=gen).to(case.dtype)
    rows = flat[skip:].view(nnz, row)
    width = case.heads * case.dim
    start = q_heads * case.dim
    key = rows[:, start : start + width].view(shape)
    value = rows[:, start + width : start + 2 * width].view(shape)
    return key, value


def test_random_append(emulate, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(case.dtype, land_at_issue=case.land_at_issue)
    new_lens = [o + a for o, a in zip(case.old_lens, case.add_lens)]
    num_pages = sum(-(-n // case.page_size) for n in new_lens) + 3  # 3 spare, left untouched
    generator = torch.Generator().manual_seed(case.seed)
    kv_indptr, kv_indices, last = (
        t.to(case.index_dtype) for t in _page_table(new_lens, case.page_size, num_pages, generator)
    )
    outside = Watched()
    cache, k_view, v_view = _gpu_cache(
        case.form,
        case.layout,
        num_pages,
        case.page_size,
        case.heads,
        case.dim,
        case.dtype,
        "cpu",
        _cache_placer(case, outside),
    )
    nnz = sum(case.add_lens)
    key, value = _appended(case, nnz)
    append_indptr = _indptr(list(case.add_lens)).to(case.index_dtype)
    seq_lens = flashinfer.get_seq_lens(kv_indptr, last, case.page_size)
    batch, positions = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    flashinfer.append_paged_kv_cache(
        key,
        value,
        batch.to(case.index_dtype),
        positions.to(case.index_dtype),
        cache,
        kv_indices,
        kv_indptr,
        last,
        kv_layout=case.layout,
    )
    state = dict(
        key=key,
        value=value,
        batch=batch,
        positions=positions,
        k_view=k_view,
        v_view=v_view,
        kv_indices=kv_indices,
        kv_indptr=kv_indptr,
        page_size=case.page_size,
        old_lens=list(case.old_lens),
    )
    try:
        expected = _expected_slots(state)
        assert len(expected) == nnz
        _assert_only(state, case.layout, expected)
        outside.check()
    except AssertionError as err:
        raise AssertionError(f"{case!r}\n{err}") from None


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs."""
    cases = [draw_case(seed) for seed in range(300)]
    assert {c.form for c in cases} == {"single", "tuple", "single_squeezed", "tuple_squeezed"}
    assert {c.dtype for c in cases} == set(DTYPES) and len({c.layout for c in cases}) == 2
    assert {c.memory for c in cases} == {"contiguous", "fused", "fused_unaligned"}
    scattered = [c for c in cases if c.cache == "scattered"]
    assert {c.form for c in scattered} == {"single", "tuple", "single_squeezed", "tuple_squeezed"}
    assert {c.dtype for c in scattered} == set(DTYPES) and any(c.dim % 8 for c in scattered)
    assert len({c.index_dtype for c in cases}) == 2 and len({c.land_at_issue for c in cases}) == 2
    assert any(c.dim % 8 for c in cases) and any(c.page_size > 16 for c in cases)
    assert any(0 in c.add_lens for c in cases) and any(0 in c.old_lens for c in cases)
    assert any(sum(c.add_lens) == 0 for c in cases)
