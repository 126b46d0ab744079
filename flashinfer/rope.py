"""Rotary position embedding on q ``[nnz, q_heads, head_dim]`` and k ``[nnz, k_heads, head_dim]``.

Positions come as per-token ``pos_ids``, or as ragged batches (``indptr``, ``offsets``:
token ``indptr[b] + j`` of request ``b`` is at position ``offsets[b] + j``). ``interleave``
selects GPT-J pairs ``(2i, 2i+1)``, else NeoX pairs ``(i, i + rotary_dim/2)``; dims from
``rotary_dim`` on are left unchanged. Math in float32.

Each kernel is a torch custom op (see docs/compile.md): ``apply_rope_pos_ids`` (which the
ragged forms share, their positions computed in torch first), ``apply_llama31_rope_pos_ids``
and ``apply_rope_with_cos_sin_cache`` write new ``q_rope``/``k_rope`` tensors; their
``*_inplace`` ops write ``q`` and ``k``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from . import checks, ragged
from .api_logging import flashinfer_api
from .custom_op import kernel_op
from .jit.rope import gen_rope_module
from .trace.templates import rope as _trace

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_IDS = (torch.int32, torch.int64)


@functools.cache
def get_rope_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The RoPE module for ``dtype``, compiled on first use."""
    return gen_rope_module(dtype).build_and_load()


def _check_qk(q: Any, k: Any, q_name: str = "q", k_name: str = "k") -> None:
    """q and k ``[nnz, heads, head_dim]``, named as the API calls them."""
    for name, t in ((q_name, q), (k_name, k)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, "[nnz, heads, head_dim]")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{q_name} has {q.shape[0]} tokens, {k_name} has {k.shape[0]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{q_name}'s head_dim is {q.shape[2]}, {k_name}'s is {k.shape[2]}")
    checks.check_dtype(q_name, q, _DTYPES)
    checks.check_same_dtype(k_name, k, q_name, q)
    checks.check_last_dim_contiguous(q_name, q)
    checks.check_last_dim_contiguous(k_name, k)


def _rotary_dim(rotary_dim: Any, head_dim: int, name: str = "rotary_dim") -> int:
    if rotary_dim is None:
        rotary_dim = head_dim
    checks.check_int(name, rotary_dim)
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"{name} must be even and in (0, head_dim={head_dim}], got {rotary_dim}")
    return rotary_dim


def _positive(name: str, value: Any) -> float:
    return checks.check_number(name, value, 0.0, low_open=True, kind="a number")


def _ragged_pos_ids(q: torch.Tensor, indptr: Any, offsets: Any) -> torch.Tensor:
    """Per-token positions of a ragged batch. ``indptr`` values are checked on the host only
    for a CPU tensor (which the device check then rejects, after a more precise error); a
    CUDA one is not read (that would synchronize), and a token it assigns to no request gets
    position 0, i.e. is copied unrotated, as the reference leaves such tokens alone."""
    checks.check_index_tensor("indptr", indptr, None, _IDS)
    if indptr.shape[0] < 1:
        raise ValueError("indptr needs batch_size + 1 elements, got 0")
    checks.check_index_tensor("offsets", offsets, indptr.shape[0] - 1, _IDS)
    ragged.check_indptr("indptr", indptr, "the number of tokens in q", q.shape[0])
    checks.check_cuda("q", q)
    checks.check_cuda("indptr", indptr, like=q)
    checks.check_cuda("offsets", offsets, like=q)
    tokens = ragged.token_requests(indptr, q.shape[0])
    return (tokens.per_token(offsets, 0) + tokens.within).to(offsets.dtype)


def _positions(q: torch.Tensor, pos_ids: Any, ragged_batch: tuple[Any, Any] | None) -> torch.Tensor:
    """``pos_ids`` checked, or the positions of the ragged batch ``(indptr, offsets)``."""
    if ragged_batch is not None:
        return _ragged_pos_ids(q, *ragged_batch)
    checks.check_index_tensor("pos_ids", pos_ids, q.shape[0], _IDS)
    return pos_ids


def _launch(
    function: str,
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    *params: Any,
) -> None:
    """Every RoPE op's real implementation: the module's ``function`` (the in-place ops pass
    ``q``/``k`` as their own outputs, which must then be apart: one tensor for both would
    be rotated twice; checked here too for a compiled call, whose trace skips the API's
    check)."""
    if q_rope is q:
        checks.check_distinct("q", q, "k", k)
    if q.shape[0]:
        getattr(get_rope_module(q.dtype), function)(q_rope, k_rope, q, k, pos_ids, *params)


@kernel_op("apply_rope_pos_ids", mutates_args=("q_rope", "k_rope"))
def _rope_op(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int,
    interleave: bool,
    rope_scale: float,
    rope_theta: float,
) -> None:
    _launch(
        "apply_rope_pos_ids",
        q_rope,
        k_rope,
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
    )


