"""Norm routines: rmsnorm."""

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
