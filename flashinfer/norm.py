"""Normalization APIs: RMSNorm (and Gemma's), fused residual-add RMSNorm, their fp8 e4m3
quantized variants, and LayerNorm, with the reference library's signatures.

Inputs are ``[tokens, hidden]`` or ``[tokens, heads, head_dim]`` (normalized over the last
dim, e.g. per-head QK norm), any strides with a contiguous last dim; math in float32.
``enable_pdl=None`` turns programmatic dependent launch on for sm90+ devices.

Each kernel is the torch custom op of the API's name (``torch.ops.flashinfer.rmsnorm``, ...,
see docs/compile.md): the functions here check and allocate in traceable torch code, then
make one op call, which writes ``out`` (and ``input``/``residual`` for the fused adds).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .custom_op import kernel_op
from .jit.norm import gen_norm_module, gen_norm_quant_module
from .pdl import resolve_enable_pdl
from .trace.templates import norm as _trace

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAYOUT = "[tokens, hidden] or 3-D [tokens, heads, head_dim]"
_FP8 = torch.float8_e4m3fn


@functools.cache
def get_norm_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The norm module for ``dtype`` (torch.dtype or name), compiled on first use."""
    return gen_norm_module(dtype).build_and_load()


@functools.cache
def get_norm_quant_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The fp8-output norm module for input ``dtype``, compiled on first use."""
    return gen_norm_quant_module(dtype).build_and_load()


def _check_rows(name: str, tensor: Any) -> torch.Tensor:
    checks.check_tensor(name, tensor)
    if tensor.dim() not in (2, 3):
        raise ValueError(
            f"{name} must be 2-D {_LAYOUT}, got {tensor.dim()}-D with shape {tuple(tensor.shape)}"
        )
    return tensor


def _check_vector(name: str, vector: Any, input: torch.Tensor) -> None:
    checks.check_tensor(name, vector)
    checks.check_ndim(name, vector, 1, "[hidden]")
    if vector.shape[0] != input.shape[-1]:
        raise ValueError(
            f"{name} has {vector.shape[0]} elements, but input's last dim is {input.shape[-1]}"
        )
    if not vector.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")


def _check_shaped_like(name: str, tensor: Any, input: torch.Tensor) -> None:
    """Shaped like ``input`` with a contiguous last dim (an out= or residual)."""
    checks.check_tensor(name, tensor)
    if tensor.shape != input.shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input has {tuple(input.shape)}")
    checks.check_last_dim_contiguous(name, tensor)
    checks.check_writable(name, tensor)


def _check_like(name: str, tensor: Any, input: torch.Tensor) -> None:
    """Shaped like ``input``, of its dtype, contiguous last dim."""
    _check_shaped_like(name, tensor, input)
    checks.check_same_dtype(name, tensor, "input", input)


def _check_input_and_weight(input: Any, weight: Any, eps: Any) -> float:
    """The checks every RMSNorm shares; returns ``eps`` as a float."""
    _check_rows("input", input)
    eps = checks.check_eps(eps)
    _check_vector("weight", weight, input)
    checks.check_dtype("input", input, _DTYPES)
    checks.check_same_dtype("weight", weight, "input", input)
    checks.check_last_dim_contiguous("input", input)
    return eps


def _check_residual(residual: Any, input: torch.Tensor) -> None:
    """The fused adds write ``residual`` (and fused_add_rmsnorm ``input`` too)."""
    _check_like("residual", residual, input)
    checks.check_distinct("input", input, "residual", residual)


def _check_fp8_out(out: Any, input: torch.Tensor) -> None:
    _check_shaped_like("out", out, input)
    if out.dtype != _FP8:
        raise TypeError(f"out has dtype {out.dtype}; supported: float8_e4m3fn")


def _check_scale(scale: Any) -> tuple[torch.Tensor | None, float]:
    """``scale`` as (tensor, None) or (None, value): a float tensor of shape () or (1,), or a
    finite positive number. The output is ``out / scale`` before the fp8 cast."""
    if isinstance(scale, torch.Tensor):
        if not (scale.dim() == 0 or (scale.dim() == 1 and scale.shape[0] == 1)):
            raise ValueError(
                f"scale must be a scalar tensor or have shape (1,), got shape {tuple(scale.shape)}"
            )
        if not scale.is_floating_point():
            raise TypeError(
                f"scale has dtype {scale.dtype}; expected a floating dtype (float32 is used as is)"
            )
        return scale, 1.0
    return None, checks.check_number(
        "scale", scale, 0.0, low_open=True, kind="a float or a torch.Tensor"
    )


def _scale_on(scale: torch.Tensor | None, input: torch.Tensor) -> torch.Tensor | None:
    """The scale tensor as the kernel reads it: float32 on ``input``'s device (moved or
    converted like the reference library does, which costs a copy)."""
    if scale is None:
        return None
    return scale.to(device=input.device, dtype=torch.float32)


def _check_devices(enable_pdl: Any, input: torch.Tensor, **operands: torch.Tensor) -> None:
    """Type-checks ``enable_pdl`` (resolved where the op runs), then the devices (``input``
    first)."""
    checks.check_optional_bool("enable_pdl", enable_pdl)
    checks.check_cuda("input", input)
    for name, tensor in operands.items():
        checks.check_cuda(name, tensor, like=input)


def _pdl(enable_pdl: bool | None, input: torch.Tensor) -> bool:
    return resolve_enable_pdl(enable_pdl, input.device)


def _new_rmsnorm_op(function: str) -> Any:
    """The op of ``function`` (rmsnorm or gemma_rmsnorm): writes ``out``."""

    @kernel_op(function, mutates_args=("out",))
    def op(
        out: torch.Tensor,
        input: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        enable_pdl: bool | None,
    ) -> None:
        # Each element is read before it is written, by the thread that writes it: out may
        # be input itself, not another view of its memory.
        checks.check_distinct("out", out, "input", input, same_allowed=True)
        if input.numel():
            module = get_norm_module(input.dtype)
            getattr(module, function)(out, input, weight, eps, _pdl(enable_pdl, input))

    return op


def _new_fused_add_rmsnorm_op(function: str) -> Any:
    """The op of ``function`` (fused_add_rmsnorm or its Gemma form): writes ``input`` and
    ``residual``, which it checks are distinct now that their pointers are real."""

    @kernel_op(function, mutates_args=("input", "residual"))
    def op(
        input: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        enable_pdl: bool | None,
    ) -> None:
        checks.check_distinct("input", input, "residual", residual)
        if input.numel():
            module = get_norm_module(input.dtype)
            getattr(module, function)(input, residual, weight, eps, _pdl(enable_pdl, input))

    return op


_rmsnorm_op = _new_rmsnorm_op("rmsnorm")
_gemma_rmsnorm_op = _new_rmsnorm_op("gemma_rmsnorm")
_fused_add_rmsnorm_op = _new_fused_add_rmsnorm_op("fused_add_rmsnorm")
_gemma_fused_add_rmsnorm_op = _new_fused_add_rmsnorm_op("gemma_fused_add_rmsnorm")


@kernel_op("rmsnorm_quant", mutates_args=("out",))
def _rmsnorm_quant_op(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    scale_value: float,
    eps: float,
    enable_pdl: bool | None,
) -> None:
    checks.check_distinct("out", out, "input", input)
    if input.numel():
        get_norm_quant_module(input.dtype).rmsnorm_quant(
            out, input, weight, scale, scale_value, eps, _pdl(enable_pdl, input)
        )


@kernel_op("fused_add_rmsnorm_quant", mutates_args=("out", "residual"))
def _fused_add_rmsnorm_quant_op(
    out: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    scale_value: float,
    eps: float,
    enable_pdl: bool | None,
) -> None:
    checks.check_distinct("input", input, "residual", residual)
    checks.check_distinct("out", out, "input", input)
    checks.check_distinct("out", out, "residual", residual)
    if input.numel():
        get_norm_quant_module(input.dtype).fused_add_rmsnorm_quant(
            out, input, residual, weight, scale, scale_value, eps, _pdl(enable_pdl, input)
        )


@kernel_op("layernorm", mutates_args=("out",))
def _layernorm_op(
    out: torch.Tensor, input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float
) -> None:
    checks.check_distinct("out", out, "input", input, same_allowed=True)
    if input.numel():
        get_norm_module(input.dtype).layernorm(out, input, gemma, beta, eps, _pdl(None, input))


def _rmsnorm(input: Any, weight: Any, eps: Any, out: Any, enable_pdl: Any, op: Any) -> torch.Tensor:
    eps = _check_input_and_weight(input, weight, eps)
    if out is not None:
        _check_like("out", out, input)
    _check_devices(enable_pdl, input, weight=weight)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    else:
        checks.check_cuda("out", out, like=input)
    op(out, input, weight, eps, enable_pdl)
    return out


@flashinfer_api(trace=_trace.rmsnorm_trace)
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``out = input / sqrt(mean(input ** 2, -1) + eps) * weight``, computed in float32.

    Args:
        input: ``[tokens, hidden]`` or ``[tokens, heads, head_dim]``; float16, bfloat16 or
            float32; last dim contiguous.
        weight: ``[hidden]`` (or ``[head_dim]``), same dtype, contiguous.
        eps: added to the mean square before the square root.
        out: optional output shaped like ``input`` (may be ``input`` itself).
        enable_pdl: programmatic dependent launch; ``None``: on for sm90+.

    Returns:
        ``out``, or a new tensor like ``input``.
    """
    return _rmsnorm(input, weight, eps, out, enable_pdl, _rmsnorm_op)


