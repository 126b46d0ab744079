"""RoPE routine: apply_rope_pos_ids vs a torch eager NeoX implementation."""

from __future__ import annotations

import argparse

import torch

from flashinfer.testing import reference

from . import Case, Routine, dtype_arg, register


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=8192, help="tokens (nnz)")
    parser.add_argument("--hidden-size", type=int, default=128, help="head_dim (all rotary)")
    parser.add_argument("--num-qo-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--dtype", type=dtype_arg, default=torch.bfloat16)


def _torch_rope(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, freq: torch.Tensor):  # noqa: ANN202
    angles = pos.float()[:, None] * freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :].to(q.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :].to(q.dtype)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    d = args.hidden_size
    q = torch.randn(args.batch_size, args.num_qo_heads, d, dtype=args.dtype, device=device)
    k = torch.randn(args.batch_size, args.num_kv_heads, d, dtype=args.dtype, device=device)
    pos = torch.randint(0, 8192, (args.batch_size,), device=device, dtype=torch.int32)
    freq = reference.rope_frequencies(d).to(device)
    result: dict[str, torch.Tensor] = {}

    def run() -> None:
        result["q"], result["k"] = flashinfer.apply_rope_pos_ids(q, k, pos)

    def expected() -> torch.Tensor:
        angles = pos.float().cpu()[:, None] * reference.rope_frequencies(d)[None, :]
        return reference.rope(q.cpu(), angles, interleave=False).to(device)

    return Case(
        label=f"{args.batch_size}x({args.num_qo_heads}+{args.num_kv_heads})x{d} "
              f"{str(args.dtype).removeprefix('torch.')}",
        run=run,
        torch_run=lambda: _torch_rope(q, k, pos, freq),
        reference=expected,
        output=lambda: result["q"],
        bytes=2 * (q.numel() + k.numel()) * q.element_size() + pos.numel() * 4,
        atol=3e-2,
        rtol=3e-2,
    )


register(Routine("rope", "flashinfer.apply_rope_pos_ids vs torch eager NeoX RoPE",
                 _add_arguments, _case))
