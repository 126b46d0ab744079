"""The prefill kernel's arithmetic that runs the same on the host, checked there against
independent Python models: the masks (include/flashinfer/prefill_mask.h: which keys a query
token sees under the causal and sliding-window masks, bottom-right aligned, and when a warp
may skip a K/V tile because none of its rows sees a key of it, and which keys every token of a
CTA sees, so that their tiles need no masking), the division by the page
size (include/flashinfer/fastdiv.h) and the ldmatrix row addresses in the swizzled shared
memory tiles and the K/V chunks each thread loads into them (include/flashinfer/swizzle.h)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from flashinfer.jit.prefill import HEAD_DIM_PAIRS, accepted_tilings
from tests.conftest import REPO_ROOT, build_host_program, run_built_program

HARNESS = REPO_ROOT / "tests" / "ops" / "prefill_harness.cc"


@dataclass(frozen=True)
class Masks:
    qo_len: int
    kv_len: int
    hi: int  # keys at or past hi belong to another chunk (or lie past a causal tile's end)
    causal: bool
    window_left: int

    @property
    def delta(self) -> int:
        return self.kv_len - self.qo_len

    def sees(self, token: int, key: int) -> bool:
        """The reference's rule, key by key."""
        if not 0 <= key < min(self.hi, self.kv_len):
            return False
        if self.causal and key > token + self.delta:
            return False
        return self.window_left < 0 or key >= token + self.delta - self.window_left

    def head(self) -> str:
        return f"{self.hi} {self.delta} {int(self.causal)} {self.window_left}"


def _random_masks(rng: random.Random) -> Masks:
    qo_len = rng.randint(1, 200)
    kv_len = rng.choice([rng.randint(0, 200), qo_len + rng.randint(0, 300)])
    hi = rng.choice([kv_len, rng.randint(0, kv_len)])
    return Masks(qo_len, kv_len, hi, rng.random() < 0.6, rng.choice([-1, 0, 1, rng.randint(0, 90)]))


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    binary = build_host_program(HARNESS, tmp_path_factory.mktemp("prefill_host") / "harness")

    def run(queries: list[str]) -> list[str]:
        answers = run_built_program(binary, "\n".join(queries) + "\n")
        assert len(answers) == len(queries) + 1 and answers[-1] == "", answers[-3:]
        return answers[:-1]

    return run


def test_each_token_sees_the_keys_the_reference_shows(harness) -> None:  # noqa: ANN001
    rng = random.Random(0)
    cases = [(m, t) for m in (_random_masks(rng) for _ in range(300)) for t in range(m.qo_len)]
    answers = harness([f"span {m.head()} {t}" for m, t in cases])
    for (m, token), answer in zip(cases, answers):
        begin, end = map(int, answer.split())
        want = [j for j in range(m.kv_len) if m.sees(token, j)]
        got = list(range(max(begin, 0), end))
        assert got == want, (m, token, begin, end)


def test_a_tile_row_word_has_a_bit_per_visible_key(harness) -> None:  # noqa: ANN001
    """The word the kernel masks a boundary tile's row with: bit c set exactly when the token
    sees key kv0 + c, for tiles of 16 to 64 keys anywhere around the row's span."""
    rng = random.Random(2)
    cases = []
    for _ in range(400):
        m = _random_masks(rng)
        token = rng.randrange(m.qo_len)
        tile_kv = rng.choice([16, 32, 64])
        for kv0 in range(-tile_kv, m.kv_len + tile_kv, rng.choice([1, 7, 16])):
            cases.append((m, token, kv0, tile_kv))
    answers = harness([f"bits {m.head()} {t} {kv0} {n}" for m, t, kv0, n in cases])
    for (m, token, kv0, tile_kv), answer in zip(cases, answers):
        want = sum(1 << c for c in range(tile_kv) if m.sees(token, kv0 + c))
        assert int(answer) == want, (m, token, kv0, tile_kv)
    assert {len(a) for a in answers} != {1}  # words other than 0 were seen


