"""Operands at drawn places in padded 1-D buffers, for the random-case modules: where a
``[rows, width]`` or ``[tokens, heads, width]`` operand's elements sit (Memory), an attention
operand's dims scattered in a poisoned buffer (scattered), and the check that a call left
every element outside what it writes with the bits it had (Watched)."""

from __future__ import annotations

import dataclasses
import random

import torch

FAULTS = (None, "offset", "stride")


@dataclasses.dataclass(frozen=True)
class Memory:
    """Where an operand's elements sit in a 1-D buffer."""

    offset: int  # elements before row 0
    row_pad: int  # 3-D: elements between a row's end and the next row of its token (or head)
    outer_pad: int  # elements after a row (3-D: after a token's, head-major a head's, last row)
    heads_major: bool  # 3-D: a head's tokens are adjacent rows

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        width = shape[-1]
        if len(shape) == 2:
            return (width + self.outer_pad, 1)
        tokens, heads = shape[0], shape[1]
        inner = width + self.row_pad
        if self.heads_major:
            return (inner, tokens * inner + self.outer_pad, 1)
        return (heads * inner + self.outer_pad, inner, 1)

    def size(self, shape: tuple[int, ...]) -> int:
        """Elements of a buffer holding the view, and 8 past it."""
        if 0 in shape:
            return self.offset + 8
        return self.offset + 1 + sum((n - 1) * s for n, s in zip(shape, self.strides(shape))) + 8

    def view(self, buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return buffer.as_strided(shape, self.strides(shape), self.offset)

    def place(self, values: torch.Tensor, fill: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(buffer, view): ``fill`` (``size(values.shape)`` elements, kept around the view)
        holding ``values`` in the view this memory describes."""
        buffer = fill.clone()
        view = self.view(buffer, tuple(values.shape))
        view.copy_(values)
        return buffer, view

    def outside(self, buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A mask of ``buffer``'s elements outside the view."""
        mask = torch.ones(buffer.numel(), dtype=torch.bool)
        self.view(mask, shape).fill_(False)
        return mask


def draw_memory(
    rng: random.Random, vec: int, three_d: bool = False, fault: str | None = None
) -> Memory:
    """A memory whose rows all start on a multiple of ``vec`` elements (16 bytes), but for
    ``fault``: "offset", the first row starts off it; "stride", a stride is off it."""
    row_fault = fault == "stride" and three_d and rng.random() < 0.5

    def pad(off: bool) -> int:
        return (
            rng.randint(1, vec - 1) + vec * rng.randint(0, 2)
            if off
            else vec * rng.choice((0, 0, 1, 3))
        )

    return Memory(
        offset=rng.randint(1, vec - 1) if fault == "offset" else vec * rng.choice((0, 0, 1)),
        row_pad=pad(row_fault) if three_d else 0,
        outer_pad=pad(fault == "stride" and not row_fault),
        heads_major=three_d and rng.random() < 0.3,
    )


def draw_faults(rng: random.Random, operands: tuple[str, ...]) -> dict[str, str | None]:
    """Each operand's fault for draw_memory (and "width": the row width off the vector size):
    none (a third of the draws), one operand's, or each one's at random."""
    names = (*operands, "width")
    faults: dict[str, str | None] = dict.fromkeys(names)
    kind = rng.randrange(3)
    if kind == 1:
        name = rng.choice(names)
        faults[name] = "width" if name == "width" else rng.choice(FAULTS[1:])
    elif kind == 2:
        for name in operands:
            faults[name] = rng.choice(FAULTS)
        faults["width"] = rng.choice((None, "width"))
    return faults


def scattered(
    values: torch.Tensor, rng: random.Random, vec: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): ``values`` in a view of a poisoned 1-D buffer, as engines hand
    attention its operands (q sliced from a fused qkv, caches of several layers in one
    buffer, heads before tokens): the last dim contiguous, the others in a drawn memory
    order, each stride padded by 0, 1 or 3 vectors of ``vec`` elements (default 16 bytes'
    worth) and the view 0 to 2 vectors in (with a smaller ``vec``, half the time 0 to 2
    times 16 bytes: strides alone off the 16-byte grid), so with whole vectors in a row every
    row still starts on a vector boundary. A kernel that takes a stride for another reads
    poison."""
    full = 16 // values.element_size()
    vec = vec or full
    if values.shape[-1] % vec:
        raise ValueError(f"rows of {values.shape[-1]} elements are not whole vectors of {vec}")
    shape = tuple(values.shape)
    outer = list(range(len(shape) - 1))
    rng.shuffle(outer)  # innermost first
    strides = [1] * len(shape)
    extent = shape[-1]
    for dim in outer:
        extent += vec * rng.choice((0, 0, 1, 3))
        strides[dim] = extent
        extent *= max(shape[dim], 1)
    offset = (vec if vec == full or rng.random() < 0.5 else full) * rng.randint(0, 2)
    buffer = poison(values.dtype, offset + extent + vec, values.device)
    view = buffer.as_strided(shape, strides, offset)
    view.copy_(values)
    return buffer, view


def poison(dtype: torch.dtype, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``n`` NaNs (fp8 e4m3: 0x7f): an element a kernel should write and skips stays NaN."""
    if dtype == torch.float8_e4m3fn:
        return torch.full((n,), 0x7F, dtype=torch.uint8, device=device).view(dtype)
    return torch.full((n,), float("nan"), dtype=dtype, device=device)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs included)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(width), b.view(width))


class Watched:
    """Buffers whose elements outside what a call writes must keep their bits."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, name: str, buffer: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """``keep``: a mask of the elements to check (None: all of them)."""
        if keep is None:
            keep = torch.ones(buffer.numel(), dtype=torch.bool, device=buffer.device)
        self.entries.append((name, buffer, buffer.clone(), keep))

    def scattered(self, name: str, values: torch.Tensor, rng: random.Random) -> torch.Tensor:
        """``values`` in a view from :func:`scattered`, whose whole buffer must keep its bits
        (an operand the call only reads)."""
        buffer, view = scattered(values, rng)
        self.add(name, buffer)
        return view

    def scattered_around(
        self, name: str, values: torch.Tensor, rng: random.Random, vec: int | None = None
    ) -> torch.Tensor:
        """``values`` in a view from :func:`scattered` whose buffer must keep its bits
        outside the view (an operand the call writes: the caller checks the view)."""
        buffer, view = scattered(values, rng, vec)
        outside = torch.ones(buffer.numel(), dtype=torch.bool, device=buffer.device)
        outside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
        self.add(name, buffer, outside)
        return view

    def check(self) -> None:
        for name, buffer, before, keep in self.entries:
            assert same_bits(buffer[keep], before[keep]), f"{name} changed where not written"
