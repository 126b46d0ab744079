"""Readable descriptions and statistics of call arguments, for the debugging tools.

One implementation serves API logging and the kernel-launch debug printer. Nothing
here raises on odd values: anything it cannot describe falls back to a cut ``repr``.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch

MAX_ITEMS = 8
MAX_REPR = 200


def graph_capture_in_progress() -> bool:
    """True while the current CUDA stream is capturing a graph (no syncs allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def describe_tensor(t: torch.Tensor) -> str:
    contiguous = t.is_contiguous()
    parts = [
        f"shape={tuple(t.shape)}",
        f"dtype={dtype_name(t.dtype)}",
        f"device={t.device}",
        f"requires_grad={t.requires_grad}",
        f"is_contiguous={contiguous}",
    ]
    if not contiguous:
        parts.append(f"stride={tuple(t.stride())}")
    return f"Tensor({', '.join(parts)})"


_SMALL = 256  # up to this many elements, one host copy beats a dozen reductions


def tensor_stats(t: torch.Tensor, with_std: bool = False) -> dict[str, Any]:
    """Statistics that make sense for the dtype, computed in float32; one device sync.

    Floating tensors: min, max, mean (and std) of the finite values, plus NaN and Inf
    counts. Integers: min, max, mean. Bools: true/false counts. Empty: ``numel=0``.
    """
    n = t.numel()
    if n == 0:
        return {"numel": 0}
    data = t.detach()
    if data.dtype == torch.bool:
        true_count = int(data.sum().item())
        return {"true_count": true_count, "false_count": n - true_count}
    if data.is_complex():
        data = data.abs()
    floating = data.is_floating_point()
    if n <= _SMALL:  # integers stay exact as Python ints
        values = (data.float() if floating else data).flatten().tolist()
        finite = [v for v in values if math.isfinite(v)]
        nan_count = sum(1 for v in values if v != v)
        inf_count = n - len(finite) - nan_count
        if finite:
            mean = math.fsum(finite) / len(finite)
            summary = [min(finite), max(finite), mean,
                       math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
                       if len(finite) > 1 else 0.0]
        else:
            summary = [math.nan] * 4
    else:
        f = data.float() if floating else data.double()  # double: exact up to 2**53
        finite_mask = torch.isfinite(f)
        count = finite_mask.sum()
        zeroed = torch.where(finite_mask, f, 0.0)
        mean_t = zeroed.sum() / count
        var_t = (torch.where(finite_mask, f - mean_t, 0.0) ** 2).sum() / (count - 1).clamp(min=1)
        inf = torch.tensor(math.inf, device=f.device, dtype=f.dtype)
        packed = torch.stack([
            torch.where(finite_mask, f, inf).min(), torch.where(finite_mask, f, -inf).max(),
            mean_t, var_t.sqrt(), torch.isnan(f).sum().float(), count.float(),
        ]).tolist()
        summary = packed[:4]
        nan_count = int(packed[4])
        inf_count = n - int(packed[5]) - nan_count
        if int(packed[5]) == 0:
            summary = [math.nan] * 4
    if not floating:
        stats: dict[str, Any] = {"min": int(summary[0]), "max": int(summary[1]),
                                 "mean": summary[2]}
        if with_std:
            stats["std"] = summary[3]
        return stats
    stats = {"min": summary[0], "max": summary[1], "mean": summary[2]}
    if with_std:
        stats["std"] = summary[3]
    stats["nan_count"] = nan_count
    stats["inf_count"] = inf_count
    return stats


def format_stats(stats: dict[str, Any]) -> str:
    if stats.get("numel") == 0:
        return "[statistics: empty tensor]"
    parts = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()]
    return "[" + ", ".join(parts) + "]"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."


def format_value(value: Any, depth: int = 0) -> str:
    """A one-line description of any argument; never raises."""
    try:
        if isinstance(value, torch.Tensor):
            return describe_tensor(value)
        if value is None or isinstance(value, (bool, int, float)):
            return repr(value)
        if isinstance(value, enum.Enum):
            return f"{type(value).__name__}.{value.name}"
        if isinstance(value, str):
            return _cut(repr(value))
        if isinstance(value, (torch.dtype, torch.device)):
            return str(value)
        if isinstance(value, (list, tuple)) and depth < 2:
            items = [format_value(v, depth + 1) for v in value[:MAX_ITEMS]]
            if len(value) > MAX_ITEMS:
                items.append(f"... (+{len(value) - MAX_ITEMS} more, {len(value)} total)")
            open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
            return open_ + ", ".join(items) + close
        if isinstance(value, dict) and depth < 2:
            items = [
                f"{format_value(k, depth + 1)}: {format_value(v, depth + 1)}"
                for k, v in list(value.items())[:MAX_ITEMS]
            ]
            if len(value) > MAX_ITEMS:
                items.append(f"... (+{len(value) - MAX_ITEMS} more, {len(value)} total)")
            return "{" + ", ".join(items) + "}"
        return _cut(repr(value))
    except Exception as err:  # a broken __repr__ must not break the call being logged
        return f"<{type(value).__name__}: unprintable ({type(err).__name__})>"
