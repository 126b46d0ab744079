"""Ragged batches: request ``b`` owns tokens ``indptr[b]:indptr[b+1]`` of a flat token dim.

Indptr-like arguments are validated on the host only when they are CPU (or meta) tensors:
reading a CUDA tensor would synchronize the device on every call, which the reference does
not do either. Everything computed from a CUDA indptr is memory-safe for any values instead:
:func:`token_requests` never reads or writes out of bounds, and the kernels bound every
index they read (see include/flashinfer/page.cuh).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT32_MAX = 2**31 - 1  # the kernels' index type's largest value


def check_indptr(
    name: str, indptr: torch.Tensor, total_name: str = "", total: int | None = None
) -> None:
    """A host-resident ``indptr`` must start at 0, never decrease and end at most at
    ``total`` (tokens or entries past its end belong to no request: padding). The caller
    has checked it is a 1-D integer tensor; device tensors are not read (see above)."""
    if indptr.device.type != "cpu" or indptr.numel() == 0:
        return
    values = indptr.long()
    if int(values[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {int(values[0])}")
    drops = torch.nonzero(values[1:] < values[:-1])
    if drops.numel():
        at = int(drops[0]) + 1
        raise ValueError(
            f"{name} must be non-decreasing, but {name}[{at}] = {int(values[at])} "
            f"< {name}[{at - 1}] = {int(values[at - 1])}"
        )
    if total is not None and int(values[-1]) > total:
        raise ValueError(
            f"{name}[-1] must be at most {total_name} = {total}, got {int(values[-1])}"
        )


@dataclass(frozen=True)
class TokenRequests:
    """Which request owns each token. Unowned tokens (outside every request's range, which
    only an invalid indptr produces) have ``owned`` False and zero ``within``/``count``."""

    request: torch.Tensor  # int64 [nnz]; a valid request index even where not owned
    within: torch.Tensor  # int64 [nnz]: the token's index within its request
    count: torch.Tensor  # int64 [nnz]: its request's token count
    owned: torch.Tensor  # bool [nnz]

    def per_token(self, per_request: torch.Tensor, fill: int) -> torch.Tensor:
        """``per_request[request]`` (int64) for owned tokens, ``fill`` for the others."""
        if per_request.shape[0] == 0:
            return torch.full_like(self.within, fill)
        return torch.where(self.owned, per_request.long().index_select(0, self.request), fill)


def token_requests(indptr: torch.Tensor, nnz: int) -> TokenRequests:
    """Map ``nnz`` tokens to their requests with a binary search of ``indptr``: no device
    synchronization, and memory-safe whatever ``indptr`` holds (every gather index is
    clamped to a valid request), unlike ``repeat_interleave(output_size=...)``, which
    writes past its output when the counts do not add up. Gathers use ``index_select``:
    Python indexing of a fake CUDA tensor needs torch built with CUDA."""
    device = indptr.device
    batch_size = indptr.shape[0] - 1
    zeros = torch.zeros(nnz, dtype=torch.int64, device=device)
    if batch_size < 1:
        return TokenRequests(zeros, zeros, zeros, torch.zeros(nnz, dtype=torch.bool, device=device))
    tokens = torch.arange(nnz, dtype=indptr.dtype, device=device)
    request = (torch.searchsorted(indptr, tokens, right=True) - 1).clamp_(0, batch_size - 1)
    bounds = indptr.long()
    start, end = bounds.index_select(0, request), bounds.index_select(0, request + 1)
    tokens = tokens.long()
    owned = (start <= tokens) & (tokens < end)
    return TokenRequests(
        request,
        torch.where(owned, tokens - start, zeros),
        torch.where(owned, end - start, zeros),
        owned,
    )


def int32_ids(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the int32 a kernel reads. Wider ids are clamped to [-1, INT32_MAX] on their
    device (no synchronization): a value past int32 then names no page, request or slot,
    and the kernels skip it, where a plain cast would wrap it onto another's (2**32 + 1
    onto 1)."""
    if t.dtype == torch.int32:
        return t
    if t.dtype != torch.int64:
        return t.to(torch.int32)
    return t.clamp(-1, INT32_MAX).to(torch.int32)
