"""The paged-KV append kernel's own source, run on the CPU by the emulator (tests/emu),
through the real API and binding: every appended token lands in its slot and no other slot
changes, for both layouts, every cache form, 16-bit and float32, 16-byte vectors and
element-wise rows, page sizes 1 to 16; tokens with out-of-range positions or requests are
skipped; a page table shorter than kv_indptr claims is never read past its end. The same
cases on a GPU are tests/ops/test_page.py's GPU tests, whose helpers these share."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest
import torch

from flashinfer import checks
from flashinfer import page as page_api
from flashinfer.jit.page import gen_page_module
from tests.compile import cpu_kernels
from tests.emu.module import EmulatedModule
from tests.ops.test_page import _append, _assert_only, _expected_slots, _paged_setup


@functools.cache
def _module(dtype: torch.dtype, land_at_issue: bool) -> EmulatedModule:
    return EmulatedModule(gen_page_module(dtype), {}, land_at_issue=land_at_issue)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedModule]]:
    """emulate(dtype): append_paged_kv_cache then runs the emulated module on CPU tensors."""

    def install(dtype: torch.dtype, land_at_issue: bool = False) -> EmulatedModule:
        module = _module(dtype, land_at_issue)
        module.launches.clear()
        monkeypatch.setattr(page_api, "get_page_module", lambda d: module)
        return module

    monkeypatch.setattr(checks, "check_cuda", lambda *a, **k: None)
    with cpu_kernels(page_api):
        yield install


@pytest.mark.parametrize(
    "form,layout,dtype,page_size,dim",
    [
        ("single", "NHD", torch.bfloat16, 16, 128),
        ("tuple", "HND", torch.float16, 4, 128),
        ("single", "HND", torch.float32, 1, 36),
        ("tuple", "NHD", torch.bfloat16, 4, 36),
        ("single_squeezed", "NHD", torch.float16, 1, 64),
        ("tuple_squeezed", "HND", torch.bfloat16, 1, 128),
    ],
)
def test_append_writes_exactly_the_appended_slots(
    emulate, form: str, layout: str, dtype: torch.dtype, page_size: int, dim: int
) -> None:
    module = emulate(dtype, land_at_issue=page_size == 4)
    s = _paged_setup(form, layout, dtype, page_size, page_size + dim, dim, device="cpu")
    _append(s, layout)
    expected = _expected_slots(s)
    assert len(expected) == s["key"].shape[0] and len(module.launches) == 1
    _assert_only(s, layout, expected)


def test_out_of_range_indices_are_skipped_not_written(emulate) -> None:
    emulate(torch.float16)
    s = _paged_setup("tuple", "NHD", torch.float16, 4, 0, device="cpu")
    expected = _expected_slots(s)
    positions, batch = s["positions"].clone(), s["batch"].clone()
    positions[0] = 10_000  # beyond the pages request 0 owns
    batch[1] = 7  # no such request
    batch[2] = -1  # what get_batch_indices_positions gives a token no request owns
    positions[3] = -5
    _append(s, "NHD", batch_indices=batch, positions=positions)
    dropped = {0, 1, 2, 3}
    _assert_only(s, "NHD", {slot: t for slot, t in expected.items() if t not in dropped})


def test_page_table_entries_past_kv_indices_are_never_read(
    emulate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kv_indptr points one entry past a kv_indices slice whose next element names a real
    page: the kernel must not read it nor write that page. A CUDA kv_indptr is not checked
    on the host (that would synchronize); the CPU one here is let through the same way."""
    emulate(torch.bfloat16)
    monkeypatch.setattr(page_api.ragged, "check_indptr", lambda *a, **k: None)
    s = _paged_setup("single", "HND", torch.bfloat16, 4, 2, device="cpu")
    expected = _expected_slots(s)
    trap = int(s["kv_indices"][-1])
    assert any(page == trap for page, _ in expected)
    _append(s, "HND", kv_indices=s["kv_indices"][:-1])
    _assert_only(s, "HND", {slot: t for slot, t in expected.items() if slot[0] != trap})
