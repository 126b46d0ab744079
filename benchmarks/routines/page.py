"""Paged KV append routine: append_paged_kv_cache against torch eager indexed writes into
the same ``[num_pages, 2, ...]`` cache. Each request appends --seq_len tokens to its own
shuffled pages, from position 0."""

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
    register,
)


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(group, "batch_size", type=int, default=1, help="requests")
    flag(group, "seq_len", type=int, default=8192, help="tokens appended per request")
    flag(group, "num_kv_heads", type=int, default=8)
    flag(group, "head_dim", type=int, default=128)
    flag(group, "page_size", type=int, default=16)
    flag(group, "kv_layout", choices=("NHD", "HND"), default="NHD")
    flag(group, "input_dtype", "--dtype", type=dtype_arg(*HALF_DTYPES), default=torch.bfloat16)


def _validate(args: argparse.Namespace) -> str | None:
    counts = ("batch_size", "seq_len", "num_kv_heads", "head_dim", "page_size")
    if min(getattr(args, name) for name in counts) < 1:
        return f"{', '.join('--' + name for name in counts)} must be >= 1"
    return None


FAMILY = Family(
    "page",
    _add_arguments,
    ("batch_size", "seq_len", "num_kv_heads", "head_dim", "page_size", "kv_layout", "input_dtype"),
    _validate,
)


def _case(args: argparse.Namespace, device: torch.device) -> Case:
    batch, length, page_size = args.batch_size, args.seq_len, args.page_size
    heads, dim, hnd = args.num_kv_heads, args.head_dim, args.kv_layout == "HND"
    pages = -(-length // page_size)
    nnz = batch * length
    int32 = dict(dtype=torch.int32, device=device)
    key = torch.randn(nnz, heads, dim, dtype=args.input_dtype, device=device)
    value = torch.randn_like(key)
    kv_indices = torch.randperm(batch * pages, device=device).to(torch.int32)
    kv_indptr = torch.arange(0, (batch + 1) * pages, pages, **int32)
    last = torch.full((batch,), length - (pages - 1) * page_size, **int32)
    batch_indices = torch.arange(batch, **int32).repeat_interleave(length)
    positions = torch.arange(length, **int32).repeat(batch)
    # where each appended token lands: (page, slot)
    page_of = kv_indices.long().view(batch, pages)[
        batch_indices.long(), positions.long() // page_size
    ]
    slot_of = positions.long() % page_size
    page_shape = (heads, page_size, dim) if hnd else (page_size, heads, dim)

    def written(cache: torch.Tensor) -> torch.Tensor:
        """The appended K then V, read back from the cache."""
        sides = [
            cache[:, side][page_of, :, slot_of] if hnd else cache[:, side][page_of, slot_of]
            for side in (0, 1)
        ]
        return torch.cat([sides[0].reshape(-1), sides[1].reshape(-1)])

    def ours() -> Backend:
        from flashinfer import append_paged_kv_cache

        cache = torch.zeros(batch * pages, 2, *page_shape, dtype=args.input_dtype, device=device)

        def call() -> torch.Tensor:
            append_paged_kv_cache(
                key,
                value,
                batch_indices,
                positions,
                cache,
                kv_indices,
                kv_indptr,
                last,
                kv_layout=args.kv_layout,
            )
            return cache

        return Backend(call, written)

    def torch_backend() -> Backend:
        cache = torch.zeros(batch * pages, 2, *page_shape, dtype=args.input_dtype, device=device)
        k_cache, v_cache = cache[:, 0], cache[:, 1]

        def call() -> torch.Tensor:
            if hnd:
                k_cache[page_of, :, slot_of] = key
                v_cache[page_of, :, slot_of] = value
            else:
                k_cache[page_of, slot_of] = key
                v_cache[page_of, slot_of] = value
            return cache

        return Backend(call, written)

    return Case(
        label=f"{nnz}x{heads}x{dim} page {page_size} {dtype_name(args.input_dtype)}",
        backends=build(args.backends, {OURS: ours, "torch": torch_backend}),
        bytes=4 * key.numel() * key.element_size(),  # k and v: read + written
        reference=lambda: torch.cat([key.double().reshape(-1), value.double().reshape(-1)]),
        atol=0.0,
        rtol=0.0,
    )


register(
    Routine(
        "append_paged_kv_cache",
        FAMILY,
        "append_paged_kv_cache vs torch indexing",
        (OURS, "torch"),
        _case,
    )
)
