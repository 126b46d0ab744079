"""ALiBi's per-head slopes (pos_encoding_mode "ALIBI"), as the reference computes them, and
the device copy the attention kernels read."""

from __future__ import annotations

import functools
import math

import torch

_LOG2E = 1.0 / math.log(2.0)


def get_alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi slope of each of ``n_heads`` heads (float32): a geometric sequence
    ``2^(-8 (i + 1) / n)`` over the largest power of two ``n <= n_heads``, then the odd
    terms of the sequence for ``2n`` for the heads past it."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    n = 1 << (n_heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(n_heads - n)]
    return torch.tensor(slopes, dtype=torch.float32)


@functools.cache
def alibi_slopes_log2(n_heads: int, device: torch.device) -> torch.Tensor:
    """The slopes times log2(e) on ``device`` (the kernels' units), made once per head count
    and device (a CUDA graph's replays read the same buffer)."""
    return (get_alibi_slopes(n_heads).double() * _LOG2E).float().to(device)