def test_a_warp_skips_a_tile_only_when_none_of_its_rows_sees_a_key(harness) -> None:  # noqa: ANN001
    rng = random.Random(1)
    queries: list[str] = []
    cases = []
    for _ in range(150):
        m = _random_masks(rng)
        group = rng.choice([1, 2, 3, 4, 7, 8])
        rows = m.qo_len * group
        warp_rows = rng.choice([16, 32])
        tile_kv = rng.choice([16, 32, 64])
        for first_row in range(0, rows + 2 * warp_rows, warp_rows):
            for kv0 in range(0, max(m.hi, 1), tile_kv):
                line = f"tile {m.head()} {first_row} {warp_rows} {rows} {group} {kv0} {tile_kv}"
                cases.append((m, group, rows, warp_rows, tile_kv, first_row, kv0))
                queries.append(line)
    answers = harness(queries)
    skipped = exact = 0
    for (m, group, rows, warp_rows, tile_kv, first_row, kv0), answer in zip(cases, answers):
        visible = any(
            m.sees(row // group, key)
            for row in range(first_row, min(first_row + warp_rows, rows))
            for key in range(kv0, kv0 + tile_kv)
        )
        sees = answer == "1"
        assert sees or not visible, (m, group, first_row, warp_rows, kv0, tile_kv)
        if m.kv_len >= m.qo_len:  # every token's keys form one run: the test is exact
            assert sees == visible, (m, group, first_row, warp_rows, kv0, tile_kv)
            exact += 1
        skipped += not sees
    assert skipped > 1000 and exact > 1000  # the cases reach both answers


def test_a_cta_skips_masking_exactly_on_the_keys_all_its_tokens_see(harness) -> None:  # noqa: ANN001
    """keys_seen_by_all: a key is in the range it gives for tokens t_first..t_last exactly when
    every one of them sees it under the causal and window masks (below hi), so a K/V tile
    inside needs no masking and no tile outside is taken for clear."""
    rng = random.Random(2)
    cases = []
    for _ in range(300):
        m = _random_masks(rng)
        t_first = rng.randrange(m.qo_len)
        cases.append((m, t_first, rng.randint(t_first, min(m.qo_len - 1, t_first + 40))))
    answers = harness([f"clear {m.head()} {first} {last}" for m, first, last in cases])
    seen_some = 0
    for (m, first, last), answer in zip(cases, answers):
        begin, end = map(int, answer.split())
        assert 0 <= begin and end <= m.hi, (m, first, last, answer)
        for key in range(m.hi):
            by_all = all(m.sees(t, key) for t in range(first, last + 1))
            assert (begin <= key < end) == by_all, (m, first, last, key, answer)
            seen_some += by_all
    assert seen_some > 1000  # the cases reach clear keys


def test_rows_near_the_32_bit_limit_do_not_overflow(harness) -> None:  # noqa: ANN001
    rows = 2**31 - 1
    group = 1 << 15
    qo_len = rows // group + 1
    m = Masks(qo_len, qo_len, qo_len, True, -1)
    last_token = (rows - 1) // group
    first_row = rows - 5
    answers = harness(
        [
            f"tile {m.head()} {first_row} 32 {rows} {group} {last_token} 16",
            f"tile {m.head()} {first_row} 32 {rows} {group} {last_token + 1} 16",
        ]
    )
    assert answers == ["1", "0"]


def test_page_size_division_by_multiply_high(harness) -> None:  # noqa: ANN001
    """FastDiv's quotient for every page size a cache may have (1 to 2^31 - 1, dense at the
    small ones) over token positions up to 2^31 - 1, at and around multiples of the divisor."""
    rng = random.Random(3)
    limit = 2**31 - 1
    divisors = [*range(1, 130), 255, 256, 257, 4095, 4096, 65537, 2**30, 2**30 + 1, limit]
    divisors += [rng.randint(1, limit) for _ in range(40)]
    cases = []
    for d in divisors:
        numerators = {0, 1, d - 1, d, d + 1, limit, limit - 1, limit // d * d, limit // d * d - 1}
        numerators |= {rng.randint(0, limit) for _ in range(30)}
        numerators |= {k * d + r for k in (2, 3, 1000) for r in (-1, 0, 1)}
        cases += [(d, n) for n in sorted(numerators) if 0 <= n <= limit]
    answers = harness([f"div {d} {n}" for d, n in cases])
    wrong = [(d, n, a) for (d, n), a in zip(cases, answers) if int(a) != n // d]
    assert not wrong, wrong[:5]


def row_key(row: int) -> int:
    """swizzle.h's key of a row."""
    return row * 5 % 8


# Which row block and chunk half of a 16 x 16 operand tile the four 8 x 8 matrices of an
# ldmatrix x4 hold, in the order the kernel hands its registers to mma.sync m16n8k16 (PTX's
# fragment layouts): Q as A (a0: rows 0-7 dims 0-7, a1: rows 8-15, a2: dims 8-15, a3: both);
# K as B of Q K^T (b0, b1: keys 0-7 dims 0-7 / 8-15, the first n8 tile; b2, b3: keys 8-15);
# V as B of P V, transposed (b0, b1: keys 0-7 / 8-15 of dims 0-7; b2, b3: of dims 8-15).
MATRICES = {
    "q": [(0, 0), (8, 0), (0, 1), (8, 1)],
    "k": [(0, 0), (0, 1), (8, 0), (8, 1)],
    "v": [(0, 0), (8, 0), (0, 1), (8, 1)],
}


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_each_lane_addresses_its_fragment_row_in_the_swizzled_tile(harness, head_dim: int) -> None:  # noqa: ANN001
    """Every lane, operand and (m-tile or key offset, chunk pair) the kernel's loops visit: the
    lane's ldmatrix offset is that of its matrix's row (lane % 8 of the matrix) and chunk,
    which the tile stores at chunk ^ row_key(row) of its row."""
    cases = [
        (operand, lane, warp_row, rows, pair)
        for operand in "qkv"
        for lane in range(32)
        for warp_row in ((0, 16, 32, 64, 96, 112) if operand == "q" else (0,))
        for rows in range(0, 64, 16)  # m-tiles (Q) and 16-key steps of a tile (K, V)
        for pair in range(head_dim // 16)
    ]
    queries = [f"rows {o} {head_dim} {lane} {w} {n} {p}" for o, lane, w, n, p in cases]
    for (operand, lane, warp_row, rows, pair), answer in zip(cases, harness(queries)):
        block, half = MATRICES[operand][lane // 8]
        row, chunk = warp_row + rows + block + lane % 8, 2 * pair + half
        want = 2 * (row * head_dim + 8 * (chunk ^ row_key(row)))
        assert int(answer) == want, (operand, lane, warp_row, rows, pair)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_each_kv_tile_chunk_is_loaded_once_without_store_bank_conflicts(
    harness, head_dim: int
) -> None:  # noqa: ANN001
    """For every accepted tiling: the threads of a K/V tile's token (kThreads / kTileKV of
    them) load each of its head_dim / 8 chunks exactly once, to the chunk's swizzled place
    (chunk c of row r at c ^ row_key(r)); a thread's chunks are its first plus offsets shared
    by every thread (the kernel adds them at compile time); in each load a token's threads
    read consecutive chunks from a multiple of their count (whole 32-byte sectors, two
    chunks, from two threads on); and the eight threads of a quarter warp store to eight
    different 16-byte bank groups."""
    chunks = head_dim // 8
    for tiling in accepted_tilings(head_dim):
        token_threads = tiling.threads // tiling.tile_kv
        per_thread = chunks // token_threads
        cases = [
            (token, part, i)
            for token in range(tiling.tile_kv)
            for part in range(token_threads)
            for i in range(per_thread)
        ]
        answers = harness([f"chunk {head_dim} {token_threads} {t} {p} {i}" for t, p, i in cases])
        chunk, at = {}, {}
        for case, answer in zip(cases, answers):
            chunk[case], at[case] = map(int, answer.split())
        for token in range(tiling.tile_kv):
            loaded = [
                chunk[token, part, i] for part in range(token_threads) for i in range(per_thread)
            ]
            assert sorted(loaded) == list(range(chunks)), (tiling, token)
        for (token, part, i), c in chunk.items():
            assert c - chunk[token, part, 0] == chunk[0, 0, i], (tiling, token, part, i)
            assert at[token, part, i] == token * head_dim + 8 * (c ^ row_key(token)), (
                tiling,
                token,
                part,
                i,
            )
        for token in range(tiling.tile_kv):
            for i in range(per_thread):
                read = [chunk[token, part, i] for part in range(token_threads)]
                assert read == list(range(read[0], read[0] + token_threads)), (tiling, token, i)
                assert read[0] % token_threads == 0, (tiling, token, i)
        for i in range(per_thread):
            for first in range(0, tiling.threads, 8):
                quarter = [
                    (tid // token_threads, tid % token_threads) for tid in range(first, first + 8)
                ]
                groups = {at[token, part, i] // 8 % 8 for token, part in quarter}
                assert len(groups) == 8, (tiling, i, first)


def _bank_groups_distinct(places: list[int]) -> bool:
    """Whether 16-byte accesses at these byte offsets (one quarter warp's) fall in distinct
    bank groups: one shared-memory wavefront."""
    groups = [place // 16 % 8 for place in places]
    return len(set(groups)) == len(groups)


@pytest.mark.parametrize("head_dim,head_dim_vo", HEAD_DIM_PAIRS)
def test_fp8_landing_copies_and_widening_without_bank_conflicts(
    harness, head_dim: int, head_dim_vo: int
) -> None:  # noqa: ANN001
    """For every tiling accepted over an fp8 cache and both of its row lengths (K's head_dim
    codes, V's head_dim_vo): landing_chunk places a row's 16-code chunks at a permutation of
    them, its own inverse (the widening looks chunk j up with it too); each landing copy's
    quarter warp (a token's threads taking chunks part + i * threads, prefill.cuh's
    load_kv) stores to distinct bank groups; and so do the widening's two stores (thread t
    of the CTA reads place t + i * threads of the tile, widens chunk j of its row into 16-bit
    chunks 2j and 2j + 1 of the swizzled row, the odd one first where j % 8 >= 4)."""
    for row_bytes in sorted({head_dim, head_dim_vo}):
        chunks = row_bytes // 16
        rows = 16
        answers = harness([f"land {row_bytes} {r} {c}" for r in range(rows) for c in range(chunks)])
        land = {(r, c): int(answers[r * chunks + c]) for r in range(rows) for c in range(chunks)}
        for r in range(rows):
            assert sorted(land[r, c] for c in range(chunks)) == list(range(chunks)), (row_bytes, r)
            assert all(land[r, land[r, c]] == c for c in range(chunks)), (row_bytes, r)
        for tiling in accepted_tilings(head_dim, True, head_dim_vo):
            token_threads = tiling.threads // tiling.tile_kv
            for i in range(-(-chunks // token_threads)):
                for first in range(0, tiling.threads, 8):
                    places = []
                    for tid in range(first, first + 8):
                        token, part = divmod(tid, token_threads)
                        chunk = part + i * token_threads
                        if chunk < chunks:
                            places.append(token * row_bytes + 16 * land[token % rows, chunk])
                    assert _bank_groups_distinct(places), (row_bytes, tiling, i, first)
            tile_places = tiling.tile_kv * chunks
            for i in range(-(-tile_places // tiling.threads)):
                for first in range(0, tiling.threads, 8):
                    stores: tuple[list[int], list[int]] = ([], [])
                    for place in range(first + i * tiling.threads, first + i * tiling.threads + 8):
                        if place >= tile_places:
                            continue
                        r, c = divmod(place, chunks)
                        j = land[r % rows, c]
                        odd = j >> 2 & 1
                        for n, half in enumerate((2 * j + odd, 2 * j + 1 - odd)):
                            elements = r * row_bytes + 8 * (half ^ row_key(r))
                            stores[n].append(2 * elements)
                    assert all(map(_bank_groups_distinct, stores)), (row_bytes, tiling, i, first)
