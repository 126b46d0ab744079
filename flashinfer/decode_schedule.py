"""The split-KV scheduler of decode attention: a pure host function, and the int32 layout
the decode kernel reads its schedule from.

A CTA of the decode kernel handles one (work item, KV head); a work item is a request's
KV range. Without splitting there are ``batch * num_kv_heads`` CTAs; when that is fewer
than the GPU holds at once (``max_ctas``), long requests are cut into chunks of
``chunk_size`` tokens, the smallest size (at least ``min_chunk``) that keeps the CTA count
within ``max_ctas``, so one long request spreads over the whole GPU. Chunks write partial
states to temporary rows that a merge kernel combines; a request with one chunk writes its
output directly. The schedule is deterministic: the same lengths give the same schedule.

The device reads only each item's (request, chunk index, chunk count, tmp row) and the
chunk size; it takes the request's length from the page table when it runs, so the last
chunk of a request always reaches its end (see include/flashinfer/decode.cuh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

DEFAULT_MIN_CHUNK = 256  # tokens: shorter chunks cost more in merging than they gain


@dataclass(frozen=True)
class DecodeSchedule:
    chunk_size: int | None  # None: no request is split
    work_request: tuple[int, ...]
    work_start: tuple[int, ...]
    work_end: tuple[int, ...]
    work_chunk: tuple[int, ...]  # the item's chunk index within its request
    work_chunks: tuple[int, ...]  # how many chunks its request has
    work_tmp_row: tuple[int, ...]  # -1: the item writes the request's output directly
    merge_request: tuple[int, ...]  # split requests, in order
    merge_indptr: tuple[int, ...]  # their tmp rows: merge_indptr[i] .. merge_indptr[i + 1]

    @property
    def num_work(self) -> int:
        return len(self.work_request)

    @property
    def num_merge(self) -> int:
        return len(self.merge_request)

    @property
    def num_tmp_rows(self) -> int:
        return self.merge_indptr[-1]


def kv_lengths(indptr: Sequence[int], last_page_len: Sequence[int], page_size: int) -> list[int]:
    """Each request's KV length: full pages plus the filled part of its last page."""
    lengths = []
    for b in range(len(indptr) - 1):
        pages = indptr[b + 1] - indptr[b]
        lengths.append((pages - 1) * page_size + last_page_len[b] if pages > 0 else 0)
    return lengths


def plan_decode_schedule(
    kv_lens: Sequence[int],
    num_kv_heads: int,
    max_ctas: int,
    window_left: int = -1,
    min_chunk: int = DEFAULT_MIN_CHUNK,
    fixed_chunk: int | None = None,
    allow_split: bool = True,
) -> DecodeSchedule:
    """Work items over each request's attended range: the last ``window_left + 1`` tokens
    with a sliding window (``window_left >= 0``), else all of them. ``fixed_chunk`` imposes
    the chunk size (in tokens; the reference's ``fixed_split_size`` in pages times the page
    size); ``allow_split=False`` never splits (``disable_split_kv``)."""
    if num_kv_heads < 1 or max_ctas < 1 or min_chunk < 1:
        raise ValueError("num_kv_heads, max_ctas and min_chunk must be >= 1")
    if fixed_chunk is not None and fixed_chunk < 1:
        raise ValueError("fixed_chunk must be >= 1")
    ends = list(kv_lens)
    if any(length < 0 for length in ends):
        raise ValueError("kv lengths must be >= 0")
    begins = [max(0, end - (window_left + 1)) if window_left >= 0 else 0 for end in ends]
    spans = [end - begin for begin, end in zip(begins, ends)]
    longest = max(spans, default=0)

    def chunks_of(span: int, chunk: int) -> int:
        return max(1, math.ceil(span / chunk))

    chunk: int | None = None
    if not allow_split:
        pass
    elif fixed_chunk is not None:
        chunk = fixed_chunk if fixed_chunk < longest else None
    elif len(spans) * num_kv_heads < max_ctas and longest > min_chunk:
        lo, hi = min_chunk, longest  # hi always fits: one chunk per request
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(chunks_of(s, mid) for s in spans) * num_kv_heads <= max_ctas:
                hi = mid
            else:
                lo = mid + 1
        chunk = lo if lo < longest else None

    work: list[tuple[int, int, int, int, int, int]] = []
    merge_request: list[int] = []
    merge_indptr = [0]
    for request, (begin, end, span) in enumerate(zip(begins, ends, spans)):
        count = chunks_of(span, chunk) if chunk else 1
        if count == 1:
            work.append((request, begin, end, 0, 1, -1))
            continue
        for c in range(count):
            start = begin + c * chunk
            work.append((request, start, min(start + chunk, end), c, count, merge_indptr[-1] + c))
        merge_request.append(request)
        merge_indptr.append(merge_indptr[-1] + count)
    columns = tuple(zip(*work)) if work else ((),) * 6
    return DecodeSchedule(chunk, *columns, tuple(merge_request), tuple(merge_indptr))


# -- the device layout -------------------------------------------------------------------------
# int32: [num_work, chunk_tokens, request[W], chunk[W], chunks[W], tmp_row[W], num_merge,
#         merge_request[M], merge_indptr[M + 1]]   (W, M: the capacities)
# All of it lives on the device, so a CUDA graph captured under one plan runs a later one.


def plan_length(work_capacity: int, merge_capacity: int) -> int:
    return 4 + 4 * work_capacity + 2 * merge_capacity


def pack_words(
    num_work: int,
    chunk_size: int,
    work_columns: Sequence[Sequence[int]],
    num_merge: int,
    merge_rows: Sequence[int],
    merge_indptr: Sequence[int],
    work_capacity: int,
    merge_capacity: int,
    merges: str = "merges",
) -> list[int]:
    """The int32 words of a split-KV schedule as decode and prefill kernels read them:
    ``[num_work, chunk_size, *work_columns (each padded to work_capacity), num_merge,
    merge_rows, merge_indptr (padded to merge_capacity)]``; unused capacity is zero.
    ``merges`` names the merge entries in the capacity error."""
    if num_work > work_capacity or num_merge > merge_capacity:
        raise ValueError(
            f"the schedule ({num_work} work items, {num_merge} "
            f"{merges}) exceeds the capacity ({work_capacity}, {merge_capacity})"
        )
    pad_w = [0] * (work_capacity - num_work)
    pad_m = [0] * (merge_capacity - num_merge)
    words = [num_work, chunk_size or 1]
    for column in work_columns:
        words += list(column) + pad_w
    words += [num_merge, *merge_rows, *pad_m]
    words += [*merge_indptr, *pad_m]
    if any(not -(1 << 31) <= w < 1 << 31 for w in words):
        raise ValueError("the schedule does not fit in int32")
    return words


def pack_schedule(schedule: DecodeSchedule, work_capacity: int, merge_capacity: int) -> list[int]:
    """The int32 words the kernel reads (unused capacity is zero)."""
    columns = (
        schedule.work_request,
        schedule.work_chunk,
        schedule.work_chunks,
        schedule.work_tmp_row,
    )
    return pack_words(
        schedule.num_work,
        schedule.chunk_size,
        columns,
        schedule.num_merge,
        schedule.merge_request,
        schedule.merge_indptr,
        work_capacity,
        merge_capacity,
    )
