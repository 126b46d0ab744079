"""Attention-state merge routines (cascade attention's building blocks): merge_state and
merge_states, against their formula in torch eager mode. A state is ``v`` ``[seq_len,
num_heads, head_dim]`` with its base-2 log-sum-exp ``s`` ``[seq_len, num_heads]``."""

from __future__ import annotations

import argparse

import torch

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
    flag(group, "seq_len", type=int, default=8192, help="query positions")
    flag(group, "num_heads", type=int, default=32)
    flag(group, "head_dim", type=int, default=128)
    flag(group, "num_states", type=int, default=8, help="merge_states: states per position")
    flag(
        group,
        "input_dtype",
        "--dtype",
        type=dtype_arg(*HALF_DTYPES, torch.float32),
        default=torch.bfloat16,
        help="dtype of v (s is float32)",
    )


def _validate(args: argparse.Namespace) -> str | None:
    counts = ("seq_len", "num_heads", "head_dim", "num_states")
    if min(getattr(args, name) for name in counts) < 1:
        return f"{', '.join('--' + name for name in counts)} must be >= 1"
    return None


FAMILY = Family(
    "cascade",
    _add_arguments,
    ("seq_len", "num_heads", "head_dim", "num_states", "input_dtype"),
    _validate,
)


def merge(v: torch.Tensor, s: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """States stacked along ``dim`` of v ``[..., head_dim]`` and s merged, in the inputs'
    dtype: ``v = sum(2^s_i v_i) / sum(2^s_i)``, ``s = log2(sum(2^s_i))``."""
    top = s.amax(dim=dim, keepdim=True)
    weight = torch.exp2(s - top)
    total = weight.sum(dim=dim)
    merged = (v * weight[..., None]).sum(dim=dim) / total[..., None]
    return merged, top.squeeze(dim) + torch.log2(total)


def _flat(vs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.cat([vs[0].reshape(-1), vs[1].reshape(-1)])


def _states(
    args: argparse.Namespace, device: torch.device, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """v ``[seq_len, count, heads, dim]`` and s ``[seq_len, count, heads]`` (LSEs spread
    over a few units, so every state counts)."""
    v = torch.randn(
        args.seq_len, count, args.num_heads, args.head_dim, dtype=args.input_dtype, device=device
    )
    s = 4 * torch.randn(args.seq_len, count, args.num_heads, device=device)
    return v, s


def _torch_merge(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager equivalent: float32 math, v back in its dtype."""
    merged, lse = merge(v.float(), s, dim=1)
    return merged.to(v.dtype), lse


def _case(args: argparse.Namespace, device: torch.device, pairwise: bool) -> Case:
    count = 2 if pairwise else args.num_states
    v, s = _states(args, device, count)

    def ours() -> Backend:
        from flashinfer import merge_state, merge_states

        if pairwise:
            pairs = [t.contiguous() for t in (v[:, 0], s[:, 0], v[:, 1], s[:, 1])]
            return Backend(lambda: merge_state(*pairs), _flat)
        return Backend(lambda: merge_states(v, s), _flat)

    tolerance = half_tolerance(args.input_dtype) if args.input_dtype in HALF_DTYPES else 1e-4
    elements = v.numel() // count
    return Case(
        label=f"{args.seq_len}x{args.num_heads}x{args.head_dim} x{count} states "
        f"{dtype_name(args.input_dtype)}",
        backends=build(
            args.backends, {OURS: ours, "torch": lambda: Backend(lambda: _torch_merge(v, s), _flat)}
        ),
        bytes=(count + 1) * (elements * v.element_size() + 4 * elements // args.head_dim),
        reference=lambda: _flat(merge(v.double(), s.double(), dim=1)),
        atol=tolerance,
        rtol=tolerance,
    )


register(
    Routine(
        "merge_state",
        FAMILY,
        "merge_state (two states) vs torch eager",
        (OURS, "torch"),
        lambda args, device: _case(args, device, pairwise=True),
    )
)
register(
    Routine(
        "merge_states",
        FAMILY,
        "merge_states (--num_states) vs torch eager",
        (OURS, "torch"),
        lambda args, device: _case(args, device, pairwise=False),
    )
)
