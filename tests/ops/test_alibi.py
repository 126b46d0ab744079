"""ALiBi's slopes (flashinfer.alibi): the paper's definition, as the reference computes them,
and the device copy in the kernels' log2 units."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer.utils
from flashinfer.alibi import alibi_slopes_log2, get_alibi_slopes
from flashinfer.testing.reference import alibi_slopes


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 8, 12, 32, 40, 64, 96])
def test_slopes_follow_the_definition(n_heads: int) -> None:
    """Powers of 2^(-8/n) for the first n (a power of two) heads, odd powers of 2^(-4/n) for
    the rest: 8 heads get 1/2, 1/4, ..., 1/256; 12 add 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    slopes = get_alibi_slopes(n_heads)
    assert slopes.dtype == torch.float32 and slopes.shape == (n_heads,)
    torch.testing.assert_close(slopes.double(), alibi_slopes(n_heads), rtol=1e-7, atol=0)
    if n_heads == 12:
        assert slopes[8:].tolist() == pytest.approx([2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5])
    assert flashinfer.utils.get_alibi_slopes is get_alibi_slopes  # the reference's home


def test_device_copy_is_in_log2_units_and_made_once() -> None:
    first = alibi_slopes_log2(8, torch.device("cpu"))
    assert first is alibi_slopes_log2(8, torch.device("cpu"))
    torch.testing.assert_close(first, get_alibi_slopes(8) / math.log(2))


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_bad_head_counts_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="n_heads must be a positive int"):
        get_alibi_slopes(bad)  # type: ignore[arg-type]
