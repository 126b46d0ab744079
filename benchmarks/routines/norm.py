"""Norm routines: (gemma_)rmsnorm, (gemma_)fused_add_rmsnorm, rmsnorm_quant,
fused_add_rmsnorm_quant (fp8 e4m3 output) and layernorm, each against its torch eager
equivalent (``torch.nn.functional.rms_norm`` / ``layer_norm``, plus the residual add and
the fp8 cast where the API fuses them)."""

from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F

from flashinfer.testing import reference

from . import (
    HALF_DTYPES,
    OURS,
    Backend,
    Case,
    Family,
    Routine,
    build,
    dtype_arg,
    dtype_name,
    flag,
    half_tolerance,
    register,
)

_FP8 = torch.float8_e4m3fn
_FP8_MAX = 448.0


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(group, "batch_size", type=int, default=8192, help="tokens (rows)")
    flag(group, "hidden_size", type=int, default=4096, help="normalized size (last dim)")
    flag(
        group,
        "num_heads",
        type=int,
        default=None,
        help="input [batch_size, num_heads, hidden_size] instead of 2-D",
    )
    flag(group, "input_dtype", "--dtype", type=dtype_arg(*HALF_DTYPES), default=torch.bfloat16)
    flag(group, "eps", type=float, default=1e-6)
    flag(group, "scale", type=float, default=1.0, help="*_quant: out = fp8(norm / scale)")
    flag(group, "out_dtype", choices=("fp8_e4m3",), default="fp8_e4m3", help="*_quant output dtype")


def _validate(args: argparse.Namespace) -> str | None:
    if min(args.batch_size, args.hidden_size, args.num_heads or 1) < 1:
        return "--batch_size, --hidden_size and --num_heads must be >= 1"
    if not args.scale > 0:
        return "--scale must be > 0"
    return None


FAMILY = Family(
    "norm",
    _add_arguments,
    ("batch_size", "hidden_size", "num_heads", "input_dtype", "eps", "scale", "out_dtype"),
    _validate,
)


