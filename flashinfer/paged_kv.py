"""The forms a paged KV cache is passed in, as the reference library accepts them.

- a ``(k_cache, v_cache)`` pair of 4-D tensors ``[num_pages, page_size, num_kv_heads,
  head_dim]`` (NHD) or ``[num_pages, num_kv_heads, page_size, head_dim]`` (HND);
- one 5-D tensor ``[num_pages, 2, ...]`` whose dim 1 holds K (0) and V (1);
- with ``page_size == 1`` the page-size dim may be left out: 3-D k/v tensors, or a 4-D
  ``[num_pages, 2, num_kv_heads, head_dim]`` tensor.

Every form becomes two 4-D views of the same storage: nothing is copied.
"""

from __future__ import annotations

from typing import Any

import torch

from . import checks


def _page_dim(kv_layout: str) -> int:
    """Where the page-size dim goes in a 4-D k/v view: -3 (NHD) or -2 (HND)."""
    return -2 if checks.check_kv_layout(kv_layout) else -3


def unpack_paged_kv_cache(paged_kv_cache: Any, kv_layout: str,
                          name: str = "paged_kv_cache") -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_cache, v_cache)``, each 4-D, from any accepted form (see the module docstring)."""
    page_dim = _page_dim(kv_layout)
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"{name} must be a (k_cache, v_cache) pair, got "
                             f"{len(paged_kv_cache)} elements")
        k_cache, v_cache = paged_kv_cache
        views = []
        for part, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            checks.check_tensor(f"{name}'s {part}", t)
            if t.dim() == 3:
                t = t.unsqueeze(page_dim)
            elif t.dim() != 4:
                raise ValueError(f"{name}'s {part} must be 4-D [num_pages, ...] ({kv_layout}), "
                                 f"or 3-D with page_size 1; got {t.dim()}-D")
            views.append(t)
        return views[0], views[1]
    checks.check_tensor(name, paged_kv_cache)
    cache = paged_kv_cache
    if cache.dim() == 4:
        cache = cache.unsqueeze(page_dim)
    elif cache.dim() != 5:
        raise ValueError(f"{name} must be 5-D [num_pages, 2, ...] ({kv_layout}), 4-D with "
                         f"page_size 1, or a (k_cache, v_cache) pair; got {cache.dim()}-D")
    if cache.shape[1] != 2:
        raise ValueError(f"{name}'s dim 1 must be 2 (k, v), got {cache.shape[1]}")
    return cache[:, 0], cache[:, 1]
