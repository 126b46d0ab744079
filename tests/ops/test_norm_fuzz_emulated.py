"""Random norm cases on the emulator (tests/emu), the kernels' own source behind the real APIs:
each case draws from its seed the API (RMSNorm, Gemma's, the fused residual adds, the fp8
quantized forms, LayerNorm), dtype, hidden size (around every row-layout boundary of
include/flashinfer/norm.cuh's PlanRows, for vectors and for scalars), 2-D rows or 3-D
per-head rows (token- or head-major), each operand's memory (padded token and head strides,
rows off the 16-byte boundary, a weight off it), out= (new, a strided view, in place), eps,
the values' magnitude, the fp8 scale and its form, enable_pdl and the emulator's schedule
order.

Outputs must match the float64 reference; residuals must equal the float32 sum rounded to
their dtype; every element of every buffer outside what the API writes (padding, an input a
call must leave alone) must keep its bits. ``--fuzz-seeds START:COUNT`` picks the seeds
(default 0:6)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

import flashinfer
from flashinfer.testing import reference
from tests.ops.strided_memory import Memory, Watched, draw_faults, draw_memory, poison, same_bits
from tests.ops.test_norm import assert_fp8_close
from tests.ops.test_norm_emulated import TOLERANCE, emulate  # noqa: F401

OPS = (
    "rmsnorm",
    "gemma_rmsnorm",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "rmsnorm_quant",
    "fused_add_rmsnorm_quant",
    "layernorm",
)
FP8 = torch.float8_e4m3fn
# Elements each case's rows may hold in all: keeps a case under a second or two on the emulator.
ELEMENTS = 60_000


@dataclasses.dataclass(frozen=True)
class NormCase:
    seed: int
    op: str  # one of OPS
    dtype: torch.dtype
    hidden: int
    tokens: int
    heads: int  # 0: 2-D rows
    input: Memory
    residual: Memory
    out: str  # "new", "view" (a strided view into a poisoned buffer) or "inplace"
    out_memory: Memory
    weight_offset: int  # elements the weight (LayerNorm: gamma and beta) starts in
    eps: float
    magnitude: float
    scale: float
    scale_form: str  # "float", "0-d", "1-elem" or "float64"
    enable_pdl: bool | None
    reverse: bool  # the emulator runs a block's threads last first (tests/emu/engine.py)

    @property
    def shape(self) -> tuple[int, ...]:
        if self.heads:
            return (self.tokens, self.heads, self.hidden)
        return (self.tokens, self.hidden)


def _draw_hidden(rng: random.Random, vec: int, aligned: bool) -> int:
    """Near a PlanRows boundary: for 16-byte vectors (groups of 1-32 lanes of two vectors,
    the cached block of up to 2048 vectors, the looping block past it) or for scalars (four
    a thread: 128 and 4096), or anywhere up to 6000; a multiple of ``vec`` if ``aligned``
    (scalars then come from a misaligned operand), else not."""
    if aligned:
        return vec * rng.choice(
            (1, 2, 3, 8, 16, 33, 63, 64, 65, 500, 2047, 2048, 2049, rng.randint(1, 750))
            + (128 // vec, 128 // vec + 1, 4096 // vec, 4096 // vec + 1)
        )
    hidden = rng.choice((1, 2, 31, 127, 129, 4095, 4097, rng.randint(1, 96), rng.randint(1, 6000)))
    return hidden + 1 if hidden % vec == 0 else hidden


def draw_case(seed: int) -> NormCase:
    rng = random.Random(seed)
    op = rng.choice(OPS)
    dtype = rng.choice((torch.float16, torch.bfloat16, torch.float32))
    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    out = "new"
    if op in ("rmsnorm", "gemma_rmsnorm"):
        out = rng.choice(("new", "view", "inplace"))
    elif op.endswith("_quant"):
        out = "view"
    operands = ("input", "weight")
    operands += ("residual",) if "fused" in op else ()
    operands += ("out",) if out == "view" else ()
    faults = draw_faults(rng, operands)
    hidden = _draw_hidden(rng, vec, aligned=faults["width"] is None)
    heads = rng.choice((0, 0, rng.randint(1, 6)))
    cap = max(1, min(600, ELEMENTS // (hidden * max(heads, 1))))
    tokens = rng.choice((0, 1, rng.randint(1, cap), cap)) if cap > 1 else rng.choice((0, 1))
    three_d = heads > 0
    weight_offset = vec * rng.choice((0, 0, 1))
    if faults["weight"]:
        weight_offset = rng.randint(1, vec - 1)
    return NormCase(
        seed=seed,
        op=op,
        dtype=dtype,
        hidden=hidden,
        tokens=tokens,
        heads=heads,
        input=draw_memory(rng, vec, three_d, faults["input"]),
        residual=draw_memory(rng, vec, three_d, faults.get("residual")),
        out=out,
        # an fp8 out's vectors are `vec` bytes: the same offsets and pads keep or break them
        out_memory=draw_memory(rng, vec, three_d, faults.get("out")),
        weight_offset=weight_offset,
        eps=rng.choice((1e-6, 1e-5, 1e-3)),
        magnitude=rng.choice((1e-3, 1.0, 1.0, 3.0, 60.0)),
        scale=rng.choice((0.02, 1.0, 0.0005, 10 ** rng.uniform(-3.5, 0.5))),
        scale_form=rng.choice(("float", "0-d", "1-elem", "float64")),
        enable_pdl=rng.choice((None, True, False)),
        reverse=rng.random() < 0.5,
    )


def _random(case: NormCase, salt: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Values of the case's magnitude (mean 0.5 of it: a row's mean square is never near 0)."""
    gen = torch.Generator().manual_seed(case.seed * 16 + salt)
    values = torch.randn(shape, generator=gen) * case.magnitude * 3 + 0.5 * case.magnitude
    return values.to(dtype)


