"""Readable descriptions and statistics of call arguments, for the debugging tools.

One implementation serves API logging (the multi-line ``Tensor(`` blocks of the reference's
log format) and the kernel-launch debug printer (one line per argument). Nothing here
raises on odd values: anything it cannot describe falls back to a cut ``repr``.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch

MAX_ITEMS = 8
MAX_REPR = 200
CAPTURE_NOTE = "[statistics skipped: CUDA graph capture in progress]"


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
    """One line: the metadata of :func:`tensor_block` (for one-line contexts)."""
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


_SMALL = 256  # up to this many elements, one host copy beats a handful of reductions


def tensor_stats(t: torch.Tensor, with_std: bool = False) -> dict[str, Any]:
    """Statistics over all elements, as torch reduces them.

    A NaN anywhere makes min, max and mean NaN (that is how a log shows it); an Inf shows
    in min or max. Floating tensors (complex by magnitude): min, max, mean (and std),
    nan_count, inf_count. Integers: exact min and max, mean (and std). Bools: true/false
    counts. Empty: ``numel=0``. Up to ``_SMALL`` elements the values are copied to the host
    once and summarized in double precision; larger tensors are reduced where they live
    (float32 math, float64 for float64 and integers) and read back in one or two copies.
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
    if floating and data.dtype != torch.float64:
        data = data.float()
    if n <= _SMALL:
        low, high, mean, std, nan_count, inf_count = _host_summary(
            data.flatten().tolist(), with_std
        )
    else:
        low, high, mean, std, nan_count, inf_count = _device_summary(data, floating, with_std)
    if not floating:
        low, high = int(low), int(high)
    stats: dict[str, Any] = {"min": low, "max": high, "mean": mean}
    if with_std:
        stats["std"] = std
    if floating:
        stats["nan_count"], stats["inf_count"] = nan_count, inf_count
    return stats


Summary = tuple[Any, Any, float, float, int, int]  # min, max, mean, std, nan and inf counts


def _host_summary(values: list[Any], with_std: bool) -> Summary:
    """From the values copied to the host: exact, in double precision (std 0 unless asked)."""
    n = len(values)
    nan_count = sum(map(math.isnan, values))
    inf_count = sum(map(math.isinf, values))
    if nan_count:
        return math.nan, math.nan, math.nan, math.nan, nan_count, inf_count
    mean = (sum(values) if inf_count else math.fsum(values)) / n  # fsum refuses inf - inf
    if n == 1 or not with_std:
        std = 0.0
    elif inf_count:
        std = math.nan
    else:
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return min(values), max(values), mean, std, 0, inf_count


def _device_summary(data: torch.Tensor, floating: bool, with_std: bool) -> Summary:
    """Reductions where the tensor lives, each group copied to the host at once."""
    if floating:
        low, high = torch.aminmax(data)
        spread = data.std() if with_std else data.new_zeros(())
        parts = [low, high, data.mean(), spread, torch.isnan(data).sum(), torch.isinf(data).sum()]
        v = torch.stack([p.double() for p in parts]).tolist()  # counts exact to 2**53
        return v[0], v[1], v[2], v[3], int(v[4]), int(v[5])
    low, high = _integer_range(data)
    wide = data.double()
    mean, std = torch.stack([wide.mean(), wide.std() if with_std else wide.new_zeros(())]).tolist()
    return low, high, mean, std, 0, 0


def _integer_range(data: torch.Tensor) -> tuple[int, int]:
    """Exact min and max of an integer tensor of any width. torch has no aminmax for
    uint16/32/64 (a per-row uint64 seed tensor is one): those narrower than 64 bits widen to
    int64; uint64 is read as int64 with the sign bit flipped, which orders as unsigned."""
    if data.dtype in (torch.uint16, torch.uint32):
        data = data.to(torch.int64)
    elif data.dtype == torch.uint64:
        flipped = data.view(torch.int64) ^ torch.iinfo(torch.int64).min
        low, high = torch.stack(torch.aminmax(flipped)).tolist()
        return low + 2**63, high + 2**63
    low, high = torch.stack(torch.aminmax(data)).tolist()
    return low, high


def format_stats(stats: dict[str, Any]) -> str:
    """One line, for the debug printer: ``[min=0.5, max=3, ...]``."""
    if stats.get("numel") == 0:
        return "[statistics: empty tensor]"
    parts = [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()]
    return "[" + ", ".join(parts) + "]"


