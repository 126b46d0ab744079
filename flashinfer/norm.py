"""Normalization APIs."""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .jit.norm import gen_norm_module

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def get_norm_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The norm module for ``dtype`` (torch.dtype or name), compiled on first use."""
    return gen_norm_module(dtype).build_and_load()


@flashinfer_api
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Root-mean-square normalization over the last dim.

    ``out[i] = input[i] / sqrt(mean(input[i] ** 2) + eps) * weight``, computed in float32.

    Args:
        input: ``[tokens, hidden]``, float16, bfloat16 or float32, last dim contiguous.
        weight: ``[hidden]``, same dtype as ``input``, contiguous.
        eps: added to the mean square before the square root.
        out: optional ``[tokens, hidden]`` output (may alias ``input``).

    Returns:
        ``out``, or a new tensor like ``input``.
    """
    checks.check_tensor("input", input)
    checks.check_tensor("weight", weight)
    eps = checks.check_eps(eps)
    checks.check_ndim("input", input, 2, "[tokens, hidden]")
    checks.check_ndim("weight", weight, 1, "[hidden]")
    if weight.shape[0] != input.shape[1]:
        raise ValueError(
            f"weight has {weight.shape[0]} elements, but input's hidden size is {input.shape[1]}"
        )
    checks.check_dtype("input", input, _DTYPES)
    checks.check_same_dtype("weight", weight, "input", input)
    checks.check_last_dim_contiguous("input", input)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous; call .contiguous() first")
    if out is not None:
        checks.check_tensor("out", out)
        if out.shape != input.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, input has {tuple(input.shape)}")
        checks.check_same_dtype("out", out, "input", input)
        checks.check_last_dim_contiguous("out", out)
    checks.check_cuda("input", input)
    checks.check_cuda("weight", weight, like=input)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    else:
        checks.check_cuda("out", out, like=input)
    if input.numel() == 0:
        return out
    get_norm_module(input.dtype).rmsnorm(out, input, weight, eps)
    return out
