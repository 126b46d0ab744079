"""Merging attention states computed over disjoint sets of keys.

A state is ``(v, s)``: ``v`` the attention output over the set, ``s`` the log-sum-exp of
its scores in **base 2** (``torch.logsumexp(q.k * sm_scale) / ln 2``), as in the reference
library and as ``return_lse=True`` gives it in :mod:`flashinfer.decode`, so states from
either library merge. Merging is exact: ``s = log2(2**s_a + 2**s_b)``,
``v = 2**(s_a - s) * v_a + 2**(s_b - s) * v_b``. A state with ``s = -inf`` (no keys)
contributes nothing. ``s`` of another float dtype is cast to float32, as the reference does.
Math in float32.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .jit.decode import gen_cascade_module

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LSE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_HEAD_DIM = 512


@functools.cache
def get_cascade_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The state-merging module for ``dtype``, compiled on first use."""
    return gen_cascade_module(dtype).build_and_load()


def _check_state(v_name: str, v: Any, s_name: str, s: Any, rank: int, layout: str) -> None:
    checks.check_tensor(v_name, v)
    checks.check_tensor(s_name, s)
    checks.check_ndim(v_name, v, rank, layout)
    checks.check_ndim(s_name, s, rank - 1, f"{layout} without head_dim")
    checks.check_dtype(v_name, v, _DTYPES)
    checks.check_dtype(s_name, s, _LSE_DTYPES)
    if tuple(s.shape) != tuple(v.shape[:-1]):
        raise ValueError(f"{s_name} has shape {tuple(s.shape)}, expected {tuple(v.shape[:-1])} "
                         f"(the shape of {v_name} without head_dim)")
    if v.shape[-1] > _MAX_HEAD_DIM:
        raise ValueError(f"{v_name} has head_dim {v.shape[-1]} > {_MAX_HEAD_DIM}")


def _check_pair(names: tuple[str, str, str, str], v_a: Any, s_a: Any, v_b: Any,
                s_b: Any) -> None:
    """Two states of the same shape; ``names`` are the caller's parameter names."""
    layout = "[seq_len, num_heads, head_dim]"
    _check_state(names[0], v_a, names[1], s_a, 3, layout)
    _check_state(names[2], v_b, names[3], s_b, 3, layout)
    if v_b.shape != v_a.shape:
        raise ValueError(f"{names[2]} has shape {tuple(v_b.shape)}, {names[0]} has "
                         f"{tuple(v_a.shape)}")
    checks.check_same_dtype(names[2], v_b, names[0], v_a)


def _check_devices(names: tuple[str, ...], *tensors: torch.Tensor) -> None:
    """All on one CUDA device (after every shape check, so each mistake has its message)."""
    checks.check_cuda(names[0], tensors[0])
    for name, t in zip(names[1:], tensors[1:]):
        checks.check_cuda(name, t, like=tensors[0])


@flashinfer_api
def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                s_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two states: ``v`` ``[seq_len, num_heads, head_dim]`` (fp16/bf16/fp32) and
    ``s`` ``[seq_len, num_heads]`` (base-2 LSE). Returns the merged ``(v, s)``, ``s``
    float32."""
    names = ("v_a", "s_a", "v_b", "s_b")
    _check_pair(names, v_a, s_a, v_b, s_b)
    _check_devices(names, v_a, s_a, v_b, s_b)
    v_out = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    s_out = torch.empty(s_a.shape, dtype=torch.float32, device=v_a.device)
    get_cascade_module(v_a.dtype).merge_state(v_a.contiguous(), _as_lse(s_a), v_b.contiguous(),
                                              _as_lse(s_b), v_out, s_out, None, False)
    return v_out, s_out


@flashinfer_api
def merge_state_in_place(v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor,
                         s_other: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """``(v, s) <- merge((v, s), (v_other, s_other))`` in place, at the positions where
    ``mask`` (``[seq_len]`` bool) is true (everywhere without a mask). ``v`` and ``s``
    must be contiguous; an ``s`` that is not float32 is merged in float32 and written back
    in its own dtype."""
    names = ("v", "s", "v_other", "s_other")
    _check_pair(names, v, s, v_other, s_other)
    if not (v.is_contiguous() and s.is_contiguous()):
        raise ValueError("v and s are updated in place and must be contiguous")
    if mask is not None:
        checks.check_tensor("mask", mask)
        checks.check_ndim("mask", mask, 1, "[seq_len]")
        checks.check_dtype("mask", mask, (torch.bool, torch.uint8))
        if mask.shape[0] != v.shape[0]:
            raise ValueError(f"mask has {mask.shape[0]} elements, v has {v.shape[0]} positions")
    _check_devices(names, v, s, v_other, s_other)
    if mask is not None:
        checks.check_cuda("mask", mask, like=v)
        mask = mask.contiguous()
    s32 = _as_lse(s)
    get_cascade_module(v.dtype).merge_state(v, s32, v_other.contiguous(), _as_lse(s_other),
                                            v, s32, mask, True)
    if s32 is not s:
        s.copy_(s32)


@flashinfer_api
def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``num_states`` states per position: ``v`` ``[seq_len, num_states, num_heads,
    head_dim]``, ``s`` ``[seq_len, num_states, num_heads]``. Returns ``(v, s)`` with the
    states dim merged away."""
    _check_state("v", v, "s", s, 4, "[seq_len, num_states, num_heads, head_dim]")
    _check_devices(("v", "s"), v, s)
    seq, _, heads, dim = v.shape
    v_out = torch.empty((seq, heads, dim), dtype=v.dtype, device=v.device)
    s_out = torch.empty((seq, heads), dtype=torch.float32, device=v.device)
    get_cascade_module(v.dtype).merge_states(v.contiguous(), _as_lse(s), v_out, s_out)
    return v_out, s_out


def _as_lse(s: torch.Tensor) -> torch.Tensor:
    """``s`` as the kernels read it: contiguous float32 (itself when it already is)."""
    return s.to(torch.float32).contiguous()
