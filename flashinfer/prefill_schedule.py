"""The split-KV scheduler of batch prefill attention: a pure host function, and the int32
layout the prefill kernel reads its schedule from.

A CTA of the prefill kernel handles one (work item, KV head). Query rows are packed with
their GQA group (packed row ``t * group + g`` for token ``t`` and group member ``g``), so
one KV tile load serves every query head that shares it; a work item is one tile of
``tile_rows`` packed rows of a request and one chunk of its KV. Without splitting there is
one item per q tile; when those CTAs are fewer than the GPU holds at once (``max_ctas``),
long requests are cut into KV chunks of the smallest size (at least ``min_chunk``) that
keeps the CTA count within ``max_ctas``, as the decode scheduler does, so a few long
requests still fill the GPU. Chunks write partial states to temporary rows that a merge
kernel combines per token; a request with one chunk writes its output directly.

Items are ordered longest first (by estimated cost), so the long tiles start in the first
wave and the short ones fill in behind them. The schedule is deterministic: the same
lengths give the same schedule, which keeps results bit-identical between runs.

The device reads only each item's (request, q tile, chunk index, chunk count, tmp base) and
the chunk size; it takes the query and KV lengths from the indptr arrays when it runs, so
the last chunk of a request always reaches its end (see include/flashinfer/prefill.cuh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from flashinfer.decode_schedule import kv_lengths, pack_words

__all__ = [
    "DEFAULT_MIN_CHUNK",
    "TILE_ROWS",
    "PrefillSchedule",
    "kv_lengths",
    "pack_schedule",
    "plan_length",
    "plan_prefill_schedule",
]

DEFAULT_MIN_CHUNK = 256  # tokens: shorter chunks cost more in merging than they gain
TILE_ROWS = 128  # packed query rows per CTA tile (the kernel's tile_rows())


@dataclass(frozen=True)
class PrefillSchedule:
    chunk_size: int | None  # None: no request is split
    work_request: tuple[int, ...]
    work_q_tile: tuple[int, ...]  # packed rows [q_tile * tile_rows, (q_tile + 1) * tile_rows)
    work_chunk: tuple[int, ...]  # the item's KV chunk index within its request
    work_chunks: tuple[int, ...]  # how many chunks its request has
    work_tmp_base: tuple[int, ...]  # the request's first tmp row; -1: writes the output directly
    merge_row: tuple[int, ...]  # one per token of a split request: its output row
    merge_indptr: tuple[int, ...]  # that token's tmp rows: merge_indptr[p] .. merge_indptr[p + 1]

    @property
    def num_work(self) -> int:
        return len(self.work_request)

    @property
    def num_merge(self) -> int:
        return len(self.merge_row)

    @property
    def num_tmp_rows(self) -> int:
        return self.merge_indptr[-1]


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def plan_prefill_schedule(
    qo_indptr: Sequence[int],
    kv_lens: Sequence[int],
    group: int,
    num_kv_heads: int,
    max_ctas: int,
    *,
    causal: bool = False,
    tile_rows: int = TILE_ROWS,
    min_chunk: int = DEFAULT_MIN_CHUNK,
    fixed_chunk: int | None = None,
    allow_split: bool = True,
) -> PrefillSchedule:
    """Work items covering every (packed query row, KV token) pair of every request once.

    ``group`` is the GQA group size (query heads per KV head). ``causal`` only sharpens the
    cost estimate that orders the items (a causal tile skips keys past its last token); the
    coverage is the same. ``fixed_chunk`` imposes the chunk size in tokens (the reference's
    ``fixed_split_size`` in pages times the page size); ``allow_split=False`` never splits
    (``disable_split_kv``)."""
    if len(qo_indptr) == 0 or qo_indptr[0] != 0:
        raise ValueError("qo_indptr must start at 0")
    qo_lens = [end - begin for begin, end in zip(qo_indptr, qo_indptr[1:])]
    if any(n < 0 for n in qo_lens):
        raise ValueError("qo_indptr must be non-decreasing")
    if len(kv_lens) != len(qo_lens):
        raise ValueError(
            f"kv_lens has {len(kv_lens)} entries, but qo_indptr describes {len(qo_lens)} requests"
        )
    if any(n < 0 for n in kv_lens):
        raise ValueError("kv_lens must be >= 0")
    for name, value in (
        ("group", group),
        ("num_kv_heads", num_kv_heads),
        ("max_ctas", max_ctas),
        ("tile_rows", tile_rows),
        ("min_chunk", min_chunk),
    ):
        _check_positive(name, value)
    if fixed_chunk is not None:
        _check_positive("fixed_chunk", fixed_chunk)

    q_tiles = [math.ceil(n * group / tile_rows) for n in qo_lens]
    # Requests without queries get no items, so their KV length must not force a split.
    longest = max((kv for kv, tiles in zip(kv_lens, q_tiles) if tiles), default=0)

    def chunks_of(kv_len: int, chunk: int) -> int:
        return max(1, math.ceil(kv_len / chunk))

    def ctas(chunk: int) -> int:
        return sum(t * chunks_of(kv, chunk) for t, kv in zip(q_tiles, kv_lens)) * num_kv_heads

    chunk: int | None = None
    if not allow_split:
        pass
    elif fixed_chunk is not None:
        chunk = fixed_chunk if fixed_chunk < longest else None
    elif sum(q_tiles) * num_kv_heads < max_ctas and longest > min_chunk:
        lo, hi = min_chunk, longest  # hi always fits: one chunk per request
        while lo < hi:
            mid = (lo + hi) // 2
            if ctas(mid) <= max_ctas:
                hi = mid
            else:
                lo = mid + 1
        chunk = lo if lo < longest else None

    work: list[tuple[int, int, int, int, int, int]] = []  # (cost, request, tile, c, n, base)
    merge_row: list[int] = []
    merge_indptr = [0]
    for request, (qo_len, kv_len, tiles) in enumerate(zip(qo_lens, kv_lens, q_tiles)):
        count = chunks_of(kv_len, chunk) if chunk else 1
        base = merge_indptr[-1] if count > 1 else -1
        for tile in range(tiles):
            row_begin = tile * tile_rows
            rows = min(row_begin + tile_rows, qo_len * group) - row_begin
            # Keys after this bound are masked for every row of a causal tile.
            visible = (row_begin + rows - 1) // group + kv_len - qo_len + 1 if causal else kv_len
            for c in range(count):
                start = c * chunk if chunk else 0
                end = kv_len if c == count - 1 else start + chunk
                cost = rows * max(0, min(end, visible) - start)
                work.append((cost, request, tile, c, count, base))
        if count > 1:
            for t in range(qo_len):
                merge_row.append(qo_indptr[request] + t)
                merge_indptr.append(base + (t + 1) * count)
    work.sort(key=lambda item: (-item[0], item[1], item[2], item[3]))
    columns = tuple(zip(*work)) if work else ((),) * 6
    return PrefillSchedule(chunk, *columns[1:], tuple(merge_row), tuple(merge_indptr))


# -- the device layout -------------------------------------------------------------------------
# int32: [num_work, chunk_tokens, request[W], q_tile[W], chunk[W], chunks[W], tmp_base[W],
#         num_merge, merge_row[M], merge_indptr[M + 1]]   (W, M: the capacities)
# All of it lives on the device, so a CUDA graph captured under one plan runs a later one.


def plan_length(work_capacity: int, merge_capacity: int) -> int:
    return 4 + 5 * work_capacity + 2 * merge_capacity


def pack_schedule(schedule: PrefillSchedule, work_capacity: int, merge_capacity: int) -> list[int]:
    """The int32 words the kernel reads (unused capacity is zero)."""
    columns = (
        schedule.work_request,
        schedule.work_q_tile,
        schedule.work_chunk,
        schedule.work_chunks,
        schedule.work_tmp_base,
    )
    return pack_words(
        schedule.num_work,
        schedule.chunk_size,
        columns,
        schedule.num_merge,
        schedule.merge_row,
        schedule.merge_indptr,
        work_capacity,
        merge_capacity,
        merges="merge rows",
    )
