"""The forms a paged KV cache is passed in, as the reference library accepts them.

- one 5-D tensor ``[max_num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD) or
  ``[max_num_pages, 2, num_kv_heads, page_size, head_dim]`` (HND), keys at ``[:, 0]``;
- a ``(k_cache, v_cache)`` pair (tuple or list) of 4-D tensors of those pages;
- with ``page_size == 1`` the page-size dim may be left out: a 4-D tensor, or 3-D k/v.

Every form becomes two 4-D views of the same storage: nothing is copied. The views are
taken with ``select``, not Python indexing, which on a fake CUDA tensor needs torch built
with CUDA; so a cache traces with fake tensors on any torch.
"""

from __future__ import annotations

from typing import Any

import torch

from . import checks

Part = tuple[str, torch.Tensor]  # the name errors use for it, and the 4-D view


def _slot_dim(kv_layout: str) -> int:
    """Where page_size goes back in a cache given without it (page_size 1)."""
    return -2 if kv_layout == "HND" else -3


def split_combined_cache(cache: torch.Tensor, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and the value cache (4-D views) of a combined ``[max_num_pages, 2, ...]``
    cache (4-D with page_size 1), already checked by :func:`unpack_paged_kv_cache`."""
    if cache.dim() == 4:
        cache = cache.unsqueeze(_slot_dim(kv_layout))
    return cache.select(1, 0), cache.select(1, 1)


def unpack_paged_kv_cache(paged_kv_cache: Any, kv_layout: str) -> tuple[Part, Part]:
    """The key and the value cache as (name, 4-D view) pairs, from any accepted form."""
    checks.check_kv_layout(kv_layout)
    slot_dim = _slot_dim(kv_layout)
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() not in (4, 5):
            raise ValueError(
                "paged_kv_cache must be 5-D [max_num_pages, 2, ...] (4-D with page_size 1), "
                f"got {paged_kv_cache.dim()}-D with shape {tuple(paged_kv_cache.shape)}"
            )
        if paged_kv_cache.shape[1] != 2:
            raise ValueError(
                "paged_kv_cache must hold keys and values in dim 1 (size 2), got "
                f"shape {tuple(paged_kv_cache.shape)}"
            )
        k, v = split_combined_cache(paged_kv_cache, kv_layout)
        return ("paged_kv_cache", k), ("paged_kv_cache", v)
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                f"paged_kv_cache must be a (k_cache, v_cache) pair, got {len(paged_kv_cache)} items"
            )
        parts = []
        for i, cache in enumerate(paged_kv_cache):
            name = f"paged_kv_cache[{i}]"
            checks.check_tensor(name, cache)
            if cache.dim() not in (3, 4):
                raise ValueError(
                    f"{name} must be 4-D [max_num_pages, ...] (3-D with page_size "
                    f"1), got {cache.dim()}-D with shape {tuple(cache.shape)}"
                )
            parts.append((name, cache if cache.dim() == 4 else cache.unsqueeze(slot_dim)))
        return parts[0], parts[1]
    raise TypeError(
        "paged_kv_cache must be a torch.Tensor or a (k_cache, v_cache) tuple, got "
        f"{type(paged_kv_cache).__name__}"
    )


def check_paged_kv_cache(
    paged_kv_cache: Any,
    kv_layout: str,
    num_kv_heads: int,
    page_size: int,
    head_dim: int,
    dtype: torch.dtype,
    head_dim_vo: int | None = None,
) -> tuple[Part, Part]:
    """The key and the value cache as :func:`unpack_paged_kv_cache` gives them, checked
    against a plan: pages of ``page_size`` slots of ``num_kv_heads`` heads of ``head_dim``
    (the values': ``head_dim_vo``, None for the same; in ``kv_layout``'s order) and
    ``dtype``, the last dim contiguous, as many pages of keys as of values."""
    parts = unpack_paged_kv_cache(paged_kv_cache, kv_layout)
    slots = (num_kv_heads, page_size) if kv_layout == "HND" else (page_size, num_kv_heads)
    dims = (head_dim, head_dim if head_dim_vo is None else head_dim_vo)
    for (name, t), dim in zip(parts, dims):
        expected = (*slots, dim)
        if tuple(t.shape[1:]) != expected:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; plan() was for pages of "
                f"{expected} ({kv_layout})"
            )
        if t.dtype != dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; plan() was for {dtype}")
        checks.check_last_dim_contiguous(name, t)
    (_, k_cache), (_, v_cache) = parts
    if k_cache.shape[0] != v_cache.shape[0]:
        raise ValueError("the key and value caches of paged_kv_cache differ in num_pages")
    return parts
