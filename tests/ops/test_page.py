"""Paged KV append: index helpers and argument checks (CPU), every page slot (GPU)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import flashinfer
from flashinfer import page as page_api
from flashinfer import ragged
from flashinfer.paged_kv import unpack_paged_kv_cache
from tests.conftest import run_python


def _i32(values: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


# -- index helpers (CPU) ---------------------------------------------------------------------


def test_batch_indices_and_positions() -> None:
    # request 0 appends 3 tokens reaching length 10; request 1 appends 1 reaching 1; 2 appends 2
    batch, positions = flashinfer.get_batch_indices_positions(
        _i32([0, 3, 4, 6]), _i32([10, 1, 7]), 6
    )
    assert batch.tolist() == [0, 0, 0, 1, 2, 2]
    assert positions.tolist() == [7, 8, 9, 0, 5, 6]
    assert batch.dtype == positions.dtype == torch.int32
    # int64 inputs (the reference's own example passes int64 seq_lens); empty requests
    batch, positions = flashinfer.get_batch_indices_positions(
        torch.tensor([0, 1, 1, 3]), torch.tensor([5, 2, 5]), 3
    )
    assert batch.tolist() == [0, 2, 2] and positions.tolist() == [4, 3, 4]
    batch, positions = flashinfer.get_batch_indices_positions(_i32([0, 0]), _i32([4]), 0)
    assert batch.shape == positions.shape == (0,)


BATCH_BAD = [
    ("seq_lens has 2 elements, expected 3", ValueError, ([0, 3, 4, 6], [10, 1], 6)),
    ("nnz must be >= 0", ValueError, ([0, 1], [1], -1)),
    ("nnz must be an int", TypeError, ([0, 1], [1], 1.0)),
    ("nnz must be <= 2147483647, got 2147483648", ValueError, ([0, 1], [1], 2**31)),
    ("append_indptr needs batch_size \\+ 1 elements", ValueError, ([], [], 0)),
    (r"append_indptr must start at 0, got append_indptr\[0\] = 1", ValueError, ([1, 2], [3], 1)),
    (
        r"append_indptr must be non-decreasing, but append_indptr\[2\] = 2 "
        r"< append_indptr\[1\] = 5",
        ValueError,
        ([0, 5, 2], [5, 2], 2),
    ),
    (r"append_indptr\[-1\] must be at most nnz = 4, got 5", ValueError, ([0, 1, 5], [1, 4], 4)),
]


@pytest.mark.parametrize("message,error,args", BATCH_BAD, ids=[b[0][:40] for b in BATCH_BAD])
def test_batch_indices_positions_bad_arguments(message, error, args) -> None:
    indptr, seq_lens, nnz = args
    with pytest.raises(error, match=message):
        flashinfer.get_batch_indices_positions(_i32(indptr), _i32(seq_lens), nnz)


def test_tokens_past_the_last_request_are_padding() -> None:
    batch, positions = flashinfer.get_batch_indices_positions(_i32([0, 1, 3]), _i32([2, 5]), 5)
    assert batch.tolist() == [0, 1, 1, -1, -1] and positions.tolist() == [1, 3, 4, 0, 0]


def test_output_buffers_are_filled_and_returned() -> None:
    batch_out, positions_out = _i32([9] * 5), _i32([7] * 5)
    batch, positions = flashinfer.get_batch_indices_positions(
        _i32([0, 1, 3]), _i32([2, 5]), 5, batch_indices=batch_out, positions=positions_out
    )
    assert batch is batch_out and positions is positions_out
    # as in the reference: padding tokens get batch index -1 and keep their position
    assert batch.tolist() == [0, 1, 1, -1, -1] and positions.tolist() == [1, 3, 4, 7, 7]
    batch, positions = flashinfer.get_batch_indices_positions(
        _i32([0, 2]), _i32([4]), 2, positions=positions_out[:2]
    )
    assert batch.tolist() == [0, 0] and positions_out.tolist() == [2, 3, 4, 7, 7]


OUTPUT_BAD = [
    ("batch_indices has 4 elements, expected 5", ValueError, dict(batch_indices=_i32([0] * 4))),
    (
        "positions has dtype torch.int64",
        TypeError,
        dict(positions=torch.zeros(5, dtype=torch.long)),
    ),
    ("batch_indices must be a torch.Tensor", TypeError, dict(batch_indices=[0] * 5)),
    ("positions is on meta", ValueError, dict(positions=_i32([0] * 5).to("meta"))),
    ("positions must be contiguous", ValueError, dict(positions=_i32([0] * 10)[::2])),
]


@pytest.mark.parametrize("message,error,outputs", OUTPUT_BAD, ids=[b[0][:40] for b in OUTPUT_BAD])
def test_bad_output_buffers(message, error, outputs) -> None:
    with pytest.raises(error, match=message):
        flashinfer.get_batch_indices_positions(_i32([0, 1, 3]), _i32([2, 5]), 5, **outputs)


def test_batch_indices_positions_checks_types_and_devices() -> None:
    with pytest.raises(TypeError, match="append_indptr has dtype torch.float32"):
        flashinfer.get_batch_indices_positions(torch.tensor([0.0, 1.0]), _i32([1]), 1)
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor"):
        flashinfer.get_batch_indices_positions(_i32([0, 1]), [1], 1)
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        flashinfer.get_batch_indices_positions(_i32([0, 1]), _i32([1]).to("meta"), 1)


def test_get_seq_lens() -> None:
    # 3 pages (last holds 2), 1 page (holds 5), no page
    lens = flashinfer.get_seq_lens(_i32([0, 3, 4, 4]), _i32([2, 5, 0]), 16)
    assert lens.tolist() == [34, 5, 0]
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        flashinfer.get_seq_lens(_i32([0, 1]), _i32([1]), 0)
    with pytest.raises(ValueError, match="kv_last_page_len has 1 elements, expected 2"):
        flashinfer.get_seq_lens(_i32([0, 1, 2]), _i32([1]), 4)
    with pytest.raises(ValueError, match="kv_indptr must be non-decreasing"):
        flashinfer.get_seq_lens(_i32([0, 2, 1]), _i32([1, 1]), 4)


def test_token_mapping_is_memory_safe_for_any_indptr() -> None:
    """The mapping a CUDA indptr gets (it is not validated on the host): tokens no request
    owns are marked, and every index stays within the batch."""
    cases = [
        ([0, 5, 2], 4),
        ([3, 1], 5),
        ([0], 3),
        ([0, 0, 0], 4),
        ([-7, 2, 9], 12),
        ([0, 2, 2, 5], 5),
    ]
    for indptr, nnz in cases:
        tokens = ragged.token_requests(torch.tensor(indptr, dtype=torch.int32), nnz)
        batch_size = len(indptr) - 1
        assert bool(((tokens.request >= 0) & (tokens.request < max(batch_size, 1))).all())
        owned = tokens.owned.tolist()
        for t in range(nnz):
            b = int(tokens.request[t])
            inside = batch_size > 0 and indptr[b] <= t < indptr[b + 1]
            assert owned[t] == inside, (indptr, t)
            if owned[t]:
                assert int(tokens.within[t]) == t - indptr[b]
                assert int(tokens.count[t]) == indptr[b + 1] - indptr[b]


def test_decreasing_append_indptr_no_longer_corrupts_the_heap() -> None:
    """Issue 16: a non-monotone append_indptr corrupted the heap (repeat_interleave trusted an
    output_size its counts exceed). In a fresh process it must now raise cleanly, and the
    mapping a CUDA indptr would get must stay in bounds."""
    code = (
        "import torch, flashinfer\n"
        "indptr = torch.tensor([0, 4096, 1, 2], dtype=torch.int32)\n"
        "seq = torch.tensor([4096, 4096, 4096], dtype=torch.int32)\n"
        "try:\n"
        "    flashinfer.get_batch_indices_positions(indptr, seq, 2)\n"
        "except ValueError as e:\n"
        "    print('raised:', e)\n"
        "t = flashinfer.ragged.token_requests(indptr, 2)\n"
        "assert bool(((t.request >= 0) & (t.request < 3)).all())\n"
        "print('mapped', t.owned.tolist())\n"
    )
    proc = run_python(code)
    assert "raised: append_indptr must be non-decreasing" in proc.stdout
    assert "mapped" in proc.stdout


# -- append_paged_kv_cache: argument forms and checks (CPU) -----------------------------------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(page_api, "get_page_module", refuse)


NNZ, HEADS, DIM, PAGES, PAGE_SIZE = 3, 2, 16, 4, 8


def _cache(
    layout: str = "NHD",
    page_size: int = PAGE_SIZE,
    dtype: torch.dtype = torch.float16,
    pages: int = PAGES,
) -> torch.Tensor:
    page = (page_size, HEADS, DIM) if layout == "NHD" else (HEADS, page_size, DIM)
    return torch.zeros(pages, 2, *page, dtype=dtype)


def _args(**overrides):  # noqa: ANN202
    args = dict(
        append_key=torch.randn(NNZ, HEADS, DIM, dtype=torch.float16),
        append_value=torch.randn(NNZ, HEADS, DIM, dtype=torch.float16),
        batch_indices=_i32([0, 0, 1]),
        positions=_i32([0, 1, 0]),
        paged_kv_cache=_cache(),
        kv_indices=_i32([0, 1]),
        kv_indptr=_i32([0, 1, 2]),
        kv_last_page_len=_i32([2, 1]),
        kv_layout="NHD",
    )
    args.update(overrides)
    return args


def _cache_forms(layout: str) -> list:
    """Every form of paged_kv_cache the reference accepts, for ``layout``."""
    five = _cache(layout)
    one = _cache(layout, page_size=1)
    slot = 2 if layout == "NHD" else 3
    return [
        five,
        (five[:, 0], five[:, 1]),
        (five[:, 0].clone(), five[:, 1].clone()),
        [five[:, 0], five[:, 1]],
        one.squeeze(slot),
        (one[:, 0].squeeze(slot - 1), one[:, 1].squeeze(slot - 1)),
    ]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_every_cache_form_gets_to_the_device_check(no_launch, layout: str) -> None:
    for form in _cache_forms(layout):
        with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
            flashinfer.append_paged_kv_cache(**_args(paged_kv_cache=form, kv_layout=layout))


def test_int64_indices_are_accepted(no_launch) -> None:
    long = dict(
        batch_indices=torch.tensor([0, 0, 1]),
        positions=torch.tensor([0, 1, 0]),
        kv_indices=torch.tensor([0, 1]),
        kv_indptr=torch.tensor([0, 1, 2]),
        kv_last_page_len=torch.tensor([2, 1]),
    )
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(**_args(**long))


def test_the_cache_is_unpacked_without_a_copy() -> None:
    cache = _cache("HND")
    (_, k), (_, v) = unpack_paged_kv_cache(cache, "HND")
    assert k.data_ptr() == cache.data_ptr() and v.data_ptr() == cache[:, 1].data_ptr()
    assert k.shape == (PAGES, HEADS, PAGE_SIZE, DIM)
    (_, k), _ = unpack_paged_kv_cache(_cache("NHD", page_size=1).squeeze(2), "NHD")
    assert k.shape == (PAGES, 1, HEADS, DIM)


BAD = [
    ("append_key must be 3-D", ValueError, dict(append_key=torch.zeros(3, 32))),
    (
        "append_value has shape",
        ValueError,
        dict(append_value=torch.zeros(3, 2, 8, dtype=torch.float16)),
    ),
    ("kv_layout must be 'NHD' or 'HND'", ValueError, dict(kv_layout="NDH")),
    (r"paged_kv_cache holds 8 heads of dim 16 \(HND\)", ValueError, dict(kv_layout="HND")),
    (
        "paged_kv_cache has dtype torch.bfloat16",
        TypeError,
        dict(paged_kv_cache=_cache(dtype=torch.bfloat16)),
    ),
    (
        r"paged_kv_cache\[1\] has dtype torch.bfloat16",
        TypeError,
        dict(paged_kv_cache=(_cache()[:, 0], _cache(dtype=torch.bfloat16)[:, 1])),
    ),
    (
        r"paged_kv_cache must be 5-D .*got 3-D",
        ValueError,
        dict(paged_kv_cache=torch.zeros(4, 2, 16, dtype=torch.float16)),
    ),
    (
        "paged_kv_cache must hold keys and values in dim 1",
        ValueError,
        dict(paged_kv_cache=torch.zeros(4, 3, 8, 2, 16, dtype=torch.float16)),
    ),
    (
        r"paged_kv_cache must be a \(k_cache, v_cache\) pair, got 3 items",
        ValueError,
        dict(paged_kv_cache=(_cache()[:, 0],) * 3),
    ),
    (
        r"paged_kv_cache\[0\] must be a torch.Tensor",
        TypeError,
        dict(paged_kv_cache=(None, _cache()[:, 1])),
    ),
    (
        r"paged_kv_cache\[1\] must be 4-D",
        ValueError,
        dict(paged_kv_cache=(_cache()[:, 0], _cache())),
    ),
    ("paged_kv_cache must be a torch.Tensor or a", TypeError, dict(paged_kv_cache={"k": 1})),
    (
        "key and value caches of paged_kv_cache differ in shape",
        ValueError,
        dict(paged_kv_cache=(_cache()[:, 0], _cache(pages=5)[:, 1])),
    ),
    (
        r"paged_kv_cache must be contiguous in its last dim",
        ValueError,
        dict(paged_kv_cache=_cache().transpose(-1, -2).contiguous().transpose(-1, -2)),
    ),
    ("positions has 2 elements, expected 3", ValueError, dict(positions=_i32([0, 1]))),
    ("kv_indices has dtype torch.float32", TypeError, dict(kv_indices=torch.zeros(2))),
    (
        "kv_last_page_len has 3 elements, expected 2",
        ValueError,
        dict(kv_last_page_len=_i32([1, 1, 1])),
    ),
    (
        "kv_indptr needs batch_size \\+ 1 elements",
        ValueError,
        dict(kv_indptr=_i32([]), kv_last_page_len=_i32([])),
    ),
    (
        r"kv_indptr must be non-decreasing, but kv_indptr\[2\] = 1 < kv_indptr\[1\] = 2",
        ValueError,
        dict(kv_indptr=_i32([0, 2, 1])),
    ),
    (r"kv_indptr must start at 0", ValueError, dict(kv_indptr=_i32([1, 1, 2]))),
    (
        r"kv_indptr\[-1\] must be at most len\(kv_indices\) = 2, got 3",
        ValueError,
        dict(kv_indptr=_i32([0, 1, 3])),
    ),
    ("append_key must be a CUDA tensor", ValueError, dict()),
]


@pytest.mark.parametrize("message,error,overrides", BAD, ids=[b[0][:40] for b in BAD])
def test_bad_arguments_raise_before_launch(no_launch, message, error, overrides) -> None:
    with pytest.raises(error, match=message):
        flashinfer.append_paged_kv_cache(**_args(**overrides))


def test_fp8_caches_take_fp8_keys_of_their_own_type(no_launch) -> None:
    """An fp8 cache is appended to with keys and values already in its dtype (the caller
    quantizes, as with the reference); the kernel copies them."""
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        key = torch.randn(NNZ, HEADS, DIM).to(fp8)
        fp8_args = dict(append_key=key, append_value=key, paged_kv_cache=_cache(dtype=fp8))
        with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
            flashinfer.append_paged_kv_cache(**_args(**fp8_args))
        with pytest.raises(TypeError, match=f"paged_kv_cache has dtype {fp8}, but append_key"):
            flashinfer.append_paged_kv_cache(**_args(paged_kv_cache=_cache(dtype=fp8)))


def test_the_fp8_module_compiles_and_checks_its_dtype() -> None:
    """The e5m2 page module (nvcc, sm_90a) takes caches and keys of its dtype only."""
    module = page_api.get_page_module(torch.float8_e5m2)
    assert module.dtype() == "float8_e5m2"
    fp8 = dict(append_key=torch.randn(NNZ, HEADS, DIM).to(torch.float8_e5m2))
    fp8.update(append_value=fp8["append_key"], paged_kv_cache=_cache(dtype=torch.float8_e5m2))
    a = _args(**fp8)
    call = [a[n] for n in ("append_key", "append_value", "batch_indices", "positions")]
    call += [a["paged_kv_cache"][:, 0], a["paged_kv_cache"][:, 1]]
    call += [a["kv_indices"], a["kv_indptr"], a["kv_last_page_len"], False]
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        module.append_paged_kv_cache(*call)
    call[0] = call[0].view(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="append_key has dtype float8_e4m3fn, expected float8_e5m2"):
        module.append_paged_kv_cache(*call)


def test_the_binding_checks_too() -> None:
    module = page_api.get_page_module(torch.float16)
    a = _args()
    call = [
        a["append_key"],
        a["append_value"],
        a["batch_indices"],
        a["positions"],
        a["paged_kv_cache"][:, 0],
        a["paged_kv_cache"][:, 1],
        a["kv_indices"],
        a["kv_indptr"],
        a["kv_last_page_len"],
        False,
    ]
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        module.append_paged_kv_cache(*call)
    call[9] = True
    with pytest.raises(ValueError, match="paged_k_cache holds 8 heads"):
        module.append_paged_kv_cache(*call)


# -- GPU -------------------------------------------------------------------------------------

SENTINEL = 384.0  # exact in every cache dtype, fp8 included


def _gpu_cache(
    form: str,
    layout: str,
    num_pages: int,
    page_size: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    device: str = "cuda",
    place: Callable[[str, torch.Tensor], torch.Tensor] = lambda name, t: t,
):  # noqa: ANN202
    """(the paged_kv_cache argument in ``form``, 4-D key view, 4-D value view); keys poisoned
    with SENTINEL and values with -SENTINEL. The views alias the argument's memory, each
    full tensor (the 5-D one, or each of a pair) where ``place`` (its name, it) puts it."""
    page = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    slot = 1 if layout == "NHD" else 2  # page_size dim of a 4-D cache
    if form in ("single", "single_squeezed"):
        kv = torch.empty(num_pages, 2, *page, dtype=dtype, device=device)
        kv[:, 0], kv[:, 1] = SENTINEL, -SENTINEL
        kv = place("paged_kv_cache", kv)
        arg = kv.squeeze(slot + 1) if form == "single_squeezed" else kv
        return arg, kv[:, 0], kv[:, 1]
    k = place(
        "paged_kv_cache[0]", torch.full((num_pages, *page), SENTINEL, dtype=dtype, device=device)
    )
    v = place(
        "paged_kv_cache[1]", torch.full((num_pages, *page), -SENTINEL, dtype=dtype, device=device)
    )
    return ((k.squeeze(slot), v.squeeze(slot)) if form == "tuple_squeezed" else (k, v)), k, v


def _paged_setup(
    form: str,
    layout: str,
    dtype: torch.dtype,
    page_size: int,
    seed: int,
    dim: int = 128,
    index_dtype: torch.dtype = torch.int32,
    device: str = "cuda",
):  # noqa: ANN202
    """Three requests with existing lengths, a shuffled page table with spare pages, and the
    appended tokens' indices from get_batch_indices_positions/get_seq_lens."""
    torch.manual_seed(seed)
    heads = 4
    old_lens, add_lens = [5, 0, 17], [3, 9, 1]
    new_lens = [o + a for o, a in zip(old_lens, add_lens)]
    pages_per = [(n + page_size - 1) // page_size for n in new_lens]
    num_pages = sum(pages_per) + 3  # spare pages that must stay untouched
    page_ids = torch.randperm(num_pages)[: sum(pages_per)]
    kv_indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()])
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(new_lens, pages_per)])
    arg, k_view, v_view = _gpu_cache(form, layout, num_pages, page_size, heads, dim, dtype, device)
    nnz = sum(add_lens)
    key = torch.randn(nnz, heads, dim, device=device).to(dtype)  # (no fp8 randn)
    value = torch.randn(nnz, heads, dim, device=device).to(dtype)
    append_indptr = torch.tensor(
        [0, *torch.tensor(add_lens).cumsum(0).tolist()], dtype=index_dtype, device=device
    )
    to_gpu = dict(dtype=index_dtype, device=device)
    seq_lens = flashinfer.get_seq_lens(kv_indptr.to(**to_gpu), last.to(**to_gpu), page_size)
    assert seq_lens.tolist() == new_lens
    batch, positions = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    return dict(
        key=key,
        value=value,
        batch=batch.to(index_dtype),
        positions=positions.to(index_dtype),
        cache=arg,
        k_view=k_view,
        v_view=v_view,
        kv_indices=page_ids.to(**to_gpu),
        kv_indptr=kv_indptr.to(**to_gpu),
        last=last.to(**to_gpu),
        page_size=page_size,
        old_lens=old_lens,
    )