@kernel_op("apply_rope_pos_ids_inplace", mutates_args=("q", "k"))
def _rope_inplace_op(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int,
    interleave: bool,
    rope_scale: float,
    rope_theta: float,
) -> None:
    _launch(
        "apply_rope_pos_ids", q, k, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta
    )


@kernel_op("apply_llama31_rope_pos_ids", mutates_args=("q_rope", "k_rope"))
def _llama31_op(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int,
    interleave: bool,
    rope_scale: float,
    rope_theta: float,
    low_freq_factor: float,
    high_freq_factor: float,
    old_context_len: float,
) -> None:
    _launch(
        "apply_llama31_rope_pos_ids",
        q_rope,
        k_rope,
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
    )


@kernel_op("apply_llama31_rope_pos_ids_inplace", mutates_args=("q", "k"))
def _llama31_inplace_op(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int,
    interleave: bool,
    rope_scale: float,
    rope_theta: float,
    low_freq_factor: float,
    high_freq_factor: float,
    old_context_len: float,
) -> None:
    _launch(
        "apply_llama31_rope_pos_ids",
        q,
        k,
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
    )


@kernel_op("apply_rope_with_cos_sin_cache", mutates_args=("q_rope", "k_rope"))
def _cos_sin_op(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    interleave: bool,
) -> None:
    _launch("apply_rope_cos_sin_cache", q_rope, k_rope, q, k, positions, cos_sin_cache, interleave)


@kernel_op("apply_rope_with_cos_sin_cache_inplace", mutates_args=("q", "k"))
def _cos_sin_inplace_op(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    interleave: bool,
) -> None:
    _launch("apply_rope_cos_sin_cache", q, k, q, k, positions, cos_sin_cache, interleave)


# (out-of-place op, in-place op) per kernel
_ROPE = (_rope_op, _rope_inplace_op)
_LLAMA31 = (_llama31_op, _llama31_inplace_op)
_COS_SIN = (_cos_sin_op, _cos_sin_inplace_op)


