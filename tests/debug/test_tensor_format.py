"""Tensor statistics and value formatting shared by the debugging tools."""

from __future__ import annotations

import enum
import math

import pytest
import torch

from flashinfer.tensor_format import (
    format_stats,
    format_value,
    stats_fields,
    tensor_block,
    tensor_stats,
    value_lines,
)


@pytest.mark.parametrize("n", [1, 7, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_float_statistics_match_torch(n: int, dtype: torch.dtype) -> None:
    torch.manual_seed(n)
    x = (torch.randn(n) * 3 + 1).to(dtype)
    stats = tensor_stats(x, with_std=True)
    f = x.double()
    assert stats["min"] == f.min().item() and stats["max"] == f.max().item()
    assert stats["mean"] == pytest.approx(f.mean().item(), rel=1e-5, abs=1e-6)
    assert stats["std"] == (pytest.approx(f.std().item(), rel=1e-5) if n > 1 else 0.0)
    assert stats["nan_count"] == 0 and stats["inf_count"] == 0


def test_statistics_are_over_all_elements() -> None:
    """As torch reduces: a NaN makes min, max and mean NaN; an Inf shows in min or max."""
    x = torch.arange(10.0)
    x[3] = float("nan")
    stats = tensor_stats(x)
    assert all(math.isnan(stats[k]) for k in ("min", "max", "mean"))
    assert stats["nan_count"] == 1 and stats["inf_count"] == 0
    y = torch.tensor([1.0, float("inf"), -2.0, float("-inf")], dtype=torch.bfloat16)
    stats = tensor_stats(y)
    assert stats["min"] == -math.inf and stats["max"] == math.inf and math.isnan(stats["mean"])
    assert stats["inf_count"] == 2
    z = torch.tensor([1.0, float("inf")])
    assert tensor_stats(z)["mean"] == math.inf


def test_counts_are_exact_past_float32_precision() -> None:
    x = torch.full((2**24 + 3,), float("nan"), dtype=torch.bfloat16)
    assert tensor_stats(x)["nan_count"] == 2**24 + 3


@pytest.mark.parametrize("n", [5, 1000])
def test_integer_statistics_are_exact(n: int) -> None:
    x = torch.arange(n, dtype=torch.int64) + (1 << 60)
    stats = tensor_stats(x, with_std=True)
    assert stats["min"] == 1 << 60 and stats["max"] == (1 << 60) + n - 1
    assert stats["mean"] == pytest.approx((1 << 60) + (n - 1) / 2)
    assert "nan_count" not in stats


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("n", [5, 1000])
def test_unsigned_statistics_are_exact(n: int, dtype: torch.dtype) -> None:
    """torch has no aminmax for uint16/32/64 (sampling's per-row seeds are uint64): the
    range is still exact, past 2^63 for uint64."""
    top = torch.iinfo(dtype).max if dtype != torch.uint64 else 2**64 - 1
    values = [top - 3, 7, *range(100, 100 + n - 2)]
    x = torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64)
    x = x.to(dtype) if dtype != torch.uint64 else x.view(torch.uint64)
    stats = tensor_stats(x, with_std=True)
    assert (stats["min"], stats["max"]) == (7, top - 3)
    assert stats["mean"] == pytest.approx(sum(values) / n, rel=1e-9)


def test_special_cases() -> None:
    assert tensor_stats(torch.empty(0, 4)) == {"numel": 0}
    assert tensor_stats(torch.tensor([True, True, False])) == {"true_count": 2, "false_count": 1}
    assert tensor_stats(torch.tensor(3.5)) == {
        "min": 3.5,
        "max": 3.5,
        "mean": 3.5,
        "nan_count": 0,
        "inf_count": 0,
    }
    assert tensor_stats(torch.tensor([3 + 4j, 0j]))["max"] == 5.0  # complex: by magnitude
    assert format_stats({"numel": 0}) == "[statistics: empty tensor]"
    assert format_stats({"min": 1.0, "nan_count": 2}) == "[min=1, nan_count=2]"


def test_stats_fields_have_six_decimals_and_integer_counts() -> None:
    assert stats_fields(torch.tensor([0.5, -1.25, float("nan")])) == [
        "min=nan",
        "max=nan",
        "mean=nan",
        "nan_count=1",
        "inf_count=0",
    ]
    assert stats_fields(torch.tensor([2, 4], dtype=torch.int32)) == [
        "min=2",
        "max=4",
        "mean=3.000000",
    ]
    assert stats_fields(torch.empty(0)) == []


def test_tensor_block_one_field_a_line() -> None:
    t = torch.zeros(2, 3)[:, :2]
    assert tensor_block(t, "  ", stats=False) == [
        "  Tensor(",
        "    shape=(2, 2)",
        "    dtype=torch.float32",
        "    device=cpu",
        "    requires_grad=False",
        "    is_contiguous=False",
        "    stride=(3, 1)",
        "  )",
    ]
    assert tensor_block(torch.ones(1, requires_grad=True), "", stats=True)[4:-1] == [
        "  requires_grad=True",
        "  is_contiguous=True",
        "  min=1.000000",
        "  max=1.000000",
        "  mean=1.000000",
        "  nan_count=0",
        "  inf_count=0",
    ]


def test_value_lines_nest_containers_of_tensors_only() -> None:
    assert value_lines([1, 2], "  ", stats=False) == ["  [1, 2]"]
    lines = value_lines((torch.ones(1), 2.5), "", stats=False)
    assert lines[:3] == ["(", "  [0]:", "    Tensor("] and lines[-3:] == ["  [1]:", "    2.5", ")"]


class _Color(enum.Enum):
    RED = "r"


def test_format_value_truncates_and_describes() -> None:
    assert format_value(tuple(range(10))) == "(0, 1, 2, 3, 4, 5, 6, 7, ... (+2 more, 10 total))"
    assert format_value("x" * 500).endswith("...") and len(format_value("x" * 500)) == 200
    assert format_value(torch.device("cpu")) == "cpu"
    assert format_value(torch.bfloat16) == "torch.bfloat16"
    assert format_value(_Color.RED) == "_Color.RED (value='r')"
    assert format_value(torch.zeros(2, 3)[:, :2]).endswith("is_contiguous=False, stride=(3, 1))")
