"""The emulator's memory profile (``profile.cc``): what a GPU's memory pipeline would make of
an emulated module's accesses, per source line: the warp-wide requests each line issues, and
the shared-memory wavefronts or global-memory sectors they take against the fewest their bytes
could take. A bank conflict, or an uncoalesced load, shows as more than the fewest.

The accesses are the host compiler's (tests/emu/engine.py's KERNEL_FLAGS keep a lane's
accesses as wide as the source writes them); nvcc may still merge adjacent narrow ones, so
a narrow line the profile calls conflicted is worth its SASS read. docs/testing.md has the
memory model."""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from .engine import EMU_DIR, REPO_ROOT, sanitized

# For tests of a profile: it counts the race check's hooks, which the sanitizers' builds lack
PROFILED = pytest.mark.skipif(
    sanitized(), reason="the memory profile counts the race check's hooks (off under sanitizers)"
)


@dataclass(frozen=True)
class Site:
    """One source line's accesses of one kind (profile.cc's ``kind_name``: "shared load",
    "ldmatrix", "cp.async from global", ...), over the launches profiled: ``requests``
    warp-wide, taking ``cost`` wavefronts (shared memory) or 32-byte sectors (global
    memory), where ``ideal`` would have done, and ``bytes`` the fewest and most a lane
    accessed at once."""

    where: str
    kind: str
    bytes: tuple[int, int]
    requests: int
    cost: int
    ideal: int

    @property
    def excess(self) -> float:
        """The cost over the fewest: 1.0 for conflict-free (shared) or fully used sectors
        (global), 2.0 where it takes twice as many."""
        return self.cost / self.ideal if self.ideal else 1.0


@dataclass
class Profile:
    """Sites profiled (by a ``profiling`` block: filled as it ends)."""

    sites: list[Site] = field(default_factory=list)

    def in_file(self, name: str) -> list[Site]:
        """The sites in source files named ``name`` (``"decode.cuh"``)."""
        return [s for s in self.sites if Path(s.where.split(":")[0]).name == name]

    def excessive(self, files: tuple[str, ...], kinds: tuple[str, ...]) -> list[Site]:
        """The sites of ``kinds`` in source files named ``files`` that take more than the
        fewest wavefronts or sectors."""
        return [s for f in files for s in self.in_file(f) if s.kind in kinds and s.cost > s.ideal]

    def table(self) -> str:
        """The sites as a table, the most excess first."""
        rows = sorted(self.sites, key=lambda s: (-s.excess, s.where, s.kind))
        lines = [f"{'excess':>7} {'requests':>9} {'bytes':>6}  {'kind':<20} where"]
        for s in rows:
            width = f"{s.bytes[0]}" if s.bytes[0] == s.bytes[1] else f"{s.bytes[0]}-{s.bytes[1]}"
            lines.append(f"{s.excess:7.2f} {s.requests:9d} {width:>6}  {s.kind:<20} {s.where}")
        return "\n".join(lines)


def _source_name(path: str) -> str | None:
    """A frame's file as the repository names it (the build's rewritten copies of headers
    and sources map back to their originals); None for the emulator's stand-in headers and
    for files outside the kernels' sources."""
    p = Path(path)
    if p.is_relative_to(EMU_DIR / "include"):
        return None
    for root in ("include", "csrc"):
        if root in p.parts:
            i = len(p.parts) - 1 - p.parts[::-1].index(root)
            return str(Path(*p.parts[i:]))
    if p.is_relative_to(REPO_ROOT):
        return str(p.relative_to(REPO_ROOT))
    return p.name if p.suffix in (".cu", ".cuh", ".h") else None


def _resolve(library: str, offsets: list[str]) -> dict[str, str]:
    """Each code offset of ``library`` (a return address: the call is the byte before) as
    the innermost kernel source line its inlined frames name, ``file:line``."""
    calls = [hex(int(offset, 16) - 1) for offset in offsets]
    out = subprocess.run(
        ["addr2line", "-a", "-i", "-e", library, *calls], capture_output=True, text=True, check=True
    ).stdout
    # -a: each address on a line of its own, then its frames, innermost first
    frames: dict[int, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("0x"):
            current = frames.setdefault(int(line, 16), [])
        else:
            current.append(line)
    resolved = {}
    for offset, call in zip(offsets, calls):
        resolved[offset] = "?"
        for frame in frames.get(int(call, 16), []):
            path, _, line = frame.partition(":")
            name = _source_name(path)
            if name is not None:
                resolved[offset] = f"{name}:{line.split()[0]}"
                break
    return resolved


def merge(sites: list[Site]) -> list[Site]:
    """``sites`` with those of one line and kind (from several builds, launches or
    processes) added up, in order of line and kind."""
    merged: dict[tuple[str, str], Site] = {}
    for s in sites:
        m = merged.get((s.where, s.kind))
        merged[s.where, s.kind] = (
            s
            if m is None
            else Site(
                s.where,
                s.kind,
                (min(m.bytes[0], s.bytes[0]), max(m.bytes[1], s.bytes[1])),
                m.requests + s.requests,
                m.cost + s.cost,
                m.ideal + s.ideal,
            )
        )
    return [merged[k] for k in sorted(merged)]


def save(sites: list[Site], path: Path) -> None:
    path.write_text(json.dumps([asdict(s) for s in sites]))


def load(path: Path) -> list[Site]:
    return [Site(**{**s, "bytes": tuple(s["bytes"])}) for s in json.loads(path.read_text())]


def _read(library: ctypes.CDLL) -> list[Site]:
    """The sites ``library`` profiled since it started."""
    library.simt_profile_report.restype = ctypes.c_char_p
    rows = [line.split("\t") for line in library.simt_profile_report().decode().splitlines()]
    by_library: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        by_library[row[0]].append(row[1])
    where = {
        (path, offset): line
        for path, offsets in by_library.items()
        for offset, line in _resolve(path, offsets).items()
    }
    return merge(
        [
            Site(where[path, offset], kind, (int(low), int(high)), int(n), int(cost), int(ideal))
            for path, offset, kind, low, high, n, cost, ideal in rows
        ]
    )


@contextlib.contextmanager
def profiling(library: ctypes.CDLL) -> Iterator[Profile]:
    """Profiles the launches of ``library`` (an emulated module's) inside the block."""
    profile = Profile()
    library.simt_profile_start()
    try:
        yield profile
        profile.sites = _read(library)
    finally:
        library.simt_profile_stop()


# The libraries profiled for the whole session (pytest --memory-profile), by path: None
# until profile_session() is called.
_session: dict[str, ctypes.CDLL] | None = None


def profile_session() -> None:
    """Every emulated module built from now on profiles all its launches (see attach)."""
    global _session
    _session = {}


def attach(library: ctypes.CDLL) -> None:
    """Starts ``library``'s profile, once, if the session is profiled."""
    if _session is not None and library._name not in _session:
        _session[library._name] = library
        library.simt_profile_start()


def session_sites() -> list[Site]:
    """What every library attached so far has profiled."""
    return merge([site for library in (_session or {}).values() for site in _read(library)])
