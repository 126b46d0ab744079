"""Random RoPE cases on the emulator (tests/emu), the kernel's own source behind the real APIs:
each case draws from its seed the API (positions, a ragged batch, Llama 3.1's frequencies on
either, the cos/sin cache), in place or not, dtype, head_dim (any even size up to 256) and a
partial rotary_dim, NeoX or interleaved pairs, query and key heads, tokens (0 included),
position dtype, RoPE's scale and theta, and the tensors' memory: contiguous, or q and k as
views into one fused qkv buffer whose rows hold the values and padding too, as serving engines
pass them.

Rotated dims must match the complex-rotation reference; dims past rotary_dim must be exact
copies; every element outside the outputs (the fused buffer's values and padding, an input an
out-of-place call must leave alone) must keep its bits. ``--fuzz-seeds START:COUNT`` picks
the seeds (default 0:6)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

import flashinfer
from flashinfer.testing import reference
from tests.ops.test_rope import TOLERANCE
from tests.ops.test_rope_emulated import device  # noqa: F401

APIS = ("pos_ids", "ragged", "llama31_pos_ids", "llama31_ragged", "cos_sin")


@dataclasses.dataclass(frozen=True)
class RopeCase:
    seed: int
    api: str  # one of APIS
    inplace: bool
    dtype: torch.dtype
    head_dim: int
    rotary_dim: int
    interleave: bool
    heads: tuple[int, int]  # query heads, key heads
    lens: tuple[int, ...]  # tokens per request (one request unless ragged)
    offsets: tuple[int, ...]  # ragged: each request's first position
    pos_dtype: torch.dtype
    rope: tuple[float, float]  # (rope_scale, rope_theta)
    llama31: tuple[float, float, int]  # (low_freq_factor, high_freq_factor, old_context_len)
    fused: bool  # q and k views into one qkv buffer
    flat: bool  # cos_sin: query and key passed as [nnz, heads * head_size]


def draw_case(seed: int) -> RopeCase:
    rng = random.Random(seed)
    api = rng.choice(APIS)
    head_dim = rng.choice((64, 128, 256, 2 * rng.randint(1, 128)))
    rotary_dim = head_dim if rng.random() < 0.6 else 2 * rng.randint(1, head_dim // 2)
    ragged = api.endswith("ragged")
    lens = tuple(
        rng.choice((0, 1, rng.randint(1, 12), rng.randint(1, 70)))
        for _ in range(rng.randint(1, 4) if ragged else 1)
    )
    llama = api.startswith("llama31")
    return RopeCase(
        seed=seed,
        api=api,
        inplace=rng.random() < 0.5,
        dtype=rng.choice((torch.float16, torch.bfloat16, torch.float32)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        interleave=rng.random() < 0.5,
        heads=(rng.randint(1, 9), rng.randint(1, 4)),
        lens=lens,
        offsets=tuple(rng.randint(0, 9000) for _ in lens),
        pos_dtype=rng.choice((torch.int32, torch.int64)),
        rope=(
            rng.choice((2.0, 8.0, 32.0) if llama else (1.0, 1.0, 0.5, 4.0)),
            rng.choice((1e4, 5e5, 1e6)),
        ),
        llama31=(rng.choice((1.0, 2.0)), rng.choice((4.0, 8.0)), rng.choice((4096, 8192))),
        fused=rng.random() < 0.5,
        flat=rng.random() < 0.5,
    )


def _tensors(case: RopeCase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(buffer, q, k): q ``[nnz, Hq, D]`` and k ``[nnz, Hk, D]`` views of random values; in a
    fused buffer each token's row also holds as many value heads as key heads and padding."""
    gen = torch.Generator().manual_seed(case.seed)
    nnz, (hq, hk), d = sum(case.lens), case.heads, case.head_dim
    if case.fused:
        width = (hq + 2 * hk) * d + 8 * (case.seed % 3)
        buffer = torch.randn(nnz, width, generator=gen).to(case.dtype)
        q = buffer[:, : hq * d].view(nnz, hq, d)
        k = buffer[:, hq * d : (hq + hk) * d].view(nnz, hk, d)
        return buffer, q, k
    q = torch.randn(nnz, hq, d, generator=gen).to(case.dtype)
    k = torch.randn(nnz, hk, d, generator=gen).to(case.dtype)
    return torch.empty(0, dtype=case.dtype), q, k


