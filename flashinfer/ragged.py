"""Ragged batches: request ``b`` owns tokens ``indptr[b]:indptr[b+1]`` of a flat token dim."""

from __future__ import annotations

import torch


def token_requests(indptr: torch.Tensor, nnz: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each of the ``nnz`` tokens: its request, its index within the request, and its
    request's token count (all int64, on indptr's device). No device synchronization:
    the caller vouches that ``indptr[-1] == nnz``."""
    counts = (indptr[1:] - indptr[:-1]).long()
    request = torch.repeat_interleave(torch.arange(counts.shape[0], device=indptr.device),
                                      counts, output_size=nnz)
    within = torch.arange(nnz, device=indptr.device) - indptr.long()[request]
    return request, within, counts[request]
