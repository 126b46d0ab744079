"""Normalization APIs: RMSNorm (and Gemma's), fused residual-add RMSNorm, LayerNorm.

Inputs are ``[tokens, hidden]`` or ``[tokens, heads, head_dim]`` (normalized over the last
dim, e.g. per-head QK norm), any strides with a contiguous last dim; math in float32.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .jit.norm import gen_norm_module

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAYOUT = "[tokens, hidden] or 3-D [tokens, heads, head_dim]"


@functools.cache
def get_norm_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The norm module for ``dtype`` (torch.dtype or name), compiled on first use."""
    return gen_norm_module(dtype).build_and_load()


def _check_rows(name: str, tensor: Any) -> torch.Tensor:
    checks.check_tensor(name, tensor)
    if tensor.dim() not in (2, 3):
        raise ValueError(f"{name} must be 2-D {_LAYOUT}, got {tensor.dim()}-D with shape "
                         f"{tuple(tensor.shape)}")
    return tensor


def _check_vector(name: str, vector: Any, input: torch.Tensor) -> None:
    checks.check_tensor(name, vector)
    checks.check_ndim(name, vector, 1, "[hidden]")
    if vector.shape[0] != input.shape[-1]:
        raise ValueError(f"{name} has {vector.shape[0]} elements, but input's last dim is "
                         f"{input.shape[-1]}")
    if not vector.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")


def _check_like(name: str, tensor: Any, input: torch.Tensor) -> None:
    """Same shape and dtype as ``input``, contiguous last dim (an out= or residual)."""
    checks.check_tensor(name, tensor)
    if tensor.shape != input.shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input has {tuple(input.shape)}")
    checks.check_same_dtype(name, tensor, "input", input)
    checks.check_last_dim_contiguous(name, tensor)


def _rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None,
             function: str) -> torch.Tensor:
    _check_rows("input", input)
    eps = checks.check_eps(eps)
    _check_vector("weight", weight, input)
    checks.check_dtype("input", input, _DTYPES)
    checks.check_same_dtype("weight", weight, "input", input)
    checks.check_last_dim_contiguous("input", input)
    if out is not None:
        _check_like("out", out, input)
    checks.check_cuda("input", input)
    checks.check_cuda("weight", weight, like=input)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    else:
        checks.check_cuda("out", out, like=input)
    if input.numel():
        getattr(get_norm_module(input.dtype), function)(out, input, weight, eps)
    return out


@flashinfer_api
def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = input / sqrt(mean(input ** 2, -1) + eps) * weight``, computed in float32.

    Args:
        input: ``[tokens, hidden]`` or ``[tokens, heads, head_dim]``; float16, bfloat16 or
            float32; last dim contiguous.
        weight: ``[hidden]`` (or ``[head_dim]``), same dtype, contiguous.
        eps: added to the mean square before the square root.
        out: optional output shaped like ``input`` (may be ``input`` itself).

    Returns:
        ``out``, or a new tensor like ``input``.
    """
    return _rmsnorm(input, weight, eps, out, "rmsnorm")


@flashinfer_api
def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gemma's RMSNorm: ``input / sqrt(mean(input ** 2, -1) + eps) * (weight + 1)``.
    Arguments as :func:`rmsnorm`."""
    return _rmsnorm(input, weight, eps, out, "gemma_rmsnorm")


def _fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float, function: str) -> None:
    _check_rows("input", input)
    eps = checks.check_eps(eps)
    _check_like("residual", residual, input)
    _check_vector("weight", weight, input)
    checks.check_dtype("input", input, _DTYPES)
    checks.check_same_dtype("weight", weight, "input", input)
    checks.check_last_dim_contiguous("input", input)
    if input.numel() and input.data_ptr() == residual.data_ptr():
        raise ValueError("input and residual must be different tensors")
    checks.check_cuda("input", input)
    checks.check_cuda("residual", residual, like=input)
    checks.check_cuda("weight", weight, like=input)
    if input.numel():
        getattr(get_norm_module(input.dtype), function)(input, residual, weight, eps)


@flashinfer_api
def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    ``residual`` is updated in its own dtype (rounded) and the norm is taken of that.
    Shapes and dtypes as :func:`rmsnorm`; ``residual`` is shaped like ``input``.
    """
    _fused_add_rmsnorm(input, residual, weight, eps, "fused_add_rmsnorm")


@flashinfer_api
def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6) -> None:
    """:func:`fused_add_rmsnorm` with Gemma's ``weight + 1``."""
    _fused_add_rmsnorm(input, residual, weight, eps, "gemma_fused_add_rmsnorm")


@flashinfer_api
def layernorm(input: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
              eps: float = 1e-6) -> torch.Tensor:
    """``(input - mean) / sqrt(var + eps) * gamma + beta`` over the last dim, in float32.

    Args:
        input: ``[tokens, hidden]`` or ``[tokens, heads, head_dim]``; float16, bfloat16 or
            float32; last dim contiguous.
        gamma, beta: ``[hidden]`` float32 (as the reference library takes them), contiguous.
        eps: added to the variance.
    """
    _check_rows("input", input)
    eps = checks.check_eps(eps)
    _check_vector("gamma", gamma, input)
    _check_vector("beta", beta, input)
    checks.check_dtype("input", input, _DTYPES)
    checks.check_dtype("gamma", gamma, (torch.float32,))
    checks.check_dtype("beta", beta, (torch.float32,))
    checks.check_last_dim_contiguous("input", input)
    checks.check_cuda("input", input)
    checks.check_cuda("gamma", gamma, like=input)
    checks.check_cuda("beta", beta, like=input)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    if input.numel():
        get_norm_module(input.dtype).layernorm(out, input, gamma, beta, eps)
    return out
