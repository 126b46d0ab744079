"""Paged KV cache: append new tokens' keys and values, and the index helpers around it.

A request's KV sequence lives in pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, the
last one filled to ``kv_last_page_len[b]``. The cache is one tensor ``[max_num_pages, 2,
page_size, num_kv_heads, head_dim]`` ("NHD") or ``[max_num_pages, 2, num_kv_heads,
page_size, head_dim]`` ("HND"), keys at ``[:, 0]`` and values at ``[:, 1]``, or a
``(k_cache, v_cache)`` tuple of 4-D tensors; with page_size 1 the page_size dim may be
left out. Index tensors are int32 or int64 (int64 ones are converted, as the reference
does).

The append kernel is the torch custom op ``torch.ops.flashinfer.append_paged_kv_cache``,
writing the key and value caches (views of one 5-D tensor, or the pair's two tensors); the
index helpers are plain torch code (see docs/compile.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks, ragged
from .api_logging import flashinfer_api
from .custom_op import kernel_op
from .jit.page import gen_page_module
from .paged_kv import split_combined_cache, unpack_paged_kv_cache
from .trace.templates import page as _trace

# fp8 caches take fp8 keys and values (quantized by the caller, as the reference's append
# takes them): the kernel copies, it does not convert
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)
_INDEX = (torch.int32, torch.int64)


@functools.cache
def get_page_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The paged-KV module for ``dtype``, compiled on first use."""
    return gen_page_module(dtype).build_and_load()


def _check_indptr_form(name: str, indptr: Any) -> int:
    """A 1-D index ``indptr`` of batch_size + 1 elements; returns batch_size."""
    checks.check_index_tensor(name, indptr, None, _INDEX)
    if indptr.shape[0] < 1:
        raise ValueError(f"{name} needs batch_size + 1 elements, got 0")
    return indptr.shape[0] - 1


def _check_output(name: str, out: Any, nnz: int, like: torch.Tensor) -> None:
    if out is not None:
        checks.check_index_tensor(name, out, nnz, (torch.int32,))
        checks.check_same_device(name, out, like)