@flashinfer_api(trace=_trace.gemma_rmsnorm_trace)
def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma's RMSNorm: ``input / sqrt(mean(input ** 2, -1) + eps) * (weight + 1)``.
    Arguments as :func:`rmsnorm`."""
    return _rmsnorm(input, weight, eps, out, enable_pdl, _gemma_rmsnorm_op)


def _fused_add_rmsnorm(
    input: Any, residual: Any, weight: Any, eps: Any, enable_pdl: Any, op: Any
) -> None:
    eps = _check_input_and_weight(input, weight, eps)
    _check_residual(residual, input)
    checks.check_writable("input", input)  # the normalized sum is written over it
    _check_devices(enable_pdl, input, residual=residual, weight=weight)
    op(input, residual, weight, eps, enable_pdl)


@flashinfer_api(trace=_trace.fused_add_rmsnorm_trace)
def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual, weight, eps)``.

    The sum is formed in float32; ``residual`` stores it rounded to its dtype, and the norm
    is taken of the unrounded float32 sum (as the reference library does). Shapes and dtypes
    as :func:`rmsnorm`; ``residual`` is shaped like ``input``.
    """
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, _fused_add_rmsnorm_op)


@flashinfer_api(trace=_trace.gemma_fused_add_rmsnorm_trace)
def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """:func:`fused_add_rmsnorm` with Gemma's ``weight + 1``."""
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, _gemma_fused_add_rmsnorm_op)