def _slot(cache: torch.Tensor, layout: str, page: int, slot: int) -> torch.Tensor:
    return cache[page, slot] if layout == "NHD" else cache[page, :, slot]


def _append(s: dict, layout: str, **overrides) -> None:  # noqa: ANN003
    args = dict(
        batch_indices=s["batch"],
        positions=s["positions"],
        kv_indices=s["kv_indices"],
        kv_indptr=s["kv_indptr"],
    )
    args.update(overrides)
    flashinfer.append_paged_kv_cache(
        s["key"],
        s["value"],
        args["batch_indices"],
        args["positions"],
        s["cache"],
        args["kv_indices"],
        args["kv_indptr"],
        s["last"],
        kv_layout=layout,
    )
    if s["key"].is_cuda:
        torch.cuda.synchronize()


def _assert_only(s: dict, layout: str, expected: dict[tuple[int, int], int]) -> None:
    """Slot (page, slot) holds appended token ``expected[(page, slot)]``; every other slot of
    every page still holds its sentinel."""
    k_cache, v_cache = s["k_view"].cpu(), s["v_view"].cpu()
    key, value = s["key"].cpu(), s["value"].cpu()
    for page in range(k_cache.shape[0]):
        for slot in range(s["page_size"]):
            k, v = _slot(k_cache, layout, page, slot), _slot(v_cache, layout, page, slot)
            token = expected.get((page, slot))
            if token is None:
                assert bool((k == SENTINEL).all()) and bool((v == -SENTINEL).all()), (page, slot)
            else:
                assert torch.equal(k, key[token]) and torch.equal(v, value[token]), (page, slot)


