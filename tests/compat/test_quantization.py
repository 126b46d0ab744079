"""packbits / segment_packbits against the reference library's signatures and docstring
examples.

Parameter lists and examples as in flashinfer-ai/flashinfer flashinfer/quantization.py at
commit 0478a48cdf32d0b5a4f84b4b9c9e21d51ea8972a (the same at
3f48ad3922b8abd0405da1ac4be29328c89b73d3).
"""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import quantization

from .signature import assert_signature

SIGNATURES = {
    "packbits": "(x, bitorder='big')",
    "segment_packbits": "(x, indptr, bitorder='big')",
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(getattr(quantization, name), SIGNATURES[name])


def test_docstring_examples_values() -> None:
    """The reference's examples (CUDA there; ours also runs on the CPU)."""
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    assert list(map(bin, quantization.packbits(x).tolist())) == ["0b10110011"]
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    x_packed, new_indptr = quantization.segment_packbits(
        x, torch.tensor([0, 4, 7, 11]), bitorder="big"
    )
    assert list(map(bin, x_packed.tolist())) == ["0b10110000", "0b100000", "0b11010000"]
    assert new_indptr.tolist() == [0, 1, 2, 3] and new_indptr.dtype == torch.int32


def test_call_forms() -> None:
    x = torch.ones(9, dtype=torch.bool)
    assert quantization.packbits(x=x, bitorder="little").tolist() == [255, 1]
    y, new_indptr = quantization.segment_packbits(
        x=x, indptr=torch.tensor([0, 9], dtype=torch.int32), bitorder="little"
    )
    assert y.tolist() == [255, 1] and new_indptr.tolist() == [0, 2]


def test_quantization_functions_are_exported_at_the_top_level() -> None:
    assert set(SIGNATURES) <= set(flashinfer.__all__)
    assert flashinfer.packbits is quantization.packbits
    assert flashinfer.segment_packbits is quantization.segment_packbits