def _positions(case: RopeCase) -> torch.Tensor:
    gen = torch.Generator().manual_seed(case.seed + 1)
    if case.api.endswith("ragged"):
        return torch.cat([torch.arange(n) + o for n, o in zip(case.lens, case.offsets)])
    return torch.randint(0, 16384, (sum(case.lens),), generator=gen)


def _frequencies(case: RopeCase) -> torch.Tensor:
    llama31 = case.llama31 if case.api.startswith("llama31") else None
    return reference.rope_frequencies(case.rotary_dim, *case.rope, llama31)


def _call(case: RopeCase, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Any:
    """The case's API on q and k: (q, k) out, or None in place."""
    suffix = "_inplace" if case.inplace else ""
    if case.api == "cos_sin":
        table = torch.arange(16384, dtype=torch.float32)[:, None] * _frequencies(case)[None, :]
        cache = torch.cat([table.cos(), table.sin()], dim=1)
        query, key = (t.flatten(1) if case.flat else t for t in (q, k))
        api = getattr(flashinfer, f"apply_rope_with_cos_sin_cache{suffix}")
        result = api(
            positions.to(case.pos_dtype), query, key, case.head_dim, cache, not case.interleave
        )
        return (
            None if result is None else tuple(t.view(like.shape) for t, like in zip(result, (q, k)))
        )
    scale, theta = case.rope
    options: dict[str, Any] = dict(
        rotary_dim=case.rotary_dim, interleave=case.interleave, rope_scale=scale, rope_theta=theta
    )
    if case.api.startswith("llama31"):
        low, high, old = case.llama31
        options.update(low_freq_factor=low, high_freq_factor=high, old_context_len=old)
    name = "apply_llama31_rope" if case.api.startswith("llama31") else "apply_rope"
    if case.api.endswith("ragged"):
        indptr = torch.tensor([0, *torch.tensor(case.lens).cumsum(0).tolist()])
        where = (indptr.to(case.pos_dtype), torch.tensor(case.offsets, dtype=case.pos_dtype))
    else:
        name += "_pos_ids"
        where = (positions.to(case.pos_dtype),)
    return getattr(flashinfer, name + suffix)(q, k, *where, **options)


def test_random_rope_case(device: str, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    buffer, q, k = _tensors(case)
    before = (buffer.clone(), q.clone(), k.clone())
    positions = _positions(case)
    angles = positions.float()[:, None] * _frequencies(case)[None, :]
    result = _call(case, q, k, positions)
    try:
        if case.inplace:
            assert result is None
            q_out, k_out = q, k
        else:
            q_out, k_out = result
            assert torch.equal(q, before[1]) and torch.equal(k, before[2]), "an input changed"
        for name, got, was in (("q", q_out, before[1]), ("k", k_out, before[2])):
            want = reference.rope(was, angles, case.interleave)
            assert got.shape == was.shape and got.dtype == was.dtype, name
            torch.testing.assert_close(got.double(), want, **TOLERANCE[case.dtype], msg=name)
            rest = slice(case.rotary_dim, None)
            assert torch.equal(got[..., rest], was[..., rest]), f"{name}'s unrotated dims"
        if case.fused:  # the value heads and the padding keep their bits
            edge = (case.heads[0] + case.heads[1]) * case.head_dim
            assert torch.equal(buffer[:, edge:], before[0][:, edge:]), "v or padding changed"
    except AssertionError as err:
        raise AssertionError(f"{case!r}\n{err}") from None


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs."""
    cases = [draw_case(seed) for seed in range(300)]
    assert {c.api for c in cases} == set(APIS)
    for knob in ("inplace", "interleave", "fused", "flat", "pos_dtype"):
        assert len({getattr(c, knob) for c in cases}) == 2, knob
    assert len({c.dtype for c in cases}) == 3
    assert any(c.rotary_dim < c.head_dim for c in cases)
    assert any(c.head_dim not in (64, 128, 256) for c in cases)
    assert any(sum(c.lens) == 0 for c in cases)
    assert any(len(c.lens) > 1 and 0 in c.lens for c in cases)
    assert any(c.fused and c.inplace and c.api == "cos_sin" and c.flat for c in cases)
