"""Prefill attention routines: single_prefill_with_kv_cache and the batch wrappers over
ragged and paged KV, each against torch's flash SDPA on the same data (dense, GQA).

Every request of a batch has the same --qo-len and --kv-len; causal masks are bottom-right
aligned (as the library's) and count half the FLOPs of a full one.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from . import Case, Routine, dtype_arg, register

_WORKSPACE_BYTES = 256 << 20


def _add_arguments(parser: argparse.ArgumentParser, batch: bool, paged: bool) -> None:
    if batch:
        parser.add_argument("--batch-size", type=int, default=16, help="requests")
    parser.add_argument("--qo-len", type=int, default=2048 if batch else 8192,
                        help="query tokens (per request)")
    parser.add_argument("--kv-len", type=int, help="KV tokens (per request); default --qo-len")
    parser.add_argument("--num-qo-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    if paged:
        parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--kv-layout", choices=("NHD", "HND"), default="NHD")
    parser.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    parser.add_argument("--dtype", type=dtype_arg, default=torch.bfloat16)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """float64 attention of q [B, Hq, qo, D] over k, v [B, Hk, kv, D] with torch's math
    kernel, in chunks of query rows (the scores stay near 2 GB); returns [B * qo, Hq, D]."""
    batch, heads, qo, dim = q.shape
    kv = k.shape[2]
    kd, vd = k.double(), v.double()
    step = max(1, (1 << 28) // (batch * heads * max(kv, 1)))
    cols = torch.arange(kv, device=q.device)
    parts = []
    for start in range(0, qo, step):
        rows = torch.arange(start, min(start + step, qo), device=q.device)
        mask = cols[None, :] <= rows[:, None] + (kv - qo) if causal else None
        parts.append(F.scaled_dot_product_attention(q[:, :, start:start + step].double(), kd, vd,
                                                    attn_mask=mask, enable_gqa=True))
    return torch.cat(parts, dim=2).transpose(1, 2).reshape(batch * qo, heads, dim)


def _torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool) -> Callable[[], torch.Tensor]:
    """torch's flash SDPA over [B, H, L, D] views of the data. ``is_causal`` is top-left
    aligned, so a causal mask with qo != kv goes as causal_lower_right (flash runs it)."""
    qo, kv = q.shape[2], k.shape[2]
    mask = causal_lower_right(qo, kv) if causal and qo != kv else None

    def run() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                  is_causal=causal and mask is None,
                                                  enable_gqa=True)

    return run


def _shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """(batch, qo_len, kv_len) from the flags."""
    batch = getattr(args, "batch_size", 1)
    kv_len = args.qo_len if args.kv_len is None else args.kv_len
    return batch, args.qo_len, kv_len


def _case(args: argparse.Namespace, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          run: Callable[[], Any], output: Callable[[], torch.Tensor], label: str) -> Case:
    """The Case of q [B * qo, Hq, D] over k, v [B, kv, Hk, D] (dense; what torch and the
    reference see, whatever form the flashinfer call reads)."""
    batch, qo, kv = _shape(args)
    q_t = q.view(batch, qo, *q.shape[1:]).transpose(1, 2)
    k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)
    flops = 4 * batch * qo * kv * args.num_qo_heads * args.head_dim // (2 if args.causal else 1)
    tolerance = 2e-2 if args.dtype == torch.bfloat16 else 1e-2
    dtype = str(args.dtype).removeprefix("torch.")
    return Case(
        label=f"{label} {qo}/{kv} {args.num_qo_heads}/{args.num_kv_heads}h d{args.head_dim} "
              f"{'causal ' if args.causal else ''}{args.kv_layout} {dtype}",
        run=run,
        torch_run=_torch_attention(q_t, k_t, v_t, args.causal),
        reference=lambda: _reference(q_t, k_t, v_t, args.causal),
        output=output,
        bytes=(2 * q.numel() + k.numel() + v.numel()) * q.element_size(),
        flops=flops,
        atol=tolerance,
        rtol=tolerance,
    )


def _layout(t: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """[tokens, Hk, D] as the kernel reads it: HND is [Hk, tokens, D]."""
    return t.transpose(0, 1).contiguous() if kv_layout == "HND" else t


def _data(args: argparse.Namespace, device: torch.device
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B * qo, Hq, D] and k, v [B, kv, Hk, D]."""
    batch, qo, kv = _shape(args)
    q = torch.randn(batch * qo, args.num_qo_heads, args.head_dim, dtype=args.dtype, device=device)
    k = torch.randn(batch, kv, args.num_kv_heads, args.head_dim, dtype=args.dtype, device=device)
    return q, k, torch.randn_like(k)


