"""The split-KV scheduler of batch prefill (pure host code): coverage, tmp rows, merge lists
and work order against brute-force models on random batches, and the packed device layout."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
import torch

from flashinfer import decode_schedule, prefill_schedule
from flashinfer.prefill_schedule import (
    PrefillSchedule,
    pack_schedule,
    plan_length,
    plan_prefill_schedule,
)


def model_chunk(
    qo_lens: list[int],
    kv_lens: list[int],
    group: int,
    heads: int,
    max_ctas: int,
    tile_rows: int,
    min_chunk: int,
) -> int | None:
    """The expected chunking, by linear search: no split when the unsplit tiles fill the GPU
    or no request with queries has more than min_chunk keys; else the smallest chunk >=
    min_chunk whose CTA count fits in max_ctas (None when that is one chunk per request)."""
    tiles = [math.ceil(q * group / tile_rows) for q in qo_lens]
    longest = max((kv for kv, t in zip(kv_lens, tiles) if t), default=0)
    if sum(tiles) * heads >= max_ctas or longest <= min_chunk:
        return None
    for chunk in range(min_chunk, longest + 1):
        items = sum(t * max(1, math.ceil(kv / chunk)) for t, kv in zip(tiles, kv_lens))
        if items * heads <= max_ctas:
            return chunk if chunk < longest else None
    raise AssertionError("unreachable: chunk = longest always fits")


def kv_range(schedule: PrefillSchedule, i: int, kv_len: int) -> tuple[int, int]:
    """Item i's KV tokens as the device derives them: the last chunk runs to kv_len."""
    chunk, count = schedule.work_chunk[i], schedule.work_chunks[i]
    start = chunk * (schedule.chunk_size or 1)
    return start, kv_len if chunk == count - 1 else start + schedule.chunk_size


