"""Random gated-activation cases on the emulator (tests/emu), the kernel's own source behind
the real APIs: each case draws from its seed the activation (SiLU, GELU, GELU-tanh), dtype,
d (16-byte multiples and odd widths, up to several thread blocks a row), the leading dims
(none to three, rows 0 included), the input's and out='s rows (padded strides, off the 16-byte
boundary), out= or not, the values' magnitude (to where the activations saturate) and
enable_pdl.

Outputs must match the float64 reference; the input's buffer must keep every bit, and out's
buffer every bit outside the view. ``--fuzz-seeds START:COUNT`` picks the seeds (default 0:6).
"""

from __future__ import annotations

import dataclasses
import math
import random

import torch

from flashinfer.testing import reference
from tests.ops.strided_memory import Memory, Watched, draw_faults, draw_memory, poison
from tests.ops.test_activation import APIS, TOLERANCE
from tests.ops.test_activation_emulated import emulate  # noqa: F401

# Elements of input a case may hold: keeps a case well under a second on the emulator.
ELEMENTS = 100_000


@dataclasses.dataclass(frozen=True)
class ActivationCase:
    seed: int
    act: str  # a key of APIS
    dtype: torch.dtype
    d: int
    lead: tuple[int, ...]  # input is [*lead, 2 * d]
    input: Memory  # of the [rows, 2 * d] rows
    out: Memory | None  # None: out=None, the API allocates it
    magnitude: float
    enable_pdl: bool | None

    @property
    def rows(self) -> int:
        return math.prod(self.lead)


def draw_case(seed: int) -> ActivationCase:
    rng = random.Random(seed)
    dtype = rng.choice((torch.float16, torch.bfloat16, torch.float32))
    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    faults = draw_faults(rng, ("input", "out"))
    if faults["width"]:
        d = rng.choice((rng.randint(1, 40), 255, 257, 2047, 2049, rng.randint(1, 4000)))
        d += 1 if d % vec == 0 else 0  # off the vector size
    else:  # 256 vectors a thread block
        d = vec * rng.choice((1, 2, 255, 256, 257, 600, rng.randint(1, 500)))
    cap = max(1, ELEMENTS // (2 * d))
    rows = rng.choice((0, 1, rng.randint(1, cap), cap))
    lead: tuple[int, ...] = (rows,)
    shape_kind = rng.randrange(4)
    if shape_kind == 0 and rows == 1:
        lead = ()
    elif shape_kind == 2:
        lead = (rows, rng.randint(0, 3)) if rows * 3 <= cap else (rows, 1)
    elif shape_kind == 3 and rows:
        lead = (1, rows, 1)
    input = draw_memory(rng, vec, fault=faults["input"])
    out = draw_memory(rng, vec, fault=faults["out"])
    return ActivationCase(
        seed=seed,
        act=rng.choice(tuple(APIS)),
        dtype=dtype,
        d=d,
        lead=lead,
        input=input,
        out=out if faults["out"] or rng.random() < 0.5 else None,
        magnitude=rng.choice((0.1, 1.0, 3.0, 3.0, 30.0)),
        enable_pdl=rng.choice((None, True, False)),
    )


def _rows_view(
    memory: Memory, buffer: torch.Tensor, case: ActivationCase, width: int
) -> torch.Tensor:
    """The operand ``[*lead, width]``: ``memory``'s ``[rows, width]`` rows, leading dims split."""
    return memory.view(buffer, (case.rows, width)).view(*case.lead, width)


def test_random_activation_case(emulate, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(case.dtype)
    gen = torch.Generator().manual_seed(case.seed)
    rows_shape = (case.rows, 2 * case.d)
    x = (torch.randn(rows_shape, generator=gen) * case.magnitude).to(case.dtype)
    fill = torch.randn(case.input.size(rows_shape), generator=gen).to(case.dtype)
    in_buffer, _ = case.input.place(x, fill)
    input = _rows_view(case.input, in_buffer, case, 2 * case.d)
    watched = Watched()
    watched.add("input's buffer", in_buffer)
    out = None
    if case.out is not None:
        out_buffer = poison(case.dtype, case.out.size((case.rows, case.d)))
        watched.add("out's buffer", out_buffer, case.out.outside(out_buffer, (case.rows, case.d)))
        out = _rows_view(case.out, out_buffer, case, case.d)
    try:
        got = APIS[case.act](input, out=out, enable_pdl=case.enable_pdl)
        assert got.shape == (*case.lead, case.d) and got.dtype == case.dtype
        assert out is None or got is out
        want = reference.act_and_mul(x, case.act).view(*case.lead, case.d)
        torch.testing.assert_close(got.double(), want, **TOLERANCE[case.dtype])
        watched.check()
    except AssertionError as err:
        raise AssertionError(f"{case!r}\n{err}") from None


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs, the vector and the
    element-wise kernels each with rows of one thread block and of several."""
    cases = [draw_case(seed) for seed in range(300)]
    assert {c.act for c in cases} == set(APIS)
    assert len({c.dtype for c in cases}) == 3
    assert {len(c.lead) for c in cases} == {0, 1, 2, 3}
    assert any(c.rows == 0 for c in cases) and any(c.rows > 1000 for c in cases)
    assert any(c.out is None for c in cases) and any(c.out is not None for c in cases)
    assert {c.enable_pdl for c in cases} == {None, True, False}

    def kernel(c: ActivationCase) -> tuple[bool, bool]:
        """(16-byte vectors, more than one block a row), as activation.cuh's ActAndMul."""
        vec = 16 // torch.empty(0, dtype=c.dtype).element_size()
        memories = [c.input] + ([c.out] if c.out is not None else [])
        vectors = c.d % vec == 0 and all(  # a single row's stride is not read
            m.offset % vec == 0 and (c.rows == 1 or m.outer_pad % vec == 0) for m in memories
        )
        return vectors, (c.d // vec if vectors else c.d) > 256

    assert {kernel(c) for c in cases if c.rows} == {
        (v, m) for v in (False, True) for m in (False, True)
    }
