"""Norm routines: rmsnorm, fused_add_rmsnorm, rmsnorm_quant (fp8 e4m3 output), layernorm."""

from __future__ import annotations

import argparse

import torch

from flashinfer.testing import reference

from . import Case, Routine, dtype_arg, register


def _add_rmsnorm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=8192, help="tokens (rows)")
    parser.add_argument("--hidden-size", type=int, default=4096, help="hidden size (columns)")
    parser.add_argument("--dtype", type=dtype_arg, default=torch.bfloat16)
    parser.add_argument("--eps", type=float, default=1e-6)


def _rmsnorm_case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    x = torch.randn(args.batch_size, args.hidden_size, dtype=args.dtype, device=device)
    w = torch.randn(args.hidden_size, dtype=args.dtype, device=device)
    out = torch.empty_like(x)
    return Case(
        label=f"{args.batch_size}x{args.hidden_size} {str(args.dtype).removeprefix('torch.')}",
        run=lambda: flashinfer.rmsnorm(x, w, args.eps, out=out),
        torch_run=lambda: torch.nn.functional.rms_norm(x, (args.hidden_size,), w, args.eps),
        reference=lambda: reference.rmsnorm(x, w, args.eps),
        output=lambda: out,
        bytes=(2 * x.numel() + w.numel()) * x.element_size(),
        atol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
        rtol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
    )


register(Routine("rmsnorm", "flashinfer.rmsnorm vs torch rms_norm", _add_rmsnorm_arguments,
                 _rmsnorm_case))


def _fused_add_rmsnorm_case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    x = torch.randn(args.batch_size, args.hidden_size, dtype=args.dtype, device=device)
    residual = torch.randn_like(x)
    w = torch.randn(args.hidden_size, dtype=args.dtype, device=device)
    x0, r0 = x.clone(), residual.clone()

    def run() -> None:
        # In place: the first call (the one --refcheck checks) sees x0 and r0; timed repeats
        # keep adding into the residual, which stays finite for any iteration count used.
        flashinfer.fused_add_rmsnorm(x, residual, w, args.eps)

    def torch_run() -> torch.Tensor:
        r = x0 + r0
        return torch.nn.functional.rms_norm(r, (args.hidden_size,), w, args.eps)

    return Case(
        label=f"{args.batch_size}x{args.hidden_size} {str(args.dtype).removeprefix('torch.')}",
        run=run,
        torch_run=torch_run,
        reference=lambda: reference.fused_add_rmsnorm(x0, r0, w, args.eps)[0],
        output=lambda: x,
        bytes=(4 * x.numel() + w.numel()) * x.element_size(),  # x, residual: read + written
        atol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
        rtol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
    )


def _layernorm_case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    x = torch.randn(args.batch_size, args.hidden_size, dtype=args.dtype, device=device)
    gamma = torch.rand(args.hidden_size, device=device) + 0.5
    beta = torch.randn(args.hidden_size, device=device)
    result: dict[str, torch.Tensor] = {}
    gamma_t, beta_t = gamma.to(args.dtype), beta.to(args.dtype)

    def run() -> None:
        result["out"] = flashinfer.layernorm(x, gamma, beta, args.eps)

    return Case(
        label=f"{args.batch_size}x{args.hidden_size} {str(args.dtype).removeprefix('torch.')}",
        run=run,
        torch_run=lambda: torch.nn.functional.layer_norm(x, (args.hidden_size,), gamma_t,
                                                         beta_t, args.eps),
        reference=lambda: reference.layernorm(x, gamma, beta, args.eps),
        output=lambda: result["out"],
        bytes=2 * x.numel() * x.element_size() + 8 * args.hidden_size,
        atol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
        rtol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
    )


_QUANT_SCALE = 1 / 16  # |rmsnorm| / scale of randn data stays mostly inside +-448


def _rmsnorm_quant_case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    x = torch.randn(args.batch_size, args.hidden_size, dtype=args.dtype, device=device)
    w = torch.randn(args.hidden_size, dtype=args.dtype, device=device)
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.tensor([_QUANT_SCALE], device=device)

    def torch_run() -> torch.Tensor:
        y = torch.nn.functional.rms_norm(x, (args.hidden_size,), w, args.eps)
        return (y.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)

    return Case(
        label=f"{args.batch_size}x{args.hidden_size} {str(args.dtype).removeprefix('torch.')}",
        run=lambda: flashinfer.rmsnorm_quant(out, x, w, scale, args.eps),
        torch_run=torch_run,
        reference=lambda: reference.rmsnorm(x, w, args.eps).clamp(-448 * _QUANT_SCALE,
                                                                  448 * _QUANT_SCALE),
        output=lambda: out.double() * _QUANT_SCALE,  # dequantized
        bytes=x.numel() * (x.element_size() + 1) + w.numel() * w.element_size(),
        # e4m3 keeps 3 mantissa bits: half a step is 2^-4 relative; subnormals 2^-10 absolute
        atol=_QUANT_SCALE * 2.0 ** -9,
        rtol=0.07,
    )


register(Routine("rmsnorm_quant", "flashinfer.rmsnorm_quant vs rms_norm + fp8 cast",
                 _add_rmsnorm_arguments, _rmsnorm_quant_case))
register(Routine("fused_add_rmsnorm", "flashinfer.fused_add_rmsnorm vs residual add + rms_norm",
                 _add_rmsnorm_arguments, _fused_add_rmsnorm_case))
register(Routine("layernorm", "flashinfer.layernorm vs torch layer_norm", _add_rmsnorm_arguments,
                 _layernorm_case))