def stats_fields(t: torch.Tensor) -> list[str]:
    """The level-5 lines of a ``Tensor(`` block: floats with six decimals, counts as integers.

    During CUDA graph capture nothing is computed (a sync would invalidate the capture):
    one line says so. An empty tensor has no statistics."""
    if graph_capture_in_progress():
        return [CAPTURE_NOTE]
    try:
        stats = tensor_stats(t)
    except Exception as err:  # noqa: BLE001 - e.g. a meta tensor: the log goes on
        return [f"[statistics error: {type(err).__name__}: {_cut(str(err))}]"]
    if stats.get("numel") == 0:
        return []
    return [f"{k}={v:.6f}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()]


def tensor_block(t: torch.Tensor, pad: str, stats: bool) -> list[str]:
    """The multi-line ``Tensor(`` block of the log, one field a line, indented by ``pad``."""
    inner = pad + "  "
    contiguous = t.is_contiguous()
    lines = [
        f"{pad}Tensor(",
        f"{inner}shape={tuple(t.shape)}",
        f"{inner}dtype={t.dtype}",
        f"{inner}device={t.device}",
        f"{inner}requires_grad={t.requires_grad}",
        f"{inner}is_contiguous={contiguous}",
    ]
    if not contiguous:
        lines.append(f"{inner}stride={tuple(t.stride())}")
    if stats:
        lines += [inner + field for field in stats_fields(t)]
    lines.append(f"{pad})")
    return lines


def _holds_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth >= 2:
        return False
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, depth + 1) for v in value[:MAX_ITEMS])
    if isinstance(value, dict):
        return any(_holds_tensor(v, depth + 1) for v in list(value.values())[:MAX_ITEMS])
    return False


def _more(total: int) -> str:
    return f"... (+{total - MAX_ITEMS} more, {total} total)"


def value_lines(value: Any, pad: str, stats: bool, depth: int = 0) -> list[str]:
    """A value as the log shows it, indented by ``pad``: tensors as ``Tensor(`` blocks,
    sequences and dicts that hold tensors one item a line (``[i]:`` / ``'key':``), anything
    else on one line (:func:`format_value`). Never raises."""
    try:
        if isinstance(value, torch.Tensor):
            return tensor_block(value, pad, stats)
        if depth < 2 and isinstance(value, (list, tuple, dict)) and _holds_tensor(value):
            if isinstance(value, dict):
                open_, close = "{", "}"
                items = [(repr(k), v) for k, v in list(value.items())[:MAX_ITEMS]]
            else:
                open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
                items = [(f"[{i}]", v) for i, v in enumerate(value[:MAX_ITEMS])]
            lines = [pad + open_]
            for label, item in items:
                lines.append(f"{pad}  {label}:")
                lines += value_lines(item, pad + "    ", stats, depth + 1)
            if len(value) > MAX_ITEMS:
                lines.append(f"{pad}  {_more(len(value))}")
            return lines + [pad + close]
    except Exception as err:  # noqa: BLE001 - a broken tensor subclass must not break the call
        return [f"{pad}<{type(value).__name__}: unprintable ({type(err).__name__})>"]
    return [pad + format_value(value)]


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
            return f"{type(value).__name__}.{value.name} (value={_cut(repr(value.value))})"
        if isinstance(value, str):
            return _cut(repr(value))
        if isinstance(value, (torch.dtype, torch.device)):
            return str(value)
        if isinstance(value, (list, tuple)) and depth < 2:
            items = [format_value(v, depth + 1) for v in value[:MAX_ITEMS]]
            if len(value) > MAX_ITEMS:
                items.append(_more(len(value)))
            open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
            return open_ + ", ".join(items) + close
        if isinstance(value, dict) and depth < 2:
            items = [
                f"{format_value(k, depth + 1)}: {format_value(v, depth + 1)}"
                for k, v in list(value.items())[:MAX_ITEMS]
            ]
            if len(value) > MAX_ITEMS:
                items.append(_more(len(value)))
            return "{" + ", ".join(items) + "}"
        return _cut(repr(value))
    except Exception as err:  # a broken __repr__ must not break the call being logged
        return f"<{type(value).__name__}: unprintable ({type(err).__name__})>"