def _expected_slots(s: dict) -> dict[tuple[int, int], int]:
    indptr, indices = s["kv_indptr"].cpu().tolist(), s["kv_indices"].cpu().tolist()
    slots = {}
    for i, (b, p) in enumerate(zip(s["batch"].cpu().tolist(), s["positions"].cpu().tolist())):
        assert p >= s["old_lens"][b]  # appended after the existing tokens
        slots[(indices[indptr[b] + p // s["page_size"]], p % s["page_size"])] = i
    return slots


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["single", "tuple"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2],
)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("dim", [128, 36])  # 16-byte vector path, element-wise path
def test_append_writes_exactly_the_appended_slots(form, layout, dtype, page_size, dim) -> None:
    s = _paged_setup(form, layout, dtype, page_size, page_size + dim, dim)
    _append(s, layout)
    expected = _expected_slots(s)
    assert len(expected) == s["key"].shape[0]
    _assert_only(s, layout, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["single_squeezed", "tuple_squeezed"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_size_one_caches_may_leave_out_the_page_dim(form: str, layout: str) -> None:
    s = _paged_setup(form, layout, torch.bfloat16, 1, 11)
    _append(s, layout)
    _assert_only(s, layout, _expected_slots(s))


@pytest.mark.gpu
def test_int64_indices_are_converted() -> None:
    s = _paged_setup("single", "HND", torch.float16, 4, 5, index_dtype=torch.int64)
    _append(s, "HND")
    _assert_only(s, "HND", _expected_slots(s))


def check_out_of_range_indices_are_skipped(device: str = "cuda") -> None:
    s = _paged_setup("tuple", "NHD", torch.float16, 4, 0, device=device)
    expected = _expected_slots(s)
    positions, batch = s["positions"].clone(), s["batch"].clone()
    positions[0] = 10_000  # beyond the pages request 0 owns
    batch[1] = 7  # no such request
    batch[2] = -1  # what get_batch_indices_positions gives a token no request owns
    positions[3] = -5
    _append(s, "NHD", batch_indices=batch, positions=positions)
    dropped = {0, 1, 2, 3}
    _assert_only(s, "NHD", {slot: t for slot, t in expected.items() if t not in dropped})


def check_ids_past_int32_are_skipped(device: str = "cuda") -> None:
    """int64 ids that an int32 cast would wrap onto real ones (2**32 + b onto b): the token
    of such a request or position, and the tokens of such a page, are skipped, not written
    where the wrapped id points."""
    s = _paged_setup("tuple", "NHD", torch.float16, 4, 1, index_dtype=torch.int64, device=device)
    expected = _expected_slots(s)
    batch, positions, pages = s["batch"].clone(), s["positions"].clone(), s["kv_indices"].clone()
    batch[1] += 2**32
    positions[2] += 2**32
    far_page = int(pages[-1])  # the last request's last page, where its token goes
    assert any(page == far_page for page, _ in expected)
    pages[-1] += 2**32
    _append(s, "NHD", batch_indices=batch, positions=positions, kv_indices=pages)
    _assert_only(
        s,
        "NHD",
        {slot: t for slot, t in expected.items() if t not in (1, 2) and slot[0] != far_page},
    )


def check_page_table_end_is_respected(device: str = "cuda") -> None:
    """kv_indptr points one entry past the end of kv_indices, a slice of a larger tensor
    whose next entry names a real page: reading it would write there, so that page must
    stay untouched."""
    s = _paged_setup("single", "HND", torch.bfloat16, 4, 2, device=device)
    expected = _expected_slots(s)
    trap = int(s["kv_indices"][-1])  # the last request's last page: its appended token's
    assert any(page == trap for page, _ in expected)
    _append(s, "HND", kv_indices=s["kv_indices"][:-1])
    _assert_only(s, "HND", {slot: t for slot, t in expected.items() if slot[0] != trap})


@pytest.mark.gpu
def test_out_of_range_indices_are_skipped_not_written() -> None:
    check_out_of_range_indices_are_skipped()


@pytest.mark.gpu
def test_ids_past_int32_are_skipped_not_wrapped() -> None:
    check_ids_past_int32_are_skipped()


@pytest.mark.gpu
def test_page_table_entries_past_kv_indices_are_never_read() -> None:
    """Issue 21: a CUDA kv_indptr is not validated on the host (see
    check_page_table_end_is_respected)."""
    check_page_table_end_is_respected()


@pytest.mark.gpu
def test_bad_cuda_append_indptr_is_harmless() -> None:
    """A decreasing CUDA append_indptr is not validated (that would sync): each token gets a
    request whose range holds it, or batch index -1 (which the append kernel skips) and
    position 0."""
    indptr, seq_lens, nnz = [0, 5, 2, 3], [5, 6, 7], 6
    batch, positions = flashinfer.get_batch_indices_positions(
        _i32(indptr, "cuda"), _i32(seq_lens, "cuda"), nnz
    )
    batch, positions = batch.tolist(), positions.tolist()
    assert batch[5] == -1 and positions[5] == 0  # token 5 lies in no request's range
    for t, (b, p) in enumerate(zip(batch, positions)):
        if b == -1:
            assert p == 0
        else:
            assert indptr[b] <= t < indptr[b + 1]
            assert p == seq_lens[b] - (indptr[b + 1] - indptr[b]) + t - indptr[b]
