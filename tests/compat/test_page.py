"""flashinfer.page as a drop-in for the reference's (flashinfer-ai/flashinfer flashinfer/page.py,
read at d60935692b50bfb201f087c11850cb94265b4e6b, and a later version whose
get_batch_indices_positions takes the batch_indices/positions output buffers): signatures,
call forms, the docstring examples' values, and how each cache form reaches the kernel (no
copy)."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import flashinfer
from flashinfer import checks
from flashinfer import page as page_api

from ..compile import cpu_kernels
from .signature import assert_signature


def test_signatures() -> None:
    assert_signature(
        flashinfer.append_paged_kv_cache,
        "(append_key, append_value, batch_indices, positions, paged_kv_cache, "
        "kv_indices, kv_indptr, kv_last_page_len, kv_layout='NHD')",
    )
    assert_signature(
        flashinfer.get_batch_indices_positions,
        "(append_indptr, seq_lens, nnz, batch_indices=None, positions=None)",
    )
    assert_signature(flashinfer.get_seq_lens, "(kv_indptr, kv_last_page_len, page_size)")


def test_docstring_examples_values() -> None:
    """The reference's examples, on CPU tensors (ours also runs there)."""
    batch, positions = flashinfer.get_batch_indices_positions(
        torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32), torch.tensor([5, 5, 5, 5]), 10
    )
    assert batch.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert positions.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]
    assert batch.dtype == positions.dtype == torch.int32
    out = (torch.empty(10, dtype=torch.int32), torch.empty(10, dtype=torch.int32))
    batch, positions = flashinfer.get_batch_indices_positions(
        torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32), torch.tensor([5, 5, 5, 5]), 10, *out
    )
    assert batch is out[0] and positions is out[1]
    assert positions.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]
    kv_page_indptr = torch.tensor([0, 3, 4, 6, 8], dtype=torch.int32)
    kv_last_page_len = torch.tensor([13, 8, 9, 6], dtype=torch.int32)
    seq_lens = flashinfer.get_seq_lens(kv_page_indptr, kv_last_page_len, 16)
    assert seq_lens.tolist() == [45, 8, 25, 22]
    append_indptr = torch.tensor([0, 45, 53, 78, 100], dtype=torch.int32)
    batch, positions = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 100)
    lengths = [45, 8, 25, 22]
    assert batch.tolist() == [b for b, n in enumerate(lengths) for _ in range(n)]
    assert positions.tolist() == [p for n in lengths for p in range(n)]


class Recorder:
    """Stands in for the compiled module: records what append_paged_kv_cache passes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def append_paged_kv_cache(self, *args) -> None:  # noqa: ANN002
        self.calls.append(args)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """Lets CPU tensors through the device check and the op, and records the module call."""
    module = Recorder()
    monkeypatch.setattr(page_api, "get_page_module", lambda dtype: module)
    monkeypatch.setattr(checks, "check_cuda", lambda name, tensor, like=None: None)
    with cpu_kernels(page_api):
        yield module


def _inputs(layout: str, page_size: int = 16, index_dtype: torch.dtype = torch.int32):  # noqa: ANN202
    nnz, heads, dim, pages = 5, 2, 8, 6
    page = (page_size, heads, dim) if layout == "NHD" else (heads, page_size, dim)
    ids = dict(dtype=index_dtype)
    return dict(
        append_key=torch.randn(nnz, heads, dim, dtype=torch.float16),
        append_value=torch.randn(nnz, heads, dim, dtype=torch.float16),
        batch_indices=torch.tensor([0, 0, 1, 1, 1], **ids),
        positions=torch.tensor([0, 1, 0, 1, 2], **ids),
        paged_kv_cache=torch.zeros(pages, 2, *page, dtype=torch.float16),
        kv_indices=torch.tensor([4, 1, 2, 0, 3], **ids),
        kv_indptr=torch.tensor([0, 2, 5], **ids),
        kv_last_page_len=torch.tensor([2, 3], **ids),
    )


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_positional_and_keyword_calls_with_a_5d_cache(recorder, layout: str) -> None:
    a = _inputs(layout)
    flashinfer.append_paged_kv_cache(*a.values(), layout)
    flashinfer.append_paged_kv_cache(**a, kv_layout=layout)
    if layout == "NHD":
        flashinfer.append_paged_kv_cache(*a.values())
    cache = a["paged_kv_cache"]
    for call in recorder.calls:
        k_cache, v_cache, hnd = call[4], call[5], call[9]
        assert k_cache.data_ptr() == cache.data_ptr()  # views of the one tensor, no copy
        assert v_cache.data_ptr() == cache[:, 1].data_ptr()
        assert k_cache.shape == v_cache.shape == cache.shape[:1] + cache.shape[2:]
        assert hnd == (layout == "HND")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_tuple_caches_and_page_size_one_forms(recorder, layout: str) -> None:
    a = _inputs(layout)
    five = a.pop("paged_kv_cache")
    k, v = five[:, 0].clone(), five[:, 1].clone()
    flashinfer.append_paged_kv_cache(**a, paged_kv_cache=(k, v), kv_layout=layout)
    assert recorder.calls[-1][4] is k and recorder.calls[-1][5] is v
    one = _inputs(layout, page_size=1)["paged_kv_cache"]
    slot = 2 if layout == "NHD" else 3  # the page_size dim of the 5-D form
    for form in (one.squeeze(slot), (one[:, 0].squeeze(slot - 1), one[:, 1].squeeze(slot - 1))):
        flashinfer.append_paged_kv_cache(**a, paged_kv_cache=form, kv_layout=layout)
        k_cache = recorder.calls[-1][4]
        assert k_cache.dim() == 4 and k_cache.shape[slot - 1] == 1
        assert k_cache.data_ptr() == one.data_ptr()


def test_int64_indices_reach_the_kernel_as_int32(recorder) -> None:
    flashinfer.append_paged_kv_cache(**_inputs("NHD", index_dtype=torch.int64))
    call = recorder.calls[-1]
    for i in (2, 3, 6, 7, 8):
        assert call[i].dtype == torch.int32
    assert call[6].tolist() == [4, 1, 2, 0, 3]


def test_every_form_gets_to_the_device_check() -> None:
    a = _inputs("HND")
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(*a.values(), "HND")
    a["paged_kv_cache"] = (a["paged_kv_cache"][:, 0], a["paged_kv_cache"][:, 1])
    with pytest.raises(ValueError, match="append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(**a, kv_layout="HND")
