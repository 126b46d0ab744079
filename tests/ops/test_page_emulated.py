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

from flashinfer import page as page_api
from flashinfer.jit.page import gen_page_module
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.ops.test_page import (
    _append,
    _assert_only,
    _expected_slots,
    _paged_setup,
    check_ids_past_int32_are_skipped,
    check_out_of_range_indices_are_skipped,
    check_page_table_end_is_respected,
)


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

    with on_cpu_tensors(monkeypatch, page_api):
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
        ("tuple", "NHD", torch.float8_e4m3fn, 4, 128),
        ("single", "HND", torch.float8_e5m2, 16, 36),
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
    check_out_of_range_indices_are_skipped(device="cpu")


def test_ids_past_int32_are_skipped_not_wrapped(emulate) -> None:
    emulate(torch.float16)
    check_ids_past_int32_are_skipped(device="cpu")


def test_page_table_entries_past_kv_indices_are_never_read(
    emulate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA kv_indptr is not checked on the host (that would synchronize); the CPU one here
    is let through the same way."""
    emulate(torch.bfloat16)
    monkeypatch.setattr(page_api.ragged, "check_indptr", lambda *a, **k: None)
    check_page_table_end_is_respected(device="cpu")
