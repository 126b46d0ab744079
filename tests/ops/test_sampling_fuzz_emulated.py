"""Random sampling cases on the emulator (tests/emu), the kernels' own source behind the real
APIs: each case draws from its seed the operation (a sampler from probabilities or logits, a
renormalization or the logit mask), the vocabulary (1 to 5000, rows starting off the vector
boundary), the rows' shape (spread, peaked, a few tie levels, mostly zeros, unnormalized at
scales from 1e-7 to 1e8), the filter parameters (scalars or a tensor per row, top_k past the
vocabulary, top_p up to 1), seeds and offsets (64-bit ints, or a tensor per row), output rows
mapped through ``indices`` and the threads' order.

A sampler's every token must lie in its allowed set (top-p's boundary elements, which fixed
point decides either way, allowed too), and where the race is not a near tie its token is the
host model's (tests/ops/test_sampling.py's race on the same Philox words). The renormalized
rows and the mask must be the exact sets. ``--fuzz-seeds START:COUNT`` picks the seeds
(default 0:6)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

import flashinfer
from flashinfer import rng as philox
from flashinfer.testing import reference
from tests.ops.test_sampling import near_boundary, top_p_set
from tests.ops.test_sampling_emulated import emulate  # noqa: F401

SAMPLERS = ("plain", "top_k", "top_p", "min_p", "joint", "top_k_first", "logits", "logits_joint")
RENORMS = ("top_k_renorm", "top_p_renorm", "top_k_mask")
SHAPES = ("spread", "peaked", "ties", "sparse")
DRAW_SKIPS = (0, 1 << 20, 3 << 30)  # a sampler's draws: offsets this many words further on


@dataclasses.dataclass(frozen=True)
class SamplingCase:
    seed: int
    op: str  # one of SAMPLERS or RENORMS (parameters and seeds follow the output rows)
    vocab: int
    shift: int  # rows start this many elements into their storage
    batch: int
    shape: str  # one of SHAPES
    scale: float  # the rows' sum (1.0: probabilities)
    top_k: tuple[int, ...] | None  # one: a scalar; batch: a tensor per row
    top_p: tuple[float, ...] | None
    min_p: tuple[float, ...] | None
    seeds: tuple[int, ...]  # one: an int; batch: a tensor per output row
    offsets: tuple[int, ...]
    indices: tuple[int, ...] | None  # output row -> probs row
    reverse: bool


def _per_row(rng: random.Random, batch: int, draw: Any) -> tuple:
    return tuple(draw() for _ in range(batch if rng.random() < 0.4 else 1))


def draw_case(seed: int) -> SamplingCase:
    rng = random.Random(seed)
    op = rng.choice(SAMPLERS + RENORMS)
    vocab = rng.choice((1, 2, 3, rng.randint(4, 64), rng.randint(65, 700), rng.randint(700, 5000)))
    batch = rng.randint(1, 6)
    uses = {
        "top_k": op
        in ("top_k", "joint", "top_k_first", "logits_joint", "top_k_renorm", "top_k_mask"),
        "top_p": op in ("top_p", "joint", "top_k_first", "logits_joint", "top_p_renorm"),
        "min_p": op == "min_p",
    }
    rows = batch  # output rows, which per-row parameters and seeds follow
    indices = None
    if op in SAMPLERS and rng.random() < 0.3:
        rows = rng.randint(1, 8)
        indices = tuple(rng.randrange(batch) for _ in range(rows))
    top_k = _per_row(rng, rows, lambda: rng.choice((1, 2, rng.randint(1, vocab), vocab, vocab + 5)))
    top_p = _per_row(
        rng, rows, lambda: rng.choice((1e-4, round(rng.uniform(0.05, 0.95), 3), 0.999, 1.0))
    )
    min_p = _per_row(rng, rows, lambda: rng.choice((0.0, round(rng.uniform(0.01, 0.9), 3), 1.0)))
    per_row_seed = rng.random() < 0.3
    seeds = tuple(rng.getrandbits(64) for _ in range(rows if per_row_seed else 1))
    offsets = tuple(rng.choice((0, 4 * rng.randint(0, 50), rng.getrandbits(40))) for _ in seeds)
    return SamplingCase(
        seed=seed,
        op=op,
        vocab=vocab,
        shift=rng.choice((0, 0, 1, 3)),
        batch=batch,
        shape=rng.choice(SHAPES),
        scale=rng.choice((1.0, 1.0, 10.0 ** rng.randint(-7, 8))),
        top_k=top_k if uses["top_k"] else None,
        top_p=top_p if uses["top_p"] else None,
        min_p=min_p if uses["min_p"] else None,
        seeds=seeds,
        offsets=offsets,
        indices=indices,
        reverse=rng.random() < 0.5,
    )


def _rows(case: SamplingCase) -> torch.Tensor:
    """[batch, vocab] float32 rows of the case's shape, each summing to its scale, a view
    ``shift`` elements into its storage; never a row of zeros."""
    gen = torch.Generator().manual_seed(case.seed)
    shape = (case.batch, case.vocab + case.shift)
    if case.shape == "spread":
        raw = torch.softmax(torch.randn(*shape, generator=gen).double() * 3.0, -1)
    elif case.shape == "peaked":
        raw = torch.rand(*shape, generator=gen).double() * 1e-3
        raw[torch.arange(case.batch), torch.randint(0, shape[1], (case.batch,), generator=gen)] = (
            1.0
        )
    elif case.shape == "ties":
        levels = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
        raw = levels[torch.randint(0, 4, shape, generator=gen)]
    else:  # "sparse": mostly zeros
        raw = torch.rand(*shape, generator=gen).double() * (
            torch.rand(*shape, generator=gen) < 0.05
        )
        raw[:, case.shift :][:, 0] += 0.5 * (raw[:, case.shift :].sum(-1) == 0)
    rows = raw[:, case.shift :]
    return (rows / rows.sum(-1, keepdim=True) * case.scale).float()


def _param(values: tuple | None, dtype: torch.dtype) -> Any:
    if values is None or len(values) == 1:
        return None if values is None else values[0]
    return torch.tensor(values, dtype=dtype)


def _allowed(case: SamplingCase, probs: torch.Tensor, wide: bool) -> torch.Tensor:
    """The set each row's token may come from (``probs``: the output rows' distributions;
    ``wide``: top-p's boundary elements added)."""
    top_k, top_p, min_p = (
        None if v is None else torch.tensor(v, dtype=torch.float64)
        for v in (case.top_k, case.top_p, case.min_p)
    )
    keep = probs > 0
    if case.op == "top_k_first":
        in_top_k = reference.top_k_set(probs, top_k)
        return keep & in_top_k & top_p_set(reference.renormalize(probs, in_top_k), top_p, wide)
    if top_k is not None:
        keep &= reference.top_k_set(probs, top_k)
    if top_p is not None:
        keep &= top_p_set(probs, top_p, wide)
    if min_p is not None:
        keep &= reference.min_p_set(probs, min_p)
    return keep


