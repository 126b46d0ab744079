"""Gated activation routines: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, each against
``act(x[..., :d]) * x[..., d:]`` in torch eager mode."""

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


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(group, "batch_size", type=int, default=8192, help="tokens (rows)")
    flag(group, "hidden_size", type=int, default=14336, help="d: the output width (input 2d)")
    flag(group, "input_dtype", "--dtype", type=dtype_arg(*HALF_DTYPES), default=torch.bfloat16)


def _validate(args: argparse.Namespace) -> str | None:
    if min(args.batch_size, args.hidden_size) < 1:
        return "--batch_size and --hidden_size must be >= 1"
    return None


FAMILY = Family(
    "activation", _add_arguments, ("batch_size", "hidden_size", "input_dtype"), _validate
)


def _routine(name: str, act: str, torch_act: Callable[[torch.Tensor], torch.Tensor]) -> Routine:
    def make_case(args: argparse.Namespace, device: torch.device) -> Case:
        d = args.hidden_size
        x = torch.randn(args.batch_size, 2 * d, dtype=args.input_dtype, device=device)

        def ours() -> Backend:
            import flashinfer

            api = getattr(flashinfer, name)
            out = torch.empty(args.batch_size, d, dtype=args.input_dtype, device=device)
            return Backend(lambda: api(x, out=out, enable_pdl=args.enable_pdl))

        tolerance = half_tolerance(args.input_dtype)
        return Case(
            label=f"{args.batch_size}x{d} {dtype_name(args.input_dtype)}",
            backends=build(
                args.backends,
                {
                    OURS: ours,
                    "torch": lambda: Backend(lambda: torch_act(x[..., :d]) * x[..., d:]),
                },
            ),
            bytes=3 * args.batch_size * d * x.element_size(),
            reference=lambda: reference.act_and_mul(x, act),
            atol=tolerance,
            rtol=tolerance,
        )

    return Routine(name, FAMILY, f"{name} vs torch eager", (OURS, "torch"), make_case, pdl=True)


register(_routine("silu_and_mul", "silu", F.silu))
register(_routine("gelu_and_mul", "gelu", F.gelu))
register(_routine("gelu_tanh_and_mul", "gelu_tanh", lambda t: F.gelu(t, approximate="tanh")))
