"""The emulator's memory profile (tests/emu/profile.py) against access patterns whose cost on
a GPU is known (tests/emu/patterns.cu): one warp-wide access each, counted as the shared-memory
wavefronts or global-memory sectors the hardware takes."""

from __future__ import annotations

import ctypes
import enum
import functools

import pytest
import torch

from .engine import EMU_DIR, EmulatedLaunch, build_library
from .profile import PROFILED, Profile, Site, merge, profiling

pytestmark = PROFILED


class Pattern(enum.IntEnum):
    """patterns.cu's ``Pattern``, in its order."""

    SHARED_WORDS = 0
    SHARED_EVERY_OTHER_WORD = enum.auto()
    SHARED_ONE_WORD = enum.auto()
    SHARED_VECTORS = enum.auto()
    SHARED_SPREAD_VECTORS = enum.auto()
    SHARED_COLUMN = enum.auto()
    SHARED_ATOMIC_ONE_WORD = enum.auto()
    LDMATRIX_COLUMN = enum.auto()
    LDMATRIX_SWIZZLED = enum.auto()
    GLOBAL_WORDS = enum.auto()
    GLOBAL_EVERY_OTHER_WORD = enum.auto()
    COPIES = enum.auto()


class _PatternLaunch(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_int), ("src", ctypes.c_void_p), ("out", ctypes.c_void_p)]


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("patterns", [EMU_DIR / "patterns.cu"], [])


def _profile(pattern: Pattern) -> Profile:
    src = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    out = torch.zeros(4096, dtype=torch.uint8)
    with profiling(_library()) as profile:
        EmulatedLaunch(_library(), land_at_issue=False)(
            "emu_pattern", [src, out], _PatternLaunch(pattern, src.data_ptr(), out.data_ptr())
        )
    return profile


# pattern: (kind, bytes a lane, wavefronts or sectors, the fewest)
EXPECTED = {
    Pattern.SHARED_WORDS: ("shared load", 4, 1, 1),
    Pattern.SHARED_EVERY_OTHER_WORD: ("shared load", 4, 2, 1),
    Pattern.SHARED_ONE_WORD: ("shared load", 4, 1, 1),
    Pattern.SHARED_VECTORS: ("shared load", 16, 4, 4),
    Pattern.SHARED_SPREAD_VECTORS: ("shared load", 16, 8, 4),
    Pattern.SHARED_COLUMN: ("shared store", 4, 32, 1),
    Pattern.SHARED_ATOMIC_ONE_WORD: ("shared atomic", 4, 32, 1),
    Pattern.LDMATRIX_COLUMN: ("ldmatrix", 16, 32, 4),
    Pattern.LDMATRIX_SWIZZLED: ("ldmatrix", 16, 4, 4),
    Pattern.GLOBAL_WORDS: ("global load", 4, 4, 4),
    Pattern.GLOBAL_EVERY_OTHER_WORD: ("global load", 4, 8, 4),
}


@pytest.mark.parametrize("pattern", list(EXPECTED), ids=[p.name.lower() for p in EXPECTED])
def test_each_pattern_costs_what_the_hardware_takes(pattern: Pattern) -> None:
    kind, width, cost, ideal = EXPECTED[pattern]
    profile = _profile(pattern)
    sites = [s for s in profile.in_file("patterns.cu") if s.kind == kind]
    assert len(sites) == 1, sites
    (site,) = sites
    assert site.where.startswith("tests/emu/patterns.cu:")
    assert (site.requests, site.bytes, site.cost, site.ideal) == (1, (width, width), cost, ideal)
    # the warp's results: 32 words in 4 sectors, one request
    (store,) = [s for s in profile.in_file("patterns.cu") if s.kind == "global store"]
    assert (store.requests, store.cost, store.ideal) == (1, 4, 4)


def test_copies_count_their_global_sectors_and_shared_wavefronts() -> None:
    sites = {s.kind: s for s in _profile(Pattern.COPIES).in_file("patterns.cu")}
    assert sites["cp.async from global"].where == sites["cp.async to shared"].where
    assert (sites["cp.async from global"].cost, sites["cp.async from global"].ideal) == (16, 16)
    assert (sites["cp.async to shared"].cost, sites["cp.async to shared"].ideal) == (4, 4)


def test_merge_adds_up_one_line_and_kind() -> None:
    a = Site("x.cuh:3", "shared load", (4, 4), 2, 4, 2)
    b = Site("x.cuh:3", "shared load", (16, 16), 1, 4, 4)
    c = Site("x.cuh:3", "shared store", (4, 4), 1, 1, 1)
    merged = {(s.where, s.kind): s for s in merge([a, b, c])}
    assert merged["x.cuh:3", "shared load"] == Site("x.cuh:3", "shared load", (4, 16), 3, 8, 6)
    assert merged["x.cuh:3", "shared store"] == c
    assert merged["x.cuh:3", "shared load"].excess == pytest.approx(8 / 6)