def _sample(case: SamplingCase, probs: torch.Tensor, skip: int) -> torch.Tensor:
    """The case's call, its offsets ``skip`` words further on."""
    offsets = [o + skip for o in case.offsets]
    if len(case.seeds) == 1:
        seed, offset = case.seeds[0], offsets[0]
    else:
        seed = torch.tensor([philox.as_int64(s) for s in case.seeds])
        offset = torch.tensor(offsets)
    common: dict[str, Any] = dict(seed=seed, offset=offset)
    if case.indices is not None:
        common["indices"] = torch.tensor(case.indices, dtype=torch.int32)
    top_k, top_p = _param(case.top_k, torch.int32), _param(case.top_p, torch.float32)
    logits = torch.log(probs)
    calls = {
        "plain": lambda: flashinfer.sampling_from_probs(probs, **common),
        "top_k": lambda: flashinfer.top_k_sampling_from_probs(probs, top_k, **common),
        "top_p": lambda: flashinfer.top_p_sampling_from_probs(probs, top_p, **common),
        "min_p": lambda: flashinfer.min_p_sampling_from_probs(
            probs, _param(case.min_p, torch.float32), **common
        ),
        "joint": lambda: flashinfer.top_k_top_p_sampling_from_probs(
            probs, top_k, top_p, filter_apply_order="joint", **common
        ),
        "top_k_first": lambda: flashinfer.top_k_top_p_sampling_from_probs(
            probs, top_k, top_p, filter_apply_order="top_k_first", **common
        ),
        "logits": lambda: flashinfer.sampling_from_logits(logits, **common),
        "logits_joint": lambda: flashinfer.top_k_top_p_sampling_from_logits(
            logits, top_k, top_p, filter_apply_order="joint", **common
        ),
    }
    return calls[case.op]()


