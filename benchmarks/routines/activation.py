"""Gated activation routines: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul."""

from __future__ import annotations

import argparse

import torch

from flashinfer.testing import reference

from . import Case, Routine, dtype_arg, register


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=8192, help="tokens (rows)")
    parser.add_argument("--hidden-size", type=int, default=14336, help="d: output width")
    parser.add_argument("--dtype", type=dtype_arg, default=torch.bfloat16)


def _routine(name: str, act: str, torch_act) -> Routine:  # noqa: ANN001
    def make_case(args: argparse.Namespace, device: torch.device) -> Case:
        import flashinfer

        api = getattr(flashinfer, name)
        d = args.hidden_size
        x = torch.randn(args.batch_size, 2 * d, dtype=args.dtype, device=device)
        out = torch.empty(args.batch_size, d, dtype=args.dtype, device=device)
        return Case(
            label=f"{args.batch_size}x{d} {str(args.dtype).removeprefix('torch.')}",
            run=lambda: api(x, out=out),
            torch_run=lambda: torch_act(x[..., :d]) * x[..., d:],
            reference=lambda: reference.act_and_mul(x, act),
            output=lambda: out,
            bytes=3 * args.batch_size * d * x.element_size(),
            atol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
            rtol=2e-2 if args.dtype == torch.bfloat16 else 1e-2,
        )

    return Routine(name, f"flashinfer.{name} vs torch eager", _add_arguments, make_case)


register(_routine("silu_and_mul", "silu", torch.nn.functional.silu))
register(_routine("gelu_and_mul", "gelu", torch.nn.functional.gelu))
register(_routine("gelu_tanh_and_mul", "gelu_tanh",
                  lambda t: torch.nn.functional.gelu(t, approximate="tanh")))