@flashinfer_api(trace=_trace.rmsnorm_quant_trace)
def rmsnorm_quant(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: float | torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """:func:`rmsnorm` quantized to fp8: ``out = fp8_e4m3(clamp(rmsnorm(input) / scale,
    -448, 448))``, rounded to nearest even (the reference library's quantization).

    Args:
        out: ``float8_e4m3fn`` output shaped like ``input``, last dim contiguous.
        input, weight, eps, enable_pdl: as :func:`rmsnorm`.
        scale: the dequantization scale, a float tensor of shape ``()`` or ``(1,)`` (read on
            the device, so it may be produced by a previous kernel; converted to float32 on
            ``input``'s device first if it is not already) or a positive float.
    """
    eps = _check_input_and_weight(input, weight, eps)
    _check_fp8_out(out, input)
    scale, scale_value = _check_scale(scale)
    _check_devices(enable_pdl, input, weight=weight, out=out)
    _rmsnorm_quant_op(out, input, weight, _scale_on(scale, input), scale_value, eps, enable_pdl)


@flashinfer_api(trace=_trace.fused_add_rmsnorm_quant_trace)
def fused_add_rmsnorm_quant(
    out: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: float | torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """``residual += input`` (float32 sum, stored rounded to its dtype), then ``out`` = the
    fp8 quantized RMSNorm of the float32 sum as in :func:`rmsnorm_quant`. ``input`` is left
    unchanged. Arguments as :func:`fused_add_rmsnorm` and :func:`rmsnorm_quant`."""
    eps = _check_input_and_weight(input, weight, eps)
    _check_residual(residual, input)
    _check_fp8_out(out, input)
    scale, scale_value = _check_scale(scale)
    _check_devices(enable_pdl, input, residual=residual, weight=weight, out=out)
    _fused_add_rmsnorm_quant_op(
        out, input, residual, weight, _scale_on(scale, input), scale_value, eps, enable_pdl
    )


@flashinfer_api(trace=_trace.layernorm_trace)
def layernorm(
    input: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``(input - mean) / sqrt(var + eps) * gemma + beta`` over the last dim, in float32.

    Args:
        input: ``[tokens, hidden]`` or ``[tokens, heads, head_dim]``; float16, bfloat16 or
            float32; last dim contiguous.
        gemma: the scale (usually called gamma; named as in the reference library),
            ``[hidden]`` float32, contiguous.
        beta: the shift, ``[hidden]`` float32, contiguous.
        eps: added to the variance.

    Launched with programmatic dependent launch on sm90+ (the reference takes no
    ``enable_pdl`` here).
    """
    _check_rows("input", input)
    eps = checks.check_eps(eps)
    _check_vector("gemma", gemma, input)
    _check_vector("beta", beta, input)
    checks.check_dtype("input", input, _DTYPES)
    checks.check_dtype("gemma", gemma, (torch.float32,))
    checks.check_dtype("beta", beta, (torch.float32,))
    checks.check_last_dim_contiguous("input", input)
    _check_devices(None, input, gemma=gemma, beta=beta)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    _layernorm_op(out, input, gemma, beta, eps)
    return out
