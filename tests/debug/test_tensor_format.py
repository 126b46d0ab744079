"""Tensor statistics and value formatting shared by the debugging tools."""

from __future__ import annotations

import math

import pytest
import torch

from flashinfer.tensor_format import format_stats, format_value, tensor_stats


@pytest.mark.parametrize("n", [7, 256, 257, 5000])  # both sides of the small-tensor path
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_statistics_match_torch(n: int, dtype: torch.dtype) -> None:
    torch.manual_seed(n)
    x = (torch.randn(n) * 3 + 1).to(dtype)
    x[n // 2] = float("nan")
    x[n // 3] = float("inf")
    stats = tensor_stats(x, with_std=True)
    finite = x.float()[torch.isfinite(x.float())].double()
    assert stats["nan_count"] == 1 and stats["inf_count"] == (1 if n // 3 != n // 2 else 0)
    assert stats["min"] == pytest.approx(finite.min().item())
    assert stats["max"] == pytest.approx(finite.max().item())
    assert stats["mean"] == pytest.approx(finite.mean().item(), rel=1e-4, abs=1e-5)
    assert stats["std"] == pytest.approx(finite.std().item(), rel=1e-4)


@pytest.mark.parametrize("n", [5, 1000])
def test_integer_statistics_are_exact(n: int) -> None:
    x = torch.arange(n, dtype=torch.int64) + (1 << 40)
    stats = tensor_stats(x, with_std=True)
    assert stats["min"] == 1 << 40 and stats["max"] == (1 << 40) + n - 1
    assert stats["mean"] == pytest.approx((1 << 40) + (n - 1) / 2)
    assert "nan_count" not in stats


def test_special_cases() -> None:
    assert tensor_stats(torch.empty(0, 4)) == {"numel": 0}
    assert tensor_stats(torch.tensor([True, True, False])) == {"true_count": 2, "false_count": 1}
    all_nan = tensor_stats(torch.full((300,), float("nan")))
    assert math.isnan(all_nan["min"]) and all_nan["nan_count"] == 300
    assert tensor_stats(torch.tensor(3.5)) == {
        "min": 3.5, "max": 3.5, "mean": 3.5, "nan_count": 0, "inf_count": 0}
    assert format_stats({"numel": 0}) == "[statistics: empty tensor]"
    assert format_stats({"min": 1.0, "nan_count": 2}) == "[min=1, nan_count=2]"


def test_format_value_truncates_and_describes() -> None:
    assert format_value(tuple(range(10))) == "(0, 1, 2, 3, 4, 5, 6, 7, ... (+2 more, 10 total))"
    assert format_value("x" * 500).endswith("...") and len(format_value("x" * 500)) == 200
    assert format_value(torch.device("cpu")) == "cpu"
    assert format_value(torch.zeros(2, 3)[:, :2]).endswith("is_contiguous=False, stride=(3, 1))")
