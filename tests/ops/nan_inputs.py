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


def plant_case_nan(
    kind: str,
    seed: int,
    q: torch.Tensor,
    ks: Sequence[torch.Tensor],
    k_ref: Sequence[torch.Tensor],
) -> str:
    """A random attention case's NaN, placed by ``seed``: ``kind`` "query" (an element of
    ``q``), "key" (an element of one request's keys: ``ks`` the kernel's, ``k_ref`` the
    reference's) or "none". Returns where. (A NaN value is left out: at a key some rows do not
    see, whether those rows are NaN depends on the tiles the kernel skips.)"""
    rng = random.Random(seed)
    if kind == "query":
        return plant_nan(rng, [(q, q)])
    if kind == "key":
        return plant_nan(rng, list(zip(ks, k_ref)))
    return "none"


def assert_nan_where(name: str, t: torch.Tensor, expected: torch.Tensor) -> None:
    """``t`` is NaN exactly where the boolean ``expected`` (on any device) is true."""
    wrong = t.isnan().cpu() != expected.cpu()
    assert not bool(wrong.any()), (
        f"{name}: {int(wrong.sum())} elements NaN where not expected or not where expected, "
        f"the first at {wrong.nonzero()[0].tolist()}"
    )
