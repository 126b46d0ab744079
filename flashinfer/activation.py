"""Gated activations: ``act(input[..., :d]) * input[..., d:]`` for input ``[..., 2 * d]``,
with the reference library's signatures. ``enable_pdl=None`` turns programmatic dependent
launch on for sm90+ devices. Each kernel is the torch custom op of the API's name
(``torch.ops.flashinfer.silu_and_mul``, ...), writing ``out``; see docs/compile.md."""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .custom_op import kernel_op
from .jit.activation import gen_act_and_mul_module
from .pdl import resolve_enable_pdl
from .trace.templates import activation as _trace

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def get_act_and_mul_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The gated-activation module for ``dtype``, compiled on first use."""
    return gen_act_and_mul_module(dtype).build_and_load()


def _rows(name: str, tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` as ``[rows, width]`` without a copy (leading dims merged)."""
    try:
        return tensor.view(-1, width)
    except RuntimeError:
        raise ValueError(
            f"{name}'s leading dims cannot be merged without a copy (strides "
            f"{tuple(tensor.stride())}); call .contiguous() first"
        ) from None


def _new_act_and_mul_op(function: str) -> Any:
    """The op of ``function``: ``out`` ``[rows, d]`` from ``input`` ``[rows, 2 * d]`` (or both
    as passed when empty)."""

    @kernel_op(function, mutates_args=("out",))
    def op(out: torch.Tensor, input: torch.Tensor, enable_pdl: bool | None) -> None:
        checks.check_distinct("out", out, "input", input)
        if input.numel():
            module = get_act_and_mul_module(input.dtype)
            getattr(module, function)(out, input, resolve_enable_pdl(enable_pdl, input.device))

    return op


_silu_and_mul_op = _new_act_and_mul_op("silu_and_mul")
_gelu_and_mul_op = _new_act_and_mul_op("gelu_and_mul")
_gelu_tanh_and_mul_op = _new_act_and_mul_op("gelu_tanh_and_mul")


def _act_and_mul(op: Any, input: Any, out: Any, enable_pdl: Any) -> torch.Tensor:
    checks.check_tensor("input", input)
    if input.dim() < 1:
        raise ValueError("input must have at least 1 dim [..., 2 * d]")
    if input.shape[-1] % 2:
        raise ValueError(
            f"input's last dim must be even (gate and up halves), got {input.shape[-1]}"
        )
    d = input.shape[-1] // 2
    checks.check_dtype("input", input, _DTYPES)
    checks.check_last_dim_contiguous("input", input)
    expected = (*input.shape[:-1], d)
    if out is not None:
        checks.check_tensor("out", out)
        if tuple(out.shape) != expected:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {expected}")
        checks.check_same_dtype("out", out, "input", input)
        checks.check_last_dim_contiguous("out", out)
        checks.check_writable("out", out)
    rows_in = _rows("input", input, 2 * d) if d else input
    rows_out = _rows("out", out, d) if out is not None and d else out
    checks.check_optional_bool("enable_pdl", enable_pdl)
    checks.check_cuda("input", input)
    if out is None:
        out = torch.empty(expected, dtype=input.dtype, device=input.device)
        rows_out = out.view(-1, d) if d else out
    else:
        checks.check_cuda("out", out, like=input)
    op(rows_out, rows_in, enable_pdl)
    return out


@flashinfer_api(trace=_trace.silu_and_mul_trace)
def silu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` (SwiGLU), math in float32.

    Args:
        input: ``[..., 2 * d]``, float16, bfloat16 or float32, last dim contiguous (any
            ``d``: unlike the reference library, no 16-byte multiple is required).
        out: optional ``[..., d]`` output of the same dtype.
        enable_pdl: programmatic dependent launch; ``None``: on for sm90+.
    """
    return _act_and_mul(_silu_and_mul_op, input, out, enable_pdl)


@flashinfer_api(trace=_trace.gelu_and_mul_trace)
def gelu_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` with the exact (erf) GELU (GeGLU).
    Arguments as :func:`silu_and_mul`."""
    return _act_and_mul(_gelu_and_mul_op, input, out, enable_pdl)


@flashinfer_api(trace=_trace.gelu_tanh_and_mul_trace)
def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """``gelu(input[..., :d], approximate="tanh") * input[..., d:]``.
    Arguments as :func:`silu_and_mul`."""
    return _act_and_mul(_gelu_tanh_and_mul_op, input, out, enable_pdl)
