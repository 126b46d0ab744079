"""Paged KV cache: append new tokens' keys and values.

A request's KV sequence lives in pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, the
last one filled to ``kv_last_page_len[b]``. Caches are ``[max_pages, page_size,
num_kv_heads, head_dim]`` ("NHD") or ``[max_pages, num_kv_heads, page_size, head_dim]``
("HND"). Indices are int32.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .jit.page import gen_page_module
from .ragged import token_requests

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX = (torch.int32,)


@functools.cache
def get_page_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The paged-KV module for ``dtype``, compiled on first use."""
    return gen_page_module(dtype).build_and_load()


@flashinfer_api
def get_batch_indices_positions(append_indptr: torch.Tensor, seq_lens: torch.Tensor,
                                nnz: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``nnz`` appended tokens, request ``b`` owning ``append_indptr[b]:append_indptr[b+1]``
    and ``seq_lens[b]`` its length after the append: each token's request and position.
    No device synchronization."""
    checks.check_index_tensor("append_indptr", append_indptr, None, _INDEX)
    if append_indptr.shape[0] < 1:
        raise ValueError("append_indptr needs batch_size + 1 elements")
    checks.check_index_tensor("seq_lens", seq_lens, append_indptr.shape[0] - 1, _INDEX)
    if isinstance(nnz, bool) or not isinstance(nnz, int) or nnz < 0:
        raise ValueError(f"nnz must be an int >= 0, got {nnz!r}")
    if seq_lens.device != append_indptr.device:
        raise ValueError(f"seq_lens is on {seq_lens.device}, append_indptr on "
                         f"{append_indptr.device}")
    request, within, appended = token_requests(append_indptr, nnz)
    start = seq_lens.long()[request] - appended
    return request.to(torch.int32), (start + within).to(torch.int32)


@flashinfer_api
def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor,
                          batch_indices: torch.Tensor, positions: torch.Tensor,
                          paged_k_cache: torch.Tensor, paged_v_cache: torch.Tensor,
                          kv_indices: torch.Tensor, kv_indptr: torch.Tensor,
                          kv_last_page_len: torch.Tensor, kv_layout: str = "NHD") -> None:
    """Write ``append_key``/``append_value`` (``[nnz, num_kv_heads, head_dim]``) into the
    paged caches: token ``i`` goes to request ``batch_indices[i]`` at sequence position
    ``positions[i]`` (see :func:`get_batch_indices_positions`). Tokens whose indices fall
    outside the pages their request owns are skipped (indices live on the device and are
    not checked on the host)."""
    for name, t in (("append_key", append_key), ("append_value", append_value)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, "[nnz, num_kv_heads, head_dim]")
        checks.check_last_dim_contiguous(name, t)
    if append_value.shape != append_key.shape:
        raise ValueError(f"append_value has shape {tuple(append_value.shape)}, append_key has "
                         f"{tuple(append_key.shape)}")
    checks.check_dtype("append_key", append_key, _DTYPES)
    checks.check_same_dtype("append_value", append_value, "append_key", append_key)
    hnd = checks.check_kv_layout(kv_layout)
    nnz, heads, dim = append_key.shape
    for name, cache in (("paged_k_cache", paged_k_cache), ("paged_v_cache", paged_v_cache)):
        checks.check_tensor(name, cache)
        checks.check_ndim(name, cache, 4, f"[max_pages, ...] in {kv_layout} layout")
        checks.check_same_dtype(name, cache, "append_key", append_key)
        checks.check_last_dim_contiguous(name, cache)
        cache_heads = cache.shape[1] if hnd else cache.shape[2]
        if cache_heads != heads or cache.shape[3] != dim:
            raise ValueError(f"{name} holds {cache_heads} heads of dim {cache.shape[3]} "
                             f"({kv_layout}), the appended keys have {heads} of dim {dim}")
    if paged_v_cache.shape != paged_k_cache.shape:
        raise ValueError("paged_k_cache and paged_v_cache differ in shape")
    checks.check_index_tensor("batch_indices", batch_indices, nnz, _INDEX)
    checks.check_index_tensor("positions", positions, nnz, _INDEX)
    checks.check_index_tensor("kv_indptr", kv_indptr, None, _INDEX)
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr needs batch_size + 1 elements")
    checks.check_index_tensor("kv_last_page_len", kv_last_page_len, kv_indptr.shape[0] - 1, _INDEX)
    checks.check_index_tensor("kv_indices", kv_indices, None, _INDEX)
    checks.check_cuda("append_key", append_key)
    for name, t in (("append_value", append_value), ("batch_indices", batch_indices),
                    ("positions", positions), ("paged_k_cache", paged_k_cache),
                    ("paged_v_cache", paged_v_cache), ("kv_indices", kv_indices),
                    ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        checks.check_cuda(name, t, like=append_key)
    if nnz:
        get_page_module(append_key.dtype).append_paged_kv_cache(
            append_key, append_value, batch_indices, positions, paged_k_cache, paged_v_cache,
            kv_indices, kv_indptr, kv_last_page_len, hnd)
