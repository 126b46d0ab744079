"""Paged KV append: index helper values and argument checks (CPU), every page slot (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import page as page_api


def _i32(values: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def test_batch_indices_and_positions() -> None:
    # request 0 appends 3 tokens reaching length 10; request 1 appends 1 reaching 1; 2 appends 2
    batch, positions = flashinfer.get_batch_indices_positions(_i32([0, 3, 4, 6]),
                                                              _i32([10, 1, 7]), 6)
    assert batch.tolist() == [0, 0, 0, 1, 2, 2]
    assert positions.tolist() == [7, 8, 9, 0, 5, 6]
    assert batch.dtype == positions.dtype == torch.int32
    with pytest.raises(ValueError, match="seq_lens has 2 elements, expected 3"):
        flashinfer.get_batch_indices_positions(_i32([0, 3, 4, 6]), _i32([10, 1]), 6)
    with pytest.raises(TypeError, match="append_indptr has dtype torch.int64"):
        flashinfer.get_batch_indices_positions(torch.tensor([0, 1]), _i32([1]), 1)
    with pytest.raises(ValueError, match="nnz must be an int >= 0"):
        flashinfer.get_batch_indices_positions(_i32([0, 1]), _i32([1]), -1)


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(page_api, "get_page_module", refuse)


def _args(**overrides):  # noqa: ANN202
    nnz, heads, dim, pages, page_size = 3, 2, 16, 4, 8
    args = dict(
        append_key=torch.randn(nnz, heads, dim, dtype=torch.float16),
        append_value=torch.randn(nnz, heads, dim, dtype=torch.float16),
        batch_indices=_i32([0, 0, 1]), positions=_i32([0, 1, 0]),
        paged_k_cache=torch.zeros(pages, page_size, heads, dim, dtype=torch.float16),
        paged_v_cache=torch.zeros(pages, page_size, heads, dim, dtype=torch.float16),
        kv_indices=_i32([0, 1]), kv_indptr=_i32([0, 1, 2]), kv_last_page_len=_i32([2, 1]),
        kv_layout="NHD",
    )
    args.update(overrides)
    return args


BAD = [
    ("append_key must be 3-D", ValueError, dict(append_key=torch.zeros(3, 32))),
    ("append_value has shape", ValueError, dict(append_value=torch.zeros(3, 2, 8, dtype=torch.float16))),
    ("kv_layout must be 'NHD' or 'HND'", ValueError, dict(kv_layout="NDH")),
    ("paged_k_cache holds 8 heads of dim 16 \\(HND\\)", ValueError, dict(kv_layout="HND")),
    ("paged_v_cache has dtype torch.bfloat16", TypeError,
     dict(paged_v_cache=torch.zeros(4, 8, 2, 16, dtype=torch.bfloat16))),
    ("positions has 2 elements, expected 3", ValueError, dict(positions=_i32([0, 1]))),
    ("kv_indices has dtype torch.int64", TypeError, dict(kv_indices=torch.tensor([0, 1]))),
    ("kv_last_page_len has 3 elements, expected 2", ValueError,
     dict(kv_last_page_len=_i32([1, 1, 1]))),
    ("append_key must be a CUDA tensor", ValueError, dict()),
]


@pytest.mark.parametrize("message,error,overrides", BAD, ids=[b[0][:40] for b in BAD])
def test_bad_arguments_raise_before_launch(no_launch, message, error, overrides) -> None:
    with pytest.raises(error, match=message):
        flashinfer.append_paged_kv_cache(**_args(**overrides))


def test_the_binding_checks_too() -> None:
    module = page_api.get_page_module(torch.float16)
    a = _args()
    call = [a["append_key"], a["append_value"], a["batch_indices"], a["positions"],
            a["paged_k_cache"], a["paged_v_cache"], a["kv_indices"], a["kv_indptr"],
            a["kv_last_page_len"], False]
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        module.append_paged_kv_cache(*call)
    call[9] = True
    with pytest.raises(ValueError, match="paged_k_cache holds 8 heads"):
        module.append_paged_kv_cache(*call)


# -- GPU -------------------------------------------------------------------------------------

SENTINEL = 1234.0


def _paged_setup(layout: str, dtype: torch.dtype, page_size: int, seed: int,
                 dim: int = 128):  # noqa: ANN202
    """Three requests with existing lengths, a shuffled page table, and appended tokens."""
    torch.manual_seed(seed)
    heads = 4
    old_lens, add_lens = [5, 0, 17], [3, 9, 1]
    new_lens = [o + a for o, a in zip(old_lens, add_lens)]
    pages_per = [(n + page_size - 1) // page_size for n in new_lens]
    num_pages = sum(pages_per) + 3  # spare pages that must stay untouched
    page_ids = torch.randperm(num_pages)[: sum(pages_per)].to(torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32)
    last = [n - (p - 1) * page_size for n, p in zip(new_lens, pages_per)]
    shape = ((num_pages, page_size, heads, dim) if layout == "NHD"
             else (num_pages, heads, page_size, dim))
    k_cache = torch.full(shape, SENTINEL, dtype=dtype, device="cuda")
    v_cache = torch.full(shape, -SENTINEL, dtype=dtype, device="cuda")
    nnz = sum(add_lens)
    key = torch.randn(nnz, heads, dim, dtype=dtype, device="cuda")
    value = torch.randn(nnz, heads, dim, dtype=dtype, device="cuda")
    append_indptr = torch.tensor([0, *torch.tensor(add_lens).cumsum(0).tolist()],
                                 dtype=torch.int32, device="cuda")
    batch, positions = flashinfer.get_batch_indices_positions(
        append_indptr, torch.tensor(new_lens, dtype=torch.int32, device="cuda"), nnz)
    return dict(key=key, value=value, batch=batch, positions=positions, k_cache=k_cache,
                v_cache=v_cache, kv_indices=page_ids.cuda(), kv_indptr=kv_indptr.cuda(),
                last=torch.tensor(last, dtype=torch.int32, device="cuda"), page_size=page_size)


def _slot(cache: torch.Tensor, layout: str, page: int, slot: int) -> torch.Tensor:
    return cache[page, slot] if layout == "NHD" else cache[page, :, slot]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("dim", [128, 36])  # 16-byte vector path, element-wise path
def test_append_writes_exactly_the_appended_slots(layout, dtype, page_size, dim) -> None:
    s = _paged_setup(layout, dtype, page_size, page_size, dim)
    flashinfer.append_paged_kv_cache(s["key"], s["value"], s["batch"], s["positions"],
                                     s["k_cache"], s["v_cache"], s["kv_indices"], s["kv_indptr"],
                                     s["last"], kv_layout=layout)
    k_cache, v_cache = s["k_cache"].cpu(), s["v_cache"].cpu()
    written = set()
    indptr, indices = s["kv_indptr"].cpu().tolist(), s["kv_indices"].cpu().tolist()
    for i, (b, p) in enumerate(zip(s["batch"].cpu().tolist(), s["positions"].cpu().tolist())):
        page = indices[indptr[b] + p // page_size]
        slot = p % page_size
        written.add((page, slot))
        assert torch.equal(_slot(k_cache, layout, page, slot), s["key"][i].cpu()), (i, b, p)
        assert torch.equal(_slot(v_cache, layout, page, slot), s["value"][i].cpu()), (i, b, p)
    for page in range(k_cache.shape[0]):  # every other slot still holds its sentinel
        for slot in range(page_size):
            if (page, slot) not in written:
                assert bool((_slot(k_cache, layout, page, slot) == SENTINEL).all())
                assert bool((_slot(v_cache, layout, page, slot) == -SENTINEL).all())


@pytest.mark.gpu
def test_out_of_range_indices_are_skipped_not_written() -> None:
    s = _paged_setup("NHD", torch.float16, 4, 0)
    positions = s["positions"].clone()
    positions[0] = 10_000  # beyond the pages request 0 owns
    batch = s["batch"].clone()
    batch[1] = 7  # no such request
    before_k = s["k_cache"].clone()
    flashinfer.append_paged_kv_cache(s["key"], s["value"], batch, positions, s["k_cache"],
                                     s["v_cache"], s["kv_indices"], s["kv_indptr"], s["last"])
    torch.cuda.synchronize()
    changed = (s["k_cache"] != before_k).any(dim=(2, 3)).sum().item()
    assert changed == s["key"].shape[0] - 2  # every token but the two bad ones