def _run(
    ops: tuple[Any, Any],
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    inplace: bool,
    *params: Any,
    names: tuple[str, str] = ("q", "k"),
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """After the device checks, the in-place op on ``q``/``k`` (the API calls them
    ``names``), or the out-of-place op into new contiguous tensors, which it returns."""
    checks.check_cuda("q", q)
    checks.check_cuda("k", k, like=q)
    checks.check_cuda("pos_ids", pos_ids, like=q)
    if inplace:
        checks.check_writable(names[0], q)
        checks.check_writable(names[1], k)
        checks.check_distinct(names[0], q, names[1], k)
        ops[1](q, k, pos_ids, *params)
        return None
    q_rope = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_rope = torch.empty_like(k, memory_format=torch.contiguous_format)
    ops[0](q_rope, k_rope, q, k, pos_ids, *params)
    return q_rope, k_rope


def _rope(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: Any,
    interleave: bool,
    rope_scale: Any,
    rope_theta: Any,
    inplace: bool,
    ragged_batch: tuple[Any, Any] | None = None,
):  # noqa: ANN202
    _check_qk(q, k)
    dim = _rotary_dim(rotary_dim, q.shape[2])
    scale, theta = (_positive("rope_scale", rope_scale), _positive("rope_theta", rope_theta))
    pos_ids = _positions(q, pos_ids, ragged_batch)
    return _run(_ROPE, q, k, pos_ids, inplace, dim, bool(interleave), scale, theta)


def _llama31(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: Any,
    interleave: bool,
    rope_scale: Any,
    rope_theta: Any,
    low_freq_factor: Any,
    high_freq_factor: Any,
    old_context_len: Any,
    inplace: bool,
    ragged_batch: tuple[Any, Any] | None = None,
):  # noqa: ANN202
    _check_qk(q, k)
    dim = _rotary_dim(rotary_dim, q.shape[2])
    values = [
        _positive(n, v)
        for n, v in (
            ("rope_scale", rope_scale),
            ("rope_theta", rope_theta),
            ("low_freq_factor", low_freq_factor),
            ("high_freq_factor", high_freq_factor),
            ("old_context_len", old_context_len),
        )
    ]
    if values[3] <= values[2]:
        raise ValueError(
            f"high_freq_factor ({values[3]}) must exceed low_freq_factor ({values[2]})"
        )
    pos_ids = _positions(q, pos_ids, ragged_batch)
    return _run(_LLAMA31, q, k, pos_ids, inplace, dim, bool(interleave), *values)


@flashinfer_api(trace=_trace.apply_rope_pos_ids_trace)
def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE at ``pos_ids`` (int32/int64 ``[nnz]``): frequency ``theta^(-2i/rotary_dim)``,
    positions divided by ``rope_scale``. Returns new ``(q, k)``."""
    return _rope(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, False)


@flashinfer_api(trace=_trace.apply_rope_pos_ids_inplace_trace)
def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope_pos_ids`, writing into ``q`` and ``k``."""
    _rope(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, True)


@flashinfer_api(trace=_trace.apply_rope_trace)
def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE for ragged batches: request ``b`` owns tokens ``indptr[b]:indptr[b+1]``, the
    first at position ``offsets[b]``. Returns new ``(q, k)``. A CUDA ``indptr`` is not read on
    the host (no synchronization): a bad one causes no out-of-bounds access, and tokens it
    leaves to no request are copied unrotated."""
    return _rope(
        q, k, None, rotary_dim, interleave, rope_scale, rope_theta, False, (indptr, offsets)
    )


@flashinfer_api(trace=_trace.apply_rope_inplace_trace)
def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope`, writing into ``q`` and ``k``."""
    _rope(q, k, None, rotary_dim, interleave, rope_scale, rope_theta, True, (indptr, offsets))


@flashinfer_api(trace=_trace.apply_llama31_rope_pos_ids_trace)
def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 3.1 RoPE: frequencies with wavelength above ``old_context_len /
    low_freq_factor`` are divided by ``rope_scale``, those below ``old_context_len /
    high_freq_factor`` kept, and those between smoothly interpolated."""
    return _llama31(
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
        False,
    )


@flashinfer_api(trace=_trace.apply_llama31_rope_pos_ids_inplace_trace)
def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope_pos_ids`, writing into ``q`` and ``k``."""
    _llama31(
        q,
        k,
        pos_ids,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
        True,
    )


@flashinfer_api(trace=_trace.apply_llama31_rope_trace)
def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 3.1 RoPE for ragged batches (see :func:`apply_rope`)."""
    return _llama31(
        q,
        k,
        None,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
        False,
        (indptr, offsets),
    )


@flashinfer_api(trace=_trace.apply_llama31_rope_inplace_trace)
def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope`, writing into ``q`` and ``k``."""
    _llama31(
        q,
        k,
        None,
        rotary_dim,
        interleave,
        rope_scale,
        rope_theta,
        low_freq_factor,
        high_freq_factor,
        old_context_len,
        True,
        (indptr, offsets),
    )


def _heads_view(name: str, t: Any, head_size: int) -> torch.Tensor:
    """``t`` ([nnz, heads * head_size] or any [nnz, ...] of whole heads) as [nnz, heads,
    head_size], without a copy."""
    checks.check_tensor(name, t)
    if t.dim() < 2:
        raise ValueError(
            f"{name} must be [nnz, num_heads * head_size], got {t.dim()}-D with "
            f"shape {tuple(t.shape)}"
        )
    per_token = math.prod(t.shape[1:])
    if per_token % head_size:
        raise ValueError(
            f"{name} has {per_token} elements per token, not a multiple of head_size={head_size}"
        )
    checks.check_last_dim_contiguous(name, t)
    try:
        return t.view(t.shape[0], per_token // head_size, head_size)
    except RuntimeError:
        raise ValueError(
            f"{name}'s strides do not allow a [nnz, heads, head_size] view; call "
            ".contiguous() first"
        ) from None


def _cos_sin_cache(
    positions: Any,
    query: Any,
    key: Any,
    head_size: Any,
    cos_sin_cache: Any,
    is_neox: bool,
    inplace: bool,
):  # noqa: ANN202
    checks.check_int("head_size", head_size, low=1)
    q, k = _heads_view("query", query, head_size), _heads_view("key", key, head_size)
    _check_qk(q, k, "query", "key")
    checks.check_tensor("cos_sin_cache", cos_sin_cache)
    checks.check_ndim("cos_sin_cache", cos_sin_cache, 2, "[max_position, rotary_dim]")
    checks.check_dtype("cos_sin_cache", cos_sin_cache, (torch.float32,))
    _rotary_dim(cos_sin_cache.shape[1], head_size, "cos_sin_cache's rotary_dim (dim 1)")
    checks.check_last_dim_contiguous("cos_sin_cache", cos_sin_cache)
    checks.check_index_tensor("positions", positions, q.shape[0], _IDS)
    checks.check_cuda("query", query)
    checks.check_cuda("key", key, like=query)
    checks.check_cuda("positions", positions, like=query)
    checks.check_cuda("cos_sin_cache", cos_sin_cache, like=query)
    result = _run(
        _COS_SIN, q, k, positions, inplace, cos_sin_cache, not is_neox, names=("query", "key")
    )
    if result is None:
        return None
    return result[0].view(query.shape), result[1].view(key.shape)


@flashinfer_api(trace=_trace.apply_rope_with_cos_sin_cache_trace)
def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE with precomputed ``cos_sin_cache`` (float32 ``[max_position, rotary_dim]``, cos in
    the first half of each row, sin in the second), on ``query``/``key`` flattened to
    ``[nnz, heads * head_size]`` (or any ``[nnz, ...]`` viewable so); outputs keep their
    shapes. A position outside the cache gives NaN, never a bad read.
    ``is_neox=False`` selects GPT-J pairs."""
    return _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False)


@flashinfer_api(trace=_trace.apply_rope_with_cos_sin_cache_inplace_trace)
def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """:func:`apply_rope_with_cos_sin_cache`, writing into ``query`` and ``key``."""
    _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, True)