def _vector(case: NormCase, salt: int, dtype: torch.dtype, shift: bool) -> torch.Tensor:
    """A contiguous [hidden] vector starting ``weight_offset`` elements into its storage;
    ``shift``: around 0 (a LayerNorm shift), else in [0.5, 1.5)."""
    gen = torch.Generator().manual_seed(case.seed * 16 + salt)
    if shift:
        values = torch.randn(case.hidden, generator=gen)
    else:
        values = torch.rand(case.hidden, generator=gen) + 0.5
    storage = torch.empty(case.weight_offset + case.hidden, dtype=dtype)
    storage[case.weight_offset :] = values.to(dtype)
    return storage[case.weight_offset :]


def _scale(case: NormCase) -> tuple[Any, float]:
    """(the scale argument, the float32 value the kernel reads)."""
    value = float(torch.tensor(case.scale, dtype=torch.float32))
    if case.scale_form == "float":
        return case.scale, value
    if case.scale_form == "float64":
        return torch.tensor([case.scale], dtype=torch.float64), value
    scale = torch.tensor(case.scale, dtype=torch.float32)
    return (scale if case.scale_form == "0-d" else scale.reshape(1)), value


def _out(case: NormCase, dtype: torch.dtype, watched: Watched) -> torch.Tensor:
    """A poisoned ``out=`` view into a buffer of ``dtype``, watched outside the view."""
    buffer = poison(dtype, case.out_memory.size(case.shape))
    watched.add("out's buffer", buffer, case.out_memory.outside(buffer, case.shape))
    return case.out_memory.view(buffer, case.shape)