def _single_case(args: argparse.Namespace, device: torch.device) -> Case:
    from flashinfer.prefill import single_prefill_with_kv_cache

    q, k, v = _data(args, device)
    k_arg, v_arg = _layout(k[0], args.kv_layout), _layout(v[0], args.kv_layout)
    result: dict[str, torch.Tensor] = {}

    def run() -> None:
        result["out"] = single_prefill_with_kv_cache(q, k_arg, v_arg, causal=args.causal,
                                                     kv_layout=args.kv_layout)

    return _case(args, q, k, v, run, lambda: result["out"], "single")


def _indptr(batch: int, step: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, (batch + 1) * step, step, dtype=torch.int32, device=device)


def _ragged_case(args: argparse.Namespace, device: torch.device) -> Case:
    from flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper

    batch, qo, kv = _shape(args)
    q, k, v = _data(args, device)
    k_arg = _layout(k.flatten(0, 1), args.kv_layout)
    v_arg = _layout(v.flatten(0, 1), args.kv_layout)
    wrapper = BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), kv_layout=args.kv_layout)
    wrapper.plan(_indptr(batch, qo, device), _indptr(batch, kv, device), args.num_qo_heads,
                 args.num_kv_heads, args.head_dim, causal=args.causal, q_data_type=args.dtype)
    out = torch.empty_like(q)
    return _case(args, q, k, v, lambda: wrapper.run(q, k_arg, v_arg, out=out), lambda: out,
                 f"{batch}x")


def _paged_case(args: argparse.Namespace, device: torch.device) -> Case:
    from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper

    batch, qo, kv = _shape(args)
    page_size = args.page_size
    pages = -(-kv // page_size)
    q, k, v = _data(args, device)
    # the 5-D cache over shuffled pages; each request's tokens fill its pages in order
    page_ids = torch.randperm(batch * pages, device=device)
    padded = torch.zeros(2, batch, pages * page_size, args.num_kv_heads, args.head_dim,
                         dtype=args.dtype, device=device)
    padded[0, :, :kv], padded[1, :, :kv] = k, v
    tokens = padded.view(2, batch * pages, page_size, args.num_kv_heads, args.head_dim)
    if args.kv_layout == "HND":
        tokens = tokens.transpose(2, 3)
    cache = torch.empty(batch * pages, 2, *tokens.shape[2:], dtype=args.dtype, device=device)
    cache[page_ids] = tokens.transpose(0, 1)
    last = torch.full((batch,), kv - (pages - 1) * page_size, dtype=torch.int32, device=device)
    wrapper = BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), kv_layout=args.kv_layout)
    wrapper.plan(_indptr(batch, qo, device), _indptr(batch, pages, device),
                 page_ids.to(torch.int32), last, args.num_qo_heads, args.num_kv_heads,
                 args.head_dim, page_size, causal=args.causal, q_data_type=args.dtype)
    out = torch.empty_like(q)
    return _case(args, q, k, v, lambda: wrapper.run(q, cache, out=out), lambda: out,
                 f"{batch}x page {page_size}")


register(Routine("single_prefill_with_kv_cache",
                 "flashinfer single_prefill_with_kv_cache vs torch flash SDPA",
                 lambda parser: _add_arguments(parser, batch=False, paged=False), _single_case))
register(Routine("BatchPrefillWithRaggedKVCacheWrapper",
                 "batch prefill over ragged KV (plan once, run timed) vs torch flash SDPA",
                 lambda parser: _add_arguments(parser, batch=True, paged=False), _ragged_case))
register(Routine("BatchPrefillWithPagedKVCacheWrapper",
                 "batch prefill over a paged KV cache (plan once, run timed) vs torch flash SDPA",
                 lambda parser: _add_arguments(parser, batch=True, paged=True), _paged_case))
