"""Bit packing of boolean masks (``numpy.packbits`` semantics), e.g. for custom attention
masks, which the prefill kernels read as little-order bits.

Plain vectorized torch, no kernel: the work is memory-bound element shuffling that torch
does at bandwidth, so a JIT module would only add a compile. Runs on CPU and CUDA tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from . import checks, ragged
from .api_logging import flashinfer_api
from .trace.templates import quantization as _trace

_INDEX = (torch.int32, torch.int64)
_INTEGER = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


def _check_bitorder(bitorder: Any) -> bool:
    """True for "big" (the first element lands in the most significant bit)."""
    if not isinstance(bitorder, str):
        raise TypeError(f"bitorder must be a str, got {type(bitorder).__name__}")
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder must be 'big' or 'little', got {bitorder!r}")
    return bitorder == "big"


def _flat_bits(x: Any) -> torch.Tensor:
    """``x`` flattened to bool (nonzero is set), as the reference converts it."""
    checks.check_tensor("x", x)
    if x.dtype != torch.bool and x.dtype not in _INTEGER and not x.dtype.is_floating_point:
        raise TypeError(f"x has dtype {x.dtype}; supported: bool, integer or floating point")
    return x.reshape(-1).to(torch.bool)


def _bit_weight(position: int, big: bool) -> int:
    return 1 << (7 - position if big else position)


@flashinfer_api(trace=_trace.packbits_trace)
def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """Pack ``x``'s elements into the bits of a uint8 tensor, like ``numpy.packbits``.

    Args:
        x: bool, integer or floating-point tensor of any shape, read flattened (row-major);
            nonzero elements are 1 bits. The reference documents a 1-D ``x``.
        bitorder: ``"big"`` (element 0 is the most significant bit of byte 0, numpy's
            default) or ``"little"`` (element 0 is bit 0, the order attention masks use).

    Returns:
        uint8 ``[(x.numel() + 7) // 8]`` on ``x``'s device; the last byte's unused bits are 0.
    """
    big = _check_bitorder(bitorder)
    bits = _flat_bits(x)
    padding = -bits.numel() % 8
    if padding:
        bits = torch.cat([bits, bits.new_zeros(padding)])
    weights = torch.tensor(
        [_bit_weight(j, big) for j in range(8)], dtype=torch.uint8, device=bits.device
    )
    return (bits.view(-1, 8).to(torch.uint8) * weights).sum(dim=1, dtype=torch.uint8)


def _check_segments(indptr: Any, total: int) -> torch.Tensor:
    """A host int64 copy of a valid ``indptr`` over ``total`` elements. The caller syncs
    anyway (the output size depends on it), so device tensors are checked too."""
    checks.check_tensor("indptr", indptr)
    checks.check_ndim("indptr", indptr, 1, "[batch_size + 1]")
    checks.check_dtype("indptr", indptr, _INDEX)
    if indptr.shape[0] < 1:
        raise ValueError("indptr needs batch_size + 1 elements, got 0")
    host = indptr.to("cpu", torch.int64)
    ragged.check_indptr("indptr", host)
    if int(host[-1]) != total:
        raise ValueError(
            f"indptr[-1] must equal the number of elements of x ({total}), got {int(host[-1])}"
        )
    return host


@flashinfer_api(trace=_trace.segment_packbits_trace)
def segment_packbits(
    x: torch.Tensor, indptr: torch.Tensor, bitorder: str = "big"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack each segment ``x[indptr[i]:indptr[i + 1]]`` on its own, like ``numpy.packbits``
    per segment, so every segment starts on a byte boundary (one mask per request).

    Args:
        x: bool, integer or floating-point tensor, read flattened (nonzero is a 1 bit).
        indptr: int32 or int64 ``[batch_size + 1]`` segment offsets into ``x``: starts at 0,
            non-decreasing, ends at ``x.numel()``; empty segments allowed. Any device (it is
            read on the host to size the output, as the reference does).
        bitorder: ``"big"`` or ``"little"``, as for :func:`packbits`.

    Returns:
        ``(y, new_indptr)``: uint8 ``y`` on ``x``'s device, where ``y[new_indptr[i]:
        new_indptr[i + 1]]`` holds segment ``i``'s ``(len_i + 7) // 8`` packed bytes, and
        int32 ``new_indptr`` ``[batch_size + 1]`` on ``indptr``'s device.
    """
    big = _check_bitorder(bitorder)
    bits = _flat_bits(x)
    host = _check_segments(indptr, bits.numel())
    new_host = torch.zeros_like(host)
    new_host[1:] = torch.cumsum((host[1:] - host[:-1] + 7) // 8, 0)
    num_bytes = int(new_host[-1])
    if num_bytes > ragged.INT32_MAX:
        raise ValueError(
            f"the packed output has {num_bytes} bytes, more than new_indptr's int32 can index"
        )
    new_indptr = new_host.to(device=indptr.device, dtype=torch.int32)
    device = bits.device
    bounds, new_bounds = host.to(device), new_host.to(device)
    # One index per output byte (not per bit): the byte's segment and its first bit.
    segment = torch.repeat_interleave(
        torch.arange(host.shape[0] - 1, device=device),
        new_bounds[1:] - new_bounds[:-1],
        output_size=num_bytes,
    )
    first = bounds[segment] + 8 * (torch.arange(num_bytes, device=device) - new_bounds[segment])
    end = bounds[segment + 1]
    bits = torch.cat([bits, bits.new_zeros(7)])  # the last byte's bits stay in bounds
    y = torch.zeros(num_bytes, dtype=torch.uint8, device=device)
    for j in range(8):
        position = first + j
        y += (bits[position] & (position < end)).to(torch.uint8) * _bit_weight(j, big)
    return y, new_indptr