def _race_sets(
    case: SamplingCase, probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the distribution each output row races over, its exact allowed set, the widened
    one), the same for every draw of the case."""
    if case.indices is not None:
        probs = probs[list(case.indices)]  # output row i draws from probs row indices[i]
    if case.op.startswith("logits"):
        probs = torch.softmax(probs.log(), -1)  # what the logits samplers race over
    return probs, _allowed(case, probs, False), _allowed(case, probs, True)


def _check_samples(
    case: SamplingCase,
    sets: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tokens: torch.Tensor,
    skip: int,
) -> None:
    """Every token in its output row's allowed set; the race's winner where the exact and the
    widened set agree on it and it is no near tie."""
    probs, exact, wide = sets
    assert tokens.dtype == torch.int32 and tokens.shape == (probs.shape[0],)
    assert ((tokens >= 0) & (tokens < case.vocab)).all(), tokens
    for row, token in enumerate(tokens.tolist()):
        assert wide[row, token], (row, token)
        seed = case.seeds[row % len(case.seeds)]
        offset = case.offsets[row % len(case.offsets)] + skip
        want, margin = reference.exponential_race(probs[row], seed, offset, row, exact[row])
        widened, _ = reference.exponential_race(probs[row], seed, offset, row, wide[row])
        if margin > 1e-4 and want == widened:
            assert token == want, (row, token, want)


def _check_renorm(case: SamplingCase, probs: torch.Tensor) -> None:
    if case.op == "top_k_mask":
        logits = torch.log(probs)
        got = flashinfer.top_k_mask_logits(logits, _param(case.top_k, torch.int32))
        keep = reference.top_k_set(logits, torch.tensor(case.top_k))
        assert torch.equal(got, torch.where(keep, logits, float("-inf")))
        return
    if case.op == "top_k_renorm":
        got = flashinfer.top_k_renorm_probs(probs, _param(case.top_k, torch.int32))
        keep = reference.top_k_set(probs, torch.tensor(case.top_k)) & (probs > 0)
        assert torch.equal(got > 0, keep)
    else:
        top_p = torch.tensor(case.top_p, dtype=torch.float64)
        got = flashinfer.top_p_renorm_probs(probs, _param(case.top_p, torch.float32))
        free = near_boundary(probs, top_p)
        assert torch.equal(
            (got > 0)[~free], (reference.top_p_set(probs, top_p) & (probs > 0))[~free]
        )
    torch.testing.assert_close(
        got.double(), reference.renormalize(probs, got > 0), atol=1e-6, rtol=1e-5
    )


def test_random_sampling_case(emulate, fuzz_seed: int) -> None:  # noqa: F811
    case = draw_case(fuzz_seed)
    emulate(reverse=case.reverse)
    probs = _rows(case)
    try:
        if case.op in RENORMS:
            _check_renorm(case, probs)
        else:
            sets = _race_sets(case, probs)
            for skip in DRAW_SKIPS:
                _check_samples(case, sets, _sample(case, probs, skip), skip)
    except AssertionError as err:
        raise AssertionError(f"{case!r}\n{err}") from None


def test_draws_cover_every_knob() -> None:
    """Over a few hundred draws every value of every knob occurs."""
    cases = [draw_case(seed) for seed in range(300)]
    assert {c.op for c in cases} == set(SAMPLERS + RENORMS)
    assert {c.shape for c in cases} == set(SHAPES) and {c.shift for c in cases} == {0, 1, 3}
    assert {1, 2, 3}.issubset({c.vocab for c in cases}) and max(c.vocab for c in cases) > 2000
    assert min(c.scale for c in cases) <= 1e-6 and max(c.scale for c in cases) >= 1e7
    assert any(c.top_k and len(c.top_k) > 1 for c in cases)
    assert any(c.top_k and max(c.top_k) > c.vocab for c in cases)
    assert any(c.top_p and 1.0 in c.top_p for c in cases)
    assert any(c.min_p and len(c.min_p) > 1 for c in cases)
    assert any(len(c.seeds) > 1 for c in cases) and any(c.indices for c in cases)
    assert len({c.reverse for c in cases}) == 2
