"""What the bindings (csrc/*.cc) read from tensors before they fill a launcher's struct, for
the emulated modules that fill the same structs from Python."""

from __future__ import annotations

import torch


def pointer(t: torch.Tensor | None) -> int | None:
    """An optional tensor's data pointer (null for None)."""
    return None if t is None else t.data_ptr()


def cache_strides(t: torch.Tensor, hnd: bool) -> tuple[int, int, int, int]:
    """(page, slot, head) strides and the page size (tokens for a 3-D cache), as the
    bindings' CacheOf reads them."""
    base = t.dim() - 3
    slot_dim, head_dim = base + (1 if hnd else 0), base + (0 if hnd else 1)
    page = t.stride(0) if t.dim() == 4 else 0
    return page, t.stride(slot_dim), t.stride(head_dim), t.shape[slot_dim]
