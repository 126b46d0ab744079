"""NaN inputs for the attention tests: a NaN planted where a random case puts it, and the
check that outputs are NaN exactly where expected (docs/attention.md: a NaN score makes its
row's output and LSE NaN, a NaN value its dims of the output)."""

from __future__ import annotations

import math
import random
from typing import Sequence

import torch


def plant_nan(rng: random.Random, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """Makes one random element of a random pair NaN in both of its tensors (the kernel's
    input and the reference's: the same values in two dtypes, or one tensor twice); pairs
    without elements are never picked. Returns where, for a failure message."""
    candidates = [i for i, (kernel, _) in enumerate(pairs) if kernel.numel()]
    if not candidates:
        return "nowhere (no elements)"
    index = rng.choice(candidates)
    kernel, reference = pairs[index]
    flat = rng.randrange(kernel.numel())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), kernel.shape))
    kernel[where] = math.nan
    reference[where] = math.nan
    return f"tensor {index} at {where}"


def draw_nan(rng: random.Random, every_key_seen: bool) -> str:
    """A random attention case's NaN knob: "none" (two thirds), "query", "key", or, where
    every query row sees every key of its request (``every_key_seen``), "value" for half the
    "key" draws. (At a key some rows do not see, whether a NaN value makes those rows NaN
    depends on the tiles the kernel skips: docs/attention.md.)"""
    kind = rng.choice(("none", "none", "none", "none", "key", "query"))
    return "value" if kind == "key" and every_key_seen and rng.random() < 0.5 else kind


def plant_case_nan(
    kind: str,
    seed: int,
    q: torch.Tensor,
    keys: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
    values: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
) -> str:
    """Plants the NaN of draw_nan's ``kind``, placed by ``seed``: an element of ``q``, or of
    one request's keys or values (each given as the kernel's and the reference's lists).
    Returns where."""
    rng = random.Random(seed)
    if kind == "query":
        return plant_nan(rng, [(q, q)])
    if kind in ("key", "value"):
        kernel, reference = keys if kind == "key" else values
        return plant_nan(rng, list(zip(kernel, reference)))
    return "none"


def assert_nan_where(name: str, t: torch.Tensor, expected: torch.Tensor) -> None:
    """``t`` is NaN exactly where the boolean ``expected`` (on any device) is true."""
    wrong = t.isnan().cpu() != expected.cpu()
    assert not bool(wrong.any()), (
        f"{name}: {int(wrong.sum())} elements NaN where not expected or not where expected, "
        f"the first at {wrong.nonzero()[0].tolist()}"
    )
