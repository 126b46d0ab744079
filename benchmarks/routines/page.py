"""Paged KV append routine: append_paged_kv_cache vs torch eager indexed writes."""

from __future__ import annotations

import argparse

import torch

from . import Case, Routine, dtype_arg, register


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=8192, help="appended tokens (nnz)")
    parser.add_argument("--hidden-size", type=int, default=128, help="head_dim")
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--dtype", type=dtype_arg, default=torch.bfloat16)


def _case(args: argparse.Namespace, device: torch.device) -> Case:
    import flashinfer

    nnz, heads, dim, page_size = args.batch_size, args.num_kv_heads, args.hidden_size, args.page_size
    pages = (nnz + page_size - 1) // page_size
    # the reference's single-tensor cache; the torch side writes through its key/value views
    kv_cache = torch.zeros(pages, 2, page_size, heads, dim, dtype=args.dtype, device=device)
    k_cache, v_cache = kv_cache[:, 0], kv_cache[:, 1]
    key = torch.randn(nnz, heads, dim, dtype=args.dtype, device=device)
    value = torch.randn_like(key)
    # one request appending all tokens into a shuffled page table
    kv_indices = torch.randperm(pages, device=device).to(torch.int32)
    kv_indptr = torch.tensor([0, pages], dtype=torch.int32, device=device)
    last = torch.tensor([nnz - (pages - 1) * page_size], dtype=torch.int32, device=device)
    batch = torch.zeros(nnz, dtype=torch.int32, device=device)
    positions = torch.arange(nnz, dtype=torch.int32, device=device)
    page_of = kv_indices.long()[positions.long() // page_size]
    slot_of = positions.long() % page_size

    def torch_run() -> None:
        k_cache[page_of, slot_of] = key
        v_cache[page_of, slot_of] = value

    def expected() -> torch.Tensor:
        return key.double()

    return Case(
        label=f"{nnz}x{heads}x{dim} page {page_size} {str(args.dtype).removeprefix('torch.')}",
        run=lambda: flashinfer.append_paged_kv_cache(key, value, batch, positions, kv_cache,
                                                     kv_indices, kv_indptr, last),
        torch_run=torch_run,
        reference=expected,
        output=lambda: k_cache[page_of, slot_of],
        bytes=4 * key.numel() * key.element_size(),  # k and v: read + written
        atol=0.0,
        rtol=0.0,
    )


register(Routine("append_paged_kv_cache", "flashinfer.append_paged_kv_cache vs torch indexing",
                 _add_arguments, _case))