def model_cost(
    schedule: PrefillSchedule,
    i: int,
    qo_len: int,
    kv_len: int,
    group: int,
    tile_rows: int,
    causal: bool,
) -> int:
    """Rows in the tile times the keys of its chunk that its last token may see."""
    first = schedule.work_q_tile[i] * tile_rows
    last = min(first + tile_rows, qo_len * group) - 1
    start, end = kv_range(schedule, i, kv_len)
    keys = sum(1 for j in range(start, end) if not causal or j <= last // group + kv_len - qo_len)
    return (last - first + 1) * keys


def check_schedule(
    schedule: PrefillSchedule,
    qo_indptr: list[int],
    kv_lens: list[int],
    group: int,
    tile_rows: int,
    causal: bool,
) -> None:
    qo_lens = [b - a for a, b in zip(qo_indptr, qo_indptr[1:])]
    chunk = schedule.chunk_size
    counts = [max(1, math.ceil(kv / chunk)) if chunk else 1 for kv in kv_lens]
    if chunk is not None:  # a chunk size is only chosen when some request is split
        assert max(counts) > 1

    # The items are exactly each request's (q tile, chunk) pairs; requests without queries
    # have none.
    expected = sorted(
        (b, tile, c)
        for b in range(len(qo_lens))
        for tile in range(math.ceil(qo_lens[b] * group / tile_rows))
        for c in range(counts[b])
    )
    items = list(zip(schedule.work_request, schedule.work_q_tile, schedule.work_chunk))
    assert sorted(items) == expected
    assert all(n == counts[b] for b, n in zip(schedule.work_request, schedule.work_chunks))

    # Every (packed row, KV token) of every request is covered exactly once.
    grids = [torch.zeros(q * group, kv, dtype=torch.int32) for q, kv in zip(qo_lens, kv_lens)]
    for i, (b, tile, _) in enumerate(items):
        start, end = kv_range(schedule, i, kv_lens[b])
        if chunk is not None and counts[b] > 1:
            assert 0 < end - start <= chunk
        grids[b][tile * tile_rows : (tile + 1) * tile_rows, start:end] += 1
    assert all(bool((grid == 1).all()) for grid in grids)

    # Tmp rows: one per (request, token, chunk) of split requests, none shared, all in range.
    tmp_row: dict[tuple[int, int, int], int] = {}
    bases: dict[int, int] = {}
    for i, (b, tile, c) in enumerate(items):
        base = schedule.work_tmp_base[i]
        if counts[b] == 1:
            assert base == -1 and c == 0
            continue
        assert bases.setdefault(b, base) == base  # one base per request
        first, last = tile * tile_rows, min((tile + 1) * tile_rows, qo_lens[b] * group) - 1
        for t in range(first // group, last // group + 1):  # a token may straddle two tiles
            row = base + t * counts[b] + c
            assert tmp_row.setdefault((b, t, c), row) == row
    assert len(set(tmp_row.values())) == len(tmp_row)
    assert sorted(tmp_row.values()) == list(range(schedule.num_tmp_rows))

    # Merges: every token of every split request in order, over its consecutive tmp rows.
    merges = [
        (b, t)
        for b in range(len(qo_lens))
        if counts[b] > 1 and qo_lens[b]
        for t in range(qo_lens[b])
    ]
    assert schedule.num_merge == len(merges)
    assert len(schedule.merge_indptr) == schedule.num_merge + 1
    assert schedule.merge_indptr[0] == 0
    for p, (b, t) in enumerate(merges):
        assert schedule.merge_row[p] == qo_indptr[b] + t
        assert list(range(schedule.merge_indptr[p], schedule.merge_indptr[p + 1])) == [
            tmp_row[(b, t, c)] for c in range(counts[b])
        ]

    # Longest processing time first; equal costs in (request, q tile, chunk) order.
    keys = [
        (
            -model_cost(schedule, i, qo_lens[item[0]], kv_lens[item[0]], group, tile_rows, causal),
            item,
        )
        for i, item in enumerate(items)
    ]
    assert keys == sorted(keys)


def unpack(words: list[int], work_capacity: int, merge_capacity: int) -> PrefillSchedule:
    """The schedule back from the device words (the inverse of pack_schedule)."""
    w, m = work_capacity, merge_capacity
    num_work, chunk = words[0], words[1]
    columns = [tuple(words[2 + k * w : 2 + k * w + num_work]) for k in range(5)]
    num_merge = words[2 + 5 * w]
    merge_row = tuple(words[3 + 5 * w : 3 + 5 * w + num_merge])
    merge_indptr = tuple(words[3 + 5 * w + m : 3 + 5 * w + m + num_merge + 1])
    has_split = any(n > 1 for n in columns[3])
    return PrefillSchedule(chunk if has_split else None, *columns, merge_row, merge_indptr)


def random_batch(rnd: random.Random) -> tuple[list[int], list[int]]:
    batch = rnd.choice([1, 1, 2, 3, 5, 8])
    qo_lens = [rnd.choice([0, 1, 3, 17, 64, 65, rnd.randint(1, 200)]) for _ in range(batch)]
    kv_lens = [rnd.choice([0, 1, 7, 255, 256, 257, rnd.randint(1, 700)]) for _ in range(batch)]
    return [0, *itertools.accumulate(qo_lens)], kv_lens


@pytest.mark.parametrize("seed", range(40))
def test_scheduler_matches_the_model(seed: int) -> None:
    rnd = random.Random(seed)
    qo_indptr, kv_lens = random_batch(rnd)
    group = rnd.choice([1, 2, 3, 4, 7])
    heads = rnd.choice([1, 2, 8])
    max_ctas = rnd.choice([8, 32, 132, 528])
    tile_rows = rnd.choice([16, 64])
    min_chunk = rnd.choice([16, 64, 256])
    causal = rnd.random() < 0.5
    fixed_chunk = rnd.choice([None, None, rnd.randint(1, 300)])
    args = (qo_indptr, kv_lens, group, heads, max_ctas)
    kwargs = dict(causal=causal, tile_rows=tile_rows, min_chunk=min_chunk, fixed_chunk=fixed_chunk)
    schedule = plan_prefill_schedule(*args, **kwargs)
    qo_lens = [b - a for a, b in zip(qo_indptr, qo_indptr[1:])]
    if fixed_chunk is None:
        assert schedule.chunk_size == model_chunk(
            qo_lens, kv_lens, group, heads, max_ctas, tile_rows, min_chunk
        )
    else:
        longest = max((kv for q, kv in zip(qo_lens, kv_lens) if q), default=0)
        assert schedule.chunk_size == (fixed_chunk if fixed_chunk < longest else None)
    check_schedule(schedule, qo_indptr, kv_lens, group, tile_rows, causal)
    if schedule.chunk_size is not None and fixed_chunk is None:
        assert schedule.num_work * heads <= max_ctas
    assert schedule == plan_prefill_schedule(*args, **kwargs)  # deterministic
    work_capacity, merge_capacity = schedule.num_work + 3, schedule.num_merge + 2
    words = pack_schedule(schedule, work_capacity, merge_capacity)
    assert len(words) == plan_length(work_capacity, merge_capacity)
    assert unpack(words, work_capacity, merge_capacity) == schedule


def _plan64(*args: Any, **kwargs: Any) -> PrefillSchedule:
    """The scheduler with 64-row tiles: the worked examples below count tiles of 64."""
    return plan_prefill_schedule(*args, tile_rows=64, **kwargs)


def test_one_long_request_spreads_over_the_gpu() -> None:
    schedule = _plan64([0, 64], [32768], 1, 8, 924)
    assert 924 // 2 < schedule.num_work * 8 <= 924
    assert schedule.num_merge == 64 and schedule.merge_row == tuple(range(64))
    assert schedule.num_tmp_rows == 64 * schedule.num_work
    check_schedule(schedule, [0, 64], [32768], 1, 64, False)
    full = _plan64([0, *range(4096, 4096 * 65, 4096)], [4096] * 64, 1, 8, 924)
    assert full.chunk_size is None and full.num_work == 64 * 64  # the tiles alone fill it
    assert set(full.work_tmp_base) == {-1} and full.num_merge == 0 and full.merge_indptr == (0,)
    # Room for one more CTA, but splitting either request needs two: no split.
    tight = _plan64([0, 64, 128], [300, 300], 1, 1, 3, min_chunk=16)
    assert tight.chunk_size is None and tight.num_work == 2


def test_causal_order_puts_the_long_tiles_first() -> None:
    plain = _plan64([0, 256], [256], 1, 1, 4)
    assert plain.work_q_tile == (0, 1, 2, 3)  # equal costs: in tile order
    causal = _plan64([0, 256], [256], 1, 1, 4, causal=True)
    assert causal.work_q_tile == (3, 2, 1, 0)  # tile 3 sees all 256 keys, tile 0 only 64
    # Split causally, a tile's chunks past its last token cost nothing and go last.
    split = _plan64([0, 256], [256], 1, 1, 8, causal=True, fixed_chunk=100)
    assert list(zip(split.work_q_tile, split.work_chunk)) == [
        (1, 0),
        (2, 0),
        (3, 0),
        (3, 1),  # 64 rows x 100 keys
        (2, 1),
        (0, 0),
        (3, 2),
        (1, 1),  # 64 x 92, 64 x 64, 64 x 56, 64 x 28
        (0, 1),
        (0, 2),
        (1, 2),
        (2, 2),
    ]  # nothing visible: still scheduled, in key order
    check_schedule(split, [0, 256], [256], 1, 64, True)


def test_fixed_chunk_and_disabled_split() -> None:
    qo_indptr, kv_lens = [0, 5, 105], [1000, 10]
    fixed = _plan64(qo_indptr, kv_lens, 1, 1, 8, fixed_chunk=100)
    assert fixed.chunk_size == 100 and fixed.num_work == 10 + 2
    check_schedule(fixed, qo_indptr, kv_lens, 1, 64, False)
    assert fixed.merge_row == (0, 1, 2, 3, 4) and fixed.num_tmp_rows == 50
    # A fixed chunk applies even when the unsplit tiles already fill the GPU.
    assert _plan64(qo_indptr, kv_lens, 1, 1, 1, fixed_chunk=100).chunk_size == 100
    assert _plan64(qo_indptr, kv_lens, 1, 1, 8, fixed_chunk=1000).chunk_size is None
    never = _plan64([0, 64], [100000], 1, 1, 1000, allow_split=False)
    assert never.chunk_size is None and never.num_work == 1 and never.work_tmp_base == (-1,)
    assert _plan64([0, 64], [100000], 1, 1, 1000).chunk_size is not None


def test_empty_queries_and_empty_kv() -> None:
    # A request without queries gets no items, and its long KV does not cause a split.
    idle = _plan64([0, 0, 4], [100000, 10], 1, 1, 1000)
    assert idle.chunk_size is None and idle.work_request == (1,)
    # A request without keys still gets one unsplit item per q tile (it writes 0 / -inf).
    mixed = _plan64([0, 100, 101], [0, 1000], 2, 1, 64, fixed_chunk=100)
    assert [
        (t, c, n, b)
        for r, t, c, n, b in zip(
            mixed.work_request,
            mixed.work_q_tile,
            mixed.work_chunk,
            mixed.work_chunks,
            mixed.work_tmp_base,
        )
        if r == 0
    ] == [(t, 0, 1, -1) for t in range(4)]
    check_schedule(mixed, [0, 100, 101], [0, 1000], 2, 64, False)
    assert mixed.merge_row == (100,) and mixed.merge_indptr == (0, 10)
    empty = _plan64([0], [], 1, 1, 8)
    assert empty.num_work == 0 and empty.num_tmp_rows == 0
    assert pack_schedule(empty, 0, 0) == [0, 1, 0, 0]


def test_packed_layout_and_capacity() -> None:
    assert prefill_schedule.kv_lengths is decode_schedule.kv_lengths  # reused, not copied
    schedule = _plan64([0, 2, 3], [600, 200], 1, 1, 8, fixed_chunk=256)
    assert schedule.chunk_size == 256
    words = pack_schedule(schedule, 5, 3)
    assert len(words) == plan_length(5, 3) == 4 + 25 + 6
    assert words[:2] == [4, 256]  # num_work, chunk_tokens
    assert words[2:7] == [0, 0, 1, 0, 0]  # request: costs 2 x 256, 2 x 256, 1 x 200, 2 x 88
    assert words[7:12] == [0, 0, 0, 0, 0]  # q tile
    assert words[12:17] == [0, 1, 0, 2, 0]  # chunk index
    assert words[17:22] == [3, 3, 1, 3, 0]  # chunks of the request
    assert words[22:27] == [0, 0, -1, 0, 0]  # tmp base
    assert words[27:31] == [2, 0, 1, 0]  # num_merge, merge_row (padded)
    assert words[31:] == [0, 3, 6, 0]  # merge_indptr (padded)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        pack_schedule(schedule, 3, 3)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        pack_schedule(schedule, 5, 1)
    huge = PrefillSchedule(256, (0,), (0,), (0,), (2,), (0,), (0,), (0, 1 << 31))
    with pytest.raises(ValueError, match="int32"):
        pack_schedule(huge, 1, 1)


@pytest.mark.parametrize(
    "message, overrides",
    [
        ("qo_indptr must start at 0", dict(qo_indptr=[])),
        ("qo_indptr must start at 0", dict(qo_indptr=[1, 4])),
        ("qo_indptr must be non-decreasing", dict(qo_indptr=[0, 4, 2], kv_lens=[1, 1])),
        ("kv_lens has 2 entries", dict(kv_lens=[1, 1])),
        ("kv_lens must be >= 0", dict(kv_lens=[-1])),
        ("group must be >= 1", dict(group=0)),
        ("num_kv_heads must be >= 1", dict(num_kv_heads=0)),
        ("max_ctas must be >= 1", dict(max_ctas=0)),
        ("tile_rows must be >= 1", dict(tile_rows=0)),
        ("min_chunk must be >= 1", dict(min_chunk=0)),
        ("fixed_chunk must be >= 1", dict(fixed_chunk=0)),
    ],
)
def test_bad_arguments(message: str, overrides: dict) -> None:
    args = dict(qo_indptr=[0, 4], kv_lens=[9], group=1, num_kv_heads=1, max_ctas=8) | overrides
    with pytest.raises(ValueError, match=message):
        plan_prefill_schedule(**args)