@flashinfer_api(trace=_trace.get_batch_indices_positions_trace)
def get_batch_indices_positions(
    append_indptr: torch.Tensor,
    seq_lens: torch.Tensor,
    nnz: int,
    batch_indices: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``nnz`` appended tokens, request ``b`` owning ``append_indptr[b]:append_indptr[b+1]``
    and ``seq_lens[b]`` its KV length after the append: each token's request and position,
    int32, written into ``batch_indices``/``positions`` when given. A token no request owns
    (past ``append_indptr[-1]``: padding) gets batch index -1, which
    :func:`append_paged_kv_cache` skips, and position 0 (a given ``positions`` keeps its
    value there). No device synchronization: a CUDA ``append_indptr`` is not validated (a
    bad one causes no out-of-bounds access)."""
    batch_size = _check_indptr_form("append_indptr", append_indptr)
    checks.check_index_tensor("seq_lens", seq_lens, batch_size, _INDEX)
    checks.check_int("nnz", nnz, low=0, high=ragged.INT32_MAX)  # int32 outputs index tokens
    checks.check_same_device("seq_lens", seq_lens, append_indptr)
    _check_output("batch_indices", batch_indices, nnz, append_indptr)
    _check_output("positions", positions, nnz, append_indptr)
    ragged.check_indptr("append_indptr", append_indptr, "nnz", nnz)
    tokens = ragged.token_requests(append_indptr, nnz)
    requests = torch.where(tokens.owned, tokens.request, -1)
    first = tokens.per_token(seq_lens, 0) - tokens.count
    unowned = 0 if positions is None else positions
    token_positions = torch.where(tokens.owned, first + tokens.within, unowned)
    if batch_indices is None:
        batch_indices = requests.to(torch.int32)
    else:
        batch_indices.copy_(requests)
    if positions is None:
        positions = token_positions.to(torch.int32)
    else:
        positions.copy_(token_positions)
    return batch_indices, positions


@flashinfer_api(trace=_trace.get_seq_lens_trace)
def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Each request's KV length: its full pages times ``page_size`` plus its last page's
    fill (a request without pages counts only ``kv_last_page_len``)."""
    batch_size = _check_indptr_form("kv_indptr", kv_indptr)
    checks.check_index_tensor("kv_last_page_len", kv_last_page_len, batch_size, _INDEX)
    checks.check_int("page_size", page_size, low=1, high=ragged.INT32_MAX)
    checks.check_same_device("kv_last_page_len", kv_last_page_len, kv_indptr)
    ragged.check_indptr("kv_indptr", kv_indptr)
    pages = torch.diff(kv_indptr)
    return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len


@kernel_op("append_paged_kv_cache", mutates_args=("k_cache", "v_cache"))
def _append_op(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str,
) -> None:
    """The append kernel; index tensors int32, caches as :func:`append_paged_kv_cache`
    checked them: a (k, v) pair, or (v_cache None) the one combined cache, split into its
    two views here, inside the op. A compiled graph with dynamic shapes loses writes made
    through two ``select`` views of one graph input (torch 2.11 and 2.13), so the op is
    given the tensor itself."""
    if v_cache is None:
        k_cache, v_cache = split_combined_cache(k_cache, kv_layout)
    if append_key.shape[0]:
        get_page_module(append_key.dtype).append_paged_kv_cache(
            append_key,
            append_value,
            batch_indices,
            positions,
            k_cache,
            v_cache,
            kv_indices,
            kv_indptr,
            kv_last_page_len,
            kv_layout == "HND",
        )


def _check_cache(name: str, cache: torch.Tensor, key: torch.Tensor, kv_layout: str) -> None:
    checks.check_same_dtype(name, cache, "append_key", key)
    checks.check_last_dim_contiguous(name, cache)
    hnd = kv_layout == "HND"
    heads, page_size = (cache.shape[1], cache.shape[2]) if hnd else (cache.shape[2], cache.shape[1])
    if heads != key.shape[1] or cache.shape[3] != key.shape[2]:
        raise ValueError(
            f"{name} holds {heads} heads of dim {cache.shape[3]} ({kv_layout}), "
            f"the appended keys have {key.shape[1]} of dim {key.shape[2]}"
        )
    if page_size < 1:
        raise ValueError(f"{name} has page_size 0")


def _check_appended(append_key: Any, append_value: Any) -> None:
    for name, t in (("append_key", append_key), ("append_value", append_value)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, "[nnz, num_kv_heads, head_dim]")
        checks.check_last_dim_contiguous(name, t)
    if append_value.shape != append_key.shape:
        raise ValueError(
            f"append_value has shape {tuple(append_value.shape)}, append_key has "
            f"{tuple(append_key.shape)}"
        )
    checks.check_dtype("append_key", append_key, _DTYPES)
    checks.check_same_dtype("append_value", append_value, "append_key", append_key)


@flashinfer_api(trace=_trace.append_paged_kv_cache_trace)
def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    kv_layout: str = "NHD",
) -> None:
    """Write ``append_key``/``append_value`` (``[nnz, num_kv_heads, head_dim]``) into the
    paged cache: token ``i`` goes to request ``batch_indices[i]`` at sequence position
    ``positions[i]`` (see :func:`get_batch_indices_positions`), i.e. page
    ``kv_indices[kv_indptr[b] + p // page_size]``, slot ``p % page_size``. The page table
    must already cover the appended tokens. A token whose request, page or slot index is
    out of range (including past the end of ``kv_indices``) is skipped, never written out
    of bounds; only CPU-resident index tensors are validated on the host."""
    checks.check_kv_layout(kv_layout)
    _check_appended(append_key, append_value)
    caches = unpack_paged_kv_cache(paged_kv_cache, kv_layout)
    for name, cache in caches:
        _check_cache(name, cache, append_key, kv_layout)
    (k_name, k_cache), (v_name, v_cache) = caches
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"the key and value caches of paged_kv_cache differ in shape: "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    for name, cache in caches:
        checks.check_writable(name, cache)
    checks.check_distinct(k_name, k_cache, v_name, v_cache)  # keys and values in one tensor
    nnz = append_key.shape[0]
    checks.check_index_tensor("batch_indices", batch_indices, nnz, _INDEX)
    checks.check_index_tensor("positions", positions, nnz, _INDEX)
    checks.check_index_tensor("kv_indices", kv_indices, None, _INDEX)
    batch_size = _check_indptr_form("kv_indptr", kv_indptr)
    checks.check_index_tensor("kv_last_page_len", kv_last_page_len, batch_size, _INDEX)
    ragged.check_indptr("kv_indptr", kv_indptr, "len(kv_indices)", kv_indices.shape[0])
    checks.check_cuda("append_key", append_key)
    for name, t in (
        ("append_value", append_value),
        (k_name, k_cache),
        (v_name, v_cache),
        ("batch_indices", batch_indices),
        ("positions", positions),
        ("kv_indices", kv_indices),
        ("kv_indptr", kv_indptr),
        ("kv_last_page_len", kv_last_page_len),
    ):
        checks.check_cuda(name, t, like=append_key)
    # the op takes a combined cache whole (see _append_op)
    op_caches = (
        (paged_kv_cache, None) if isinstance(paged_kv_cache, torch.Tensor) else (k_cache, v_cache)
    )
    _append_op(
        append_key,
        append_value,
        ragged.int32_ids(batch_indices),
        ragged.int32_ids(positions),
        *op_caches,
        ragged.int32_ids(kv_indices),
        ragged.int32_ids(kv_indptr),
        ragged.int32_ids(kv_last_page_len),
        kv_layout,
    )
