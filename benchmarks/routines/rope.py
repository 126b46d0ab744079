"""RoPE routines: apply_rope (ragged batch: indptr and offsets), apply_rope_pos_ids and
apply_llama31_rope_pos_ids, each against a torch eager rotation of q and k (NeoX halves,
or GPT-J pairs with --interleave). Request ``b``'s tokens sit at positions 0 .. seq_len-1."""

from __future__ import annotations

import argparse

import torch

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
    register,
)


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(group, "batch_size", type=int, default=1, help="requests")
    flag(group, "seq_len", type=int, default=8192, help="tokens per request")
    flag(group, "num_qo_heads", type=int, default=32)
    flag(group, "num_kv_heads", type=int, default=8)
    flag(group, "head_dim", type=int, default=128)
    flag(group, "rotary_dim", type=int, default=None, help="default: --head_dim")
    flag(group, "input_dtype", "--dtype", type=dtype_arg(*HALF_DTYPES), default=torch.float16)
    flag(group, "rope_scale", type=float, default=1.0)
    flag(group, "rope_theta", type=float, default=1e4)
    flag(group, "interleave", action="store_true", help="GPT-J pairs instead of NeoX halves")
    flag(group, "low_freq_factor", type=float, default=1.0, help="llama31")
    flag(group, "high_freq_factor", type=float, default=4.0, help="llama31")
    flag(group, "old_context_len", type=int, default=8192, help="llama31")


def _validate(args: argparse.Namespace) -> str | None:
    args.rotary_dim = args.head_dim if args.rotary_dim is None else args.rotary_dim
    counts = ("batch_size", "seq_len", "num_qo_heads", "num_kv_heads", "head_dim")
    if min(getattr(args, name) for name in counts) < 1:
        return f"{', '.join('--' + name for name in counts)} must be >= 1"
    if args.rotary_dim % 2 or not 0 < args.rotary_dim <= args.head_dim:
        return "--rotary_dim must be even and in (0, --head_dim]"
    return None


FAMILY = Family(
    "rope",
    _add_arguments,
    (
        "batch_size",
        "seq_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "rotary_dim",
        "input_dtype",
        "rope_scale",
        "rope_theta",
        "interleave",
    ),
    _validate,
)


def _torch_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool
) -> torch.Tensor:
    """x ``[nnz, heads, head_dim]`` rotated by cos/sin ``[nnz, 1, rotary_dim / 2]``; the
    dims past the rotary ones are kept."""
    rotary = 2 * cos.shape[-1]
    rot, rest = x[..., :rotary], x[..., rotary:]
    if interleave:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = rot.chunk(2, dim=-1)
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def _routine(name: str, ragged: bool, llama31: bool) -> Routine:
    def make_case(args: argparse.Namespace, device: torch.device) -> Case:
        nnz, dtype = args.batch_size * args.seq_len, args.input_dtype
        q = torch.randn(nnz, args.num_qo_heads, args.head_dim, dtype=dtype, device=device)
        k = torch.randn(nnz, args.num_kv_heads, args.head_dim, dtype=dtype, device=device)
        pos = torch.arange(args.seq_len, dtype=torch.int32, device=device).repeat(args.batch_size)
        factors = (
            (args.low_freq_factor, args.high_freq_factor, float(args.old_context_len))
            if llama31
            else None
        )
        freq = reference.rope_frequencies(
            args.rotary_dim, args.rope_scale, args.rope_theta, factors
        ).to(device)
        options = dict(
            rotary_dim=args.rotary_dim,
            interleave=args.interleave,
            rope_scale=args.rope_scale,
            rope_theta=args.rope_theta,
        )
        if llama31:
            options.update(
                low_freq_factor=args.low_freq_factor,
                high_freq_factor=args.high_freq_factor,
                old_context_len=args.old_context_len,
            )

        def ours() -> Backend:
            import flashinfer

            api = getattr(flashinfer, name)
            if ragged:
                int32 = dict(dtype=torch.int32, device=device)
                indptr = torch.arange(0, nnz + 1, args.seq_len, **int32)
                offsets = torch.zeros(args.batch_size, **int32)
                return Backend(lambda: api(q, k, indptr, offsets, **options), _flat)
            return Backend(lambda: api(q, k, pos, **options), _flat)

        def torch_call() -> tuple[torch.Tensor, torch.Tensor]:
            angles = pos.float()[:, None] * freq[None, :]
            cos = angles.cos()[:, None, :].to(dtype)
            sin = angles.sin()[:, None, :].to(dtype)
            return (
                _torch_rope(q, cos, sin, args.interleave),
                _torch_rope(k, cos, sin, args.interleave),
            )

        def expected() -> torch.Tensor:
            angles = pos.float()[:, None] * freq[None, :]  # float32, as the kernel forms them
            return _flat(
                (
                    reference.rope(q, angles, args.interleave),
                    reference.rope(k, angles, args.interleave),
                )
            )

        return Case(
            label=f"{nnz}x({args.num_qo_heads}+{args.num_kv_heads})x{args.head_dim} "
            f"{dtype_name(dtype)}",
            backends=build(
                args.backends, {OURS: ours, "torch": lambda: Backend(torch_call, _flat)}
            ),
            bytes=2 * (q.numel() + k.numel()) * q.element_size() + 4 * nnz,
            reference=expected,
            atol=3e-2,  # angles of positions in the thousands, float32 like the kernel's
            rtol=3e-2,
        )

    kind = "llama 3.1 " if llama31 else ""
    where = "indptr/offsets" if ragged else "pos_ids"
    return Routine(
        name, FAMILY, f"{kind}RoPE at {where} vs torch eager", (OURS, "torch"), make_case
    )


def _flat(qk: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The rotated q and k as one vector, compared at once."""
    return torch.cat([qk[0].reshape(-1), qk[1].reshape(-1)])


register(_routine("apply_rope", ragged=True, llama31=False))
register(_routine("apply_rope_pos_ids", ragged=False, llama31=False))
register(_routine("apply_llama31_rope_pos_ids", ragged=False, llama31=True))