def _input(args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    rows = (args.batch_size,) if args.num_heads is None else (args.batch_size, args.num_heads)
    return torch.randn(*rows, args.hidden_size, dtype=args.input_dtype, device=device)


def _label(args: argparse.Namespace) -> str:
    heads = "" if args.num_heads is None else f"x{args.num_heads}"
    return f"{args.batch_size}{heads}x{args.hidden_size} {dtype_name(args.input_dtype)}"


def _quantize(y: torch.Tensor, scale: float) -> torch.Tensor:
    return (y.float() / scale).clamp(-_FP8_MAX, _FP8_MAX).to(_FP8)


def _norm_case(
    args: argparse.Namespace,
    backends: dict[str, Backend],
    bytes: int,
    expected: Callable[[], torch.Tensor],
    quant: bool,
) -> Case:
    """The case of a norm whose fa2 / torch outputs are ``[rows, hidden]`` values (fp8 ones
    dequantized by the backends' ``output``); ``expected`` is the float64 truth."""
    if quant:  # e4m3: 3 mantissa bits (half a step is 2^-4 relative), subnormals 2^-9 apart
        atol, rtol = args.scale * 2.0**-9, 0.07
    else:
        atol = rtol = half_tolerance(args.input_dtype)
    return Case(_label(args), backends, bytes, reference=expected, atol=atol, rtol=rtol)


def _rms_case(args: argparse.Namespace, device: torch.device, gemma: bool) -> Case:
    x = _input(args, device)
    w = torch.randn(args.hidden_size, dtype=args.input_dtype, device=device)
    w_torch = w + 1 if gemma else w

    def ours() -> Backend:
        import flashinfer

        api = flashinfer.gemma_rmsnorm if gemma else flashinfer.rmsnorm
        out = torch.empty_like(x)
        return Backend(lambda: api(x, w, args.eps, out=out, enable_pdl=args.enable_pdl))

    backends = build(
        args.backends,
        {
            OURS: ours,
            "torch": lambda: Backend(lambda: F.rms_norm(x, (args.hidden_size,), w_torch, args.eps)),
        },
    )
    truth = reference.gemma_rmsnorm if gemma else reference.rmsnorm
    return _norm_case(
        args,
        backends,
        (2 * x.numel() + w.numel()) * x.element_size(),
        lambda: truth(x, w, args.eps),
        quant=False,
    )


def _fused_add_case(args: argparse.Namespace, device: torch.device, gemma: bool) -> Case:
    """In place: the first call (the one --refcheck reads) sees the initial x and residual;
    timed repeats keep adding into the residual, which stays finite for any count used."""
    x0 = _input(args, device)
    r0 = torch.randn_like(x0)
    w = torch.randn(args.hidden_size, dtype=args.input_dtype, device=device)
    w_torch = w + 1 if gemma else w

    def ours() -> Backend:
        import flashinfer

        api = flashinfer.gemma_fused_add_rmsnorm if gemma else flashinfer.fused_add_rmsnorm
        x, residual = x0.clone(), r0.clone()

        def call() -> torch.Tensor:
            api(x, residual, w, args.eps, enable_pdl=args.enable_pdl)
            return x

        return Backend(call)

    backends = build(
        args.backends,
        {
            OURS: ours,
            "torch": lambda: Backend(
                lambda: F.rms_norm(x0 + r0, (args.hidden_size,), w_torch, args.eps)
            ),
        },
    )
    return _norm_case(
        args,
        backends,
        (4 * x0.numel() + w.numel()) * x0.element_size(),
        lambda: reference.fused_add_rmsnorm(x0, r0, w, args.eps, float(gemma))[0],
        quant=False,
    )


def _quant_case(args: argparse.Namespace, device: torch.device, fused_add: bool) -> Case:
    """fp8 output ``fp8(clamp(norm / scale, +-448))``, compared dequantized."""
    x = _input(args, device)
    r0 = torch.randn_like(x)
    w = torch.randn(args.hidden_size, dtype=args.input_dtype, device=device)
    scale = args.scale

    def dequantized(out: torch.Tensor) -> torch.Tensor:
        return out.double() * scale

    def ours() -> Backend:
        import flashinfer

        out = torch.empty(x.shape, dtype=_FP8, device=device)
        residual = r0.clone()

        def call() -> torch.Tensor:
            if fused_add:
                flashinfer.fused_add_rmsnorm_quant(
                    out, x, residual, w, scale, args.eps, enable_pdl=args.enable_pdl
                )
            else:
                flashinfer.rmsnorm_quant(out, x, w, scale, args.eps, enable_pdl=args.enable_pdl)
            return out

        return Backend(call, dequantized)

    def torch_call() -> torch.Tensor:
        y = F.rms_norm(x + r0 if fused_add else x, (args.hidden_size,), w, args.eps)
        return _quantize(y, scale)

    def expected() -> torch.Tensor:
        y = (
            reference.fused_add_rmsnorm(x, r0, w, args.eps)[0]
            if fused_add
            else reference.rmsnorm(x, w, args.eps)
        )
        return y.clamp(-_FP8_MAX * scale, _FP8_MAX * scale)

    backends = build(args.backends, {OURS: ours, "torch": lambda: Backend(torch_call, dequantized)})
    moved = x.numel() * (x.element_size() * (3 if fused_add else 1) + 1)
    return _norm_case(args, backends, moved + w.numel() * w.element_size(), expected, quant=True)


def _layernorm_case(args: argparse.Namespace, device: torch.device) -> Case:
    x = _input(args, device)
    gamma = torch.rand(args.hidden_size, device=device) + 0.5  # float32, as the API takes them
    beta = torch.randn(args.hidden_size, device=device)
    gamma_t, beta_t = gamma.to(args.input_dtype), beta.to(args.input_dtype)

    def ours() -> Backend:
        from flashinfer import layernorm

        return Backend(lambda: layernorm(x, gamma, beta, args.eps))

    backends = build(
        args.backends,
        {
            OURS: ours,
            "torch": lambda: Backend(
                lambda: F.layer_norm(x, (args.hidden_size,), gamma_t, beta_t, args.eps)
            ),
        },
    )
    return _norm_case(
        args,
        backends,
        2 * x.numel() * x.element_size() + 8 * args.hidden_size,
        lambda: reference.layernorm(x, gamma, beta, args.eps),
        quant=False,
    )


_BACKENDS = (OURS, "torch")


def _register(
    name: str, help: str, make_case: Callable[[argparse.Namespace, torch.device], Case], pdl: bool
) -> None:
    register(Routine(name, FAMILY, help, _BACKENDS, make_case, pdl=pdl))


_register(
    "rmsnorm",
    "rmsnorm vs torch rms_norm",
    lambda args, device: _rms_case(args, device, gemma=False),
    pdl=True,
)
_register(
    "gemma_rmsnorm",
    "gemma_rmsnorm (weight + 1) vs torch rms_norm",
    lambda args, device: _rms_case(args, device, gemma=True),
    pdl=True,
)
_register(
    "fused_add_rmsnorm",
    "fused_add_rmsnorm (in place) vs residual add + rms_norm",
    lambda args, device: _fused_add_case(args, device, gemma=False),
    pdl=True,
)
_register(
    "gemma_fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm (in place) vs residual add + rms_norm",
    lambda args, device: _fused_add_case(args, device, gemma=True),
    pdl=True,
)
_register(
    "rmsnorm_quant",
    "rmsnorm_quant (fp8 out) vs rms_norm + fp8 cast",
    lambda args, device: _quant_case(args, device, fused_add=False),
    pdl=True,
)
_register(
    "fused_add_rmsnorm_quant",
    "fused_add_rmsnorm_quant (fp8 out) vs residual add + rms_norm + fp8 cast",
    lambda args, device: _quant_case(args, device, fused_add=True),
    pdl=True,
)
_register("layernorm", "layernorm vs torch layer_norm", _layernorm_case, pdl=False)