def _run(case: NormCase) -> None:
    shape, eps, tolerance = case.shape, case.eps, TOLERANCE[case.dtype]
    x = _random(case, 1, shape, case.dtype)
    in_buffer, input = case.input.place(x, _random(case, 2, (case.input.size(shape),), case.dtype))
    watched = Watched()
    writes_input = case.out == "inplace" or case.op.endswith("fused_add_rmsnorm")
    watched.add(
        "input's buffer", in_buffer, case.input.outside(in_buffer, shape) if writes_input else None
    )

    if case.op == "layernorm":
        gamma, beta = _vector(case, 3, torch.float32, False), _vector(case, 4, torch.float32, True)
        got = flashinfer.layernorm(input, gamma, beta, eps)
        assert got.shape == shape and got.dtype == case.dtype and got.is_contiguous()
        torch.testing.assert_close(
            got.double(), reference.layernorm(x, gamma, beta, eps), **tolerance
        )
    elif case.op in ("rmsnorm", "gemma_rmsnorm"):
        weight = _vector(case, 3, case.dtype, False)
        api = getattr(flashinfer, case.op)
        if case.out == "new":
            got = api(input, weight, eps, enable_pdl=case.enable_pdl)
            assert got.shape == shape and got.dtype == case.dtype
        else:
            out = input if case.out == "inplace" else _out(case, case.dtype, watched)
            assert api(input, weight, eps, out, case.enable_pdl) is out
            got = out
        want = getattr(reference, case.op)(x, weight, eps)
        torch.testing.assert_close(got.double(), want, **tolerance)
    elif case.op == "rmsnorm_quant":
        weight = _vector(case, 3, case.dtype, False)
        scale, value = _scale(case)
        out = _out(case, FP8, watched)
        assert flashinfer.rmsnorm_quant(out, input, weight, scale, eps, case.enable_pdl) is None
        want = reference.rmsnorm(x, weight, eps)
        assert_fp8_close(out, reference.fp8_e4m3_quantize(want, value), want / value)
    else:
        weight = _vector(case, 3, case.dtype, False)
        r = _random(case, 5, shape, case.dtype)
        fill = _random(case, 6, (case.residual.size(shape),), case.dtype)
        res_buffer, residual = case.residual.place(r, fill)
        watched.add("residual's buffer", res_buffer, case.residual.outside(res_buffer, shape))
        offset = 1.0 if case.op.startswith("gemma") else 0.0
        want, want_residual = reference.fused_add_rmsnorm(x, r, weight, eps, offset)
        if case.op == "fused_add_rmsnorm_quant":
            scale, value = _scale(case)
            out = _out(case, FP8, watched)
            result = flashinfer.fused_add_rmsnorm_quant(
                out, input, residual, weight, scale, eps, case.enable_pdl
            )
            assert result is None
            assert_fp8_close(out, reference.fp8_e4m3_quantize(want, value), want / value)
        else:
            api = getattr(flashinfer, case.op)
            assert api(input, residual, weight, eps, case.enable_pdl) is None
            torch.testing.assert_close(input.double(), want, **tolerance)
        assert same_bits(residual, want_residual), "residual is not the rounded float32 sum"
    watched.check()


def test_random_norm_case(emulate, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(case.dtype, case.reverse)
    try:
        _run(case)
    except AssertionError as err:
        raise AssertionError(f"{case!r}\n{err}") from None


def _layout(case: NormCase) -> tuple[bool, str]:
    """(16-byte vectors, row layout) as norm.cuh's UseVectors and PlanRows pick them: vectors
    when every operand's rows and the weight start on 16-byte boundaries; lane groups for
    rows of at most 32 * cache units, one cached block up to 1024 * cache, else looping."""
    vec = 16 // torch.empty(0, dtype=case.dtype).element_size()
    memories = [case.input]
    if "fused" in case.op:
        memories.append(case.residual)
    if case.out == "view":
        memories.append(case.out_memory)

    def aligned(m: Memory) -> bool:
        return m.offset % vec == 0 and all(s % vec == 0 for s in m.strides(case.shape)[:-1])

    weight_aligned = case.op == "layernorm" or case.weight_offset % vec == 0
    vectors = case.hidden % vec == 0 and weight_aligned and all(map(aligned, memories))
    units, cache = (case.hidden // vec, 2) if vectors else (case.hidden, 4)
    if units <= 32 * cache:
        return vectors, "groups"
    return vectors, "cached" if units <= 1024 * cache else "looping"


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs, and every row layout with
    vectors and with scalars."""
    cases = [draw_case(seed) for seed in range(300)]
    assert {c.op for c in cases} == set(OPS)
    assert len({c.dtype for c in cases}) == 3
    assert {_layout(c) for c in cases if c.tokens} == {
        (vectors, mode) for vectors in (False, True) for mode in ("groups", "cached", "looping")
    }
    assert {c.out for c in cases if c.op.endswith("rmsnorm")} == {"new", "view", "inplace"}
    assert {c.scale_form for c in cases if c.op.endswith("_quant")} == {
        "float",
        "0-d",
        "1-elem",
        "float64",
    }
    assert {c.enable_pdl for c in cases} == {None, True, False}
    assert any(c.tokens == 0 for c in cases) and any(c.tokens > 256 for c in cases)
    assert any(c.heads and c.input.heads_major for c in cases)
    assert len({c.reverse for c in cases}) == 2
