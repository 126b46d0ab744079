"""Sampling routines: softmax, the sampling APIs and the top-k / top-p renorm and mask
ops, each against the torch eager pipeline it replaces (softmax, sort, cumsum, masks,
multinomial).

Logits are ``randn * --logits_scale`` (larger: a peakier distribution) in --input_dtype;
probabilities are their float32 softmax. The sampling APIs draw with ``seed=--random_seed,
offset=0``, as the reference's CLI does (the same draw every call, CUDA-graph safe).
--refcheck cannot compare random tokens between backends: it checks that every token lies
in the set the filters allow (float64, with a little slack on top-p and min-p thresholds for
float32 sums), and that renorm / mask outputs keep exactly the tokens they must, with the
right values.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

import torch

from flashinfer.testing import reference

from . import (
    OURS,
    Backend,
    Case,
    Family,
    Routine,
    build,
    count_bad,
    dtype_arg,
    dtype_name,
    flag,
    register,
)

_SLACK = 1e-4  # of top-p and min-p thresholds, for float32 sums over the vocabulary


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(group, "batch_size", type=int, default=128, help="rows")
    flag(group, "vocab_size", type=int, default=131072)
    flag(
        group,
        "input_dtype",
        "--dtype",
        type=dtype_arg(torch.float32, torch.float16, torch.bfloat16),
        default=torch.float32,
        help="dtype of logits (probabilities are float32)",
    )
    flag(group, "top_k", type=int, default=50)
    flag(group, "top_p", type=float, default=0.9)
    flag(group, "min_p", type=float, default=0.1)
    flag(group, "temperature", type=float, default=1.0, help="softmax")
    flag(group, "filter_apply_order", choices=("top_k_first", "joint"), default="top_k_first")
    flag(group, "logits_scale", type=float, default=1.0, help="logits = randn * this")


def _validate(args: argparse.Namespace) -> str | None:
    if min(args.batch_size, args.vocab_size, args.top_k) < 1:
        return "--batch_size, --vocab_size and --top_k must be >= 1"
    if not (0 < args.top_p <= 1 and 0 <= args.min_p <= 1):
        return "--top_p must be in (0, 1] and --min_p in [0, 1]"
    if not args.temperature > 0:
        return "--temperature must be > 0"
    return None


FAMILY = Family(
    "sampling",
    _add_arguments,
    (
        "batch_size",
        "vocab_size",
        "input_dtype",
        "top_k",
        "top_p",
        "min_p",
        "temperature",
        "filter_apply_order",
        "logits_scale",
    ),
    _validate,
)


# -- torch eager equivalents --------------------------------------------------------------------


def _top_k(args: argparse.Namespace) -> int:
    return min(args.top_k, args.vocab_size)


def _kth_largest(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.topk(k, dim=-1).values[:, -1:]


def _sorted_filter(
    p: torch.Tensor, top_k: int | None, top_p: float | None, joint: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept probabilities in descending order, their token ids): the top-k first (or,
    ``joint``, the tokens in both sets of the original distribution), then those whose
    strictly-larger mass is below top_p of what is left."""
    ranked, order = p.sort(dim=-1, descending=True)
    if top_k is not None and not joint:
        ranked[:, top_k:] = 0
    if top_p is not None:
        exclusive = ranked.cumsum(dim=-1) - ranked
        ranked[exclusive >= top_p * ranked.sum(dim=-1, keepdim=True)] = 0
    if top_k is not None and joint:
        ranked[:, top_k:] = 0
    return ranked, order


def _draw(ranked: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return order.gather(-1, torch.multinomial(ranked, 1)).squeeze(-1)


def _renormalized(kept: torch.Tensor) -> torch.Tensor:
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_p_renorm(p: torch.Tensor, top_p: float) -> torch.Tensor:
    ranked, order = _sorted_filter(p, None, top_p, joint=False)
    return _renormalized(torch.zeros_like(p).scatter(-1, order, ranked))


# -- checks -------------------------------------------------------------------------------------


def _token_check(allowed: Callable[[], torch.Tensor]) -> Callable[[torch.Tensor], tuple[int, int]]:
    """Every sampled token is in range and in ``allowed()`` ``[batch, vocab]`` (computed
    once, on the first check)."""
    memo: list[torch.Tensor] = []

    def check(tokens: torch.Tensor) -> tuple[int, int]:
        memo[:] = memo or [allowed()]
        mask = memo[0]
        ids = tokens.long().reshape(-1)
        inside = (ids >= 0) & (ids < mask.shape[1])
        picked = mask.gather(1, ids.clamp(0, mask.shape[1] - 1)[:, None]).squeeze(1)
        return count_bad(~(inside & picked))

    return check


def _filter_check(
    x: torch.Tensor,
    loose: Callable[[], torch.Tensor],
    tight: Callable[[], torch.Tensor],
    masked_value: float,
    expected: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], tuple[int, int]]:
    """A renorm / mask output: the kept tokens (those not ``masked_value``) lie in
    ``loose()`` and include ``tight()`` (the sets at the threshold's two slack edges), and
    their values are ``expected(kept)``."""
    memo: list[torch.Tensor] = []

    def check(out: torch.Tensor) -> tuple[int, int]:
        memo[:] = memo or [loose(), tight()]
        kept = out != masked_value
        wrong = kept & ~torch.isclose(out.double(), expected(kept), rtol=1e-3, atol=1e-7)
        return count_bad((kept & ~memo[0]) | (~kept & memo[1]) | wrong)

    return check


# -- the routines -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Op:
    """One API: its call, its torch equivalent, its check, and its output's bytes per
    element (0: one token per row)."""

    from_logits: bool
    ours: Callable[[Any, argparse.Namespace, torch.Tensor], Any]
    torch_call: Callable[[argparse.Namespace, torch.Tensor], torch.Tensor]
    # None: compared with a float64 reference instead
    check: (
        Callable[[argparse.Namespace, torch.Tensor], Callable[[torch.Tensor], tuple[int, int]]]
        | None
    )
    out_bytes: Callable[[torch.Tensor], int] = lambda x: 0


def _seeded(args: argparse.Namespace) -> dict[str, int]:
    return {"seed": args.random_seed, "offset": 0}


def _probs64(x: torch.Tensor, from_logits: bool) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1) if from_logits else x.double()


def _top_k_top_p_allowed(
    args: argparse.Namespace, x: torch.Tensor, from_logits: bool
) -> Callable[[torch.Tensor], tuple[int, int]]:
    def allowed() -> torch.Tensor:
        p = _probs64(x, from_logits)
        return reference.top_k_set(p, args.top_k) & reference.top_p_set(p, args.top_p + _SLACK)

    return _token_check(allowed)


def _renorm_expected(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda kept: reference.renormalize(x, kept)


_OPS: dict[str, _Op] = {
    "softmax": _Op(
        True,
        lambda api, args, x: api(x, args.temperature, enable_pdl=args.enable_pdl),
        lambda args, x: torch.softmax(x.float() / args.temperature, dim=-1),
        None,
        lambda x: 4,
    ),
    "sampling_from_probs": _Op(
        False,
        lambda api, args, x: api(x, **_seeded(args)),
        lambda args, x: torch.multinomial(x, 1).squeeze(-1),
        lambda args, x: _token_check(lambda: x > 0),
    ),
    "sampling_from_logits": _Op(
        True,
        lambda api, args, x: api(x, **_seeded(args)),
        lambda args, x: torch.multinomial(torch.softmax(x.float(), dim=-1), 1).squeeze(-1),
        lambda args, x: _token_check(lambda: x > float("-inf")),
    ),
    "top_k_sampling_from_probs": _Op(
        False,
        lambda api, args, x: api(x, args.top_k, **_seeded(args)),
        lambda args, x: _draw(*x.topk(_top_k(args), dim=-1)),
        lambda args, x: _token_check(lambda: reference.top_k_set(x, args.top_k)),
    ),
    "top_p_sampling_from_probs": _Op(
        False,
        lambda api, args, x: api(x, args.top_p, **_seeded(args)),
        lambda args, x: _draw(*_sorted_filter(x, None, args.top_p, joint=False)),
        lambda args, x: _token_check(lambda: reference.top_p_set(x, args.top_p + _SLACK)),
    ),
    "min_p_sampling_from_probs": _Op(
        False,
        lambda api, args, x: api(x, args.min_p, **_seeded(args)),
        lambda args, x: torch.multinomial(
            x.masked_fill(x < args.min_p * x.amax(dim=-1, keepdim=True), 0), 1
        ).squeeze(-1),
        lambda args, x: _token_check(lambda: reference.min_p_set(x, args.min_p * (1 - _SLACK))),
    ),
    "top_k_top_p_sampling_from_probs": _Op(
        False,
        lambda api, args, x: api(
            x, args.top_k, args.top_p, filter_apply_order=args.filter_apply_order, **_seeded(args)
        ),
        lambda args, x: _draw(
            *_sorted_filter(x, _top_k(args), args.top_p, args.filter_apply_order == "joint")
        ),
        lambda args, x: _top_k_top_p_allowed(args, x, from_logits=False),
    ),
    "top_k_top_p_sampling_from_logits": _Op(
        True,
        lambda api, args, x: api(
            x, args.top_k, args.top_p, filter_apply_order=args.filter_apply_order, **_seeded(args)
        ),
        lambda args, x: _draw(
            *_sorted_filter(
                torch.softmax(x.float(), dim=-1),
                _top_k(args),
                args.top_p,
                args.filter_apply_order == "joint",
            )
        ),
        lambda args, x: _top_k_top_p_allowed(args, x, from_logits=True),
    ),
    "top_k_renorm_probs": _Op(
        False,
        lambda api, args, x: api(x, args.top_k),
        lambda args, x: _renormalized(x.masked_fill(x < _kth_largest(x, _top_k(args)), 0)),
        lambda args, x: _filter_check(
            x,
            lambda: reference.top_k_set(x, args.top_k),
            lambda: x.double() > _kth_largest(x.double(), _top_k(args)),
            0.0,
            _renorm_expected(x),
        ),
        lambda x: 4,
    ),
    "top_p_renorm_probs": _Op(
        False,
        lambda api, args, x: api(x, args.top_p),
        lambda args, x: _top_p_renorm(x, args.top_p),
        lambda args, x: _filter_check(
            x,
            lambda: reference.top_p_set(x, args.top_p + _SLACK),
            lambda: reference.top_p_set(x, args.top_p - _SLACK),
            0.0,
            _renorm_expected(x),
        ),
        lambda x: 4,
    ),
    "top_k_mask_logits": _Op(
        True,
        lambda api, args, x: api(x, args.top_k),
        lambda args, x: x.masked_fill(x < _kth_largest(x, _top_k(args)), float("-inf")),
        lambda args, x: _filter_check(
            x,
            lambda: reference.top_k_set(x, args.top_k),
            lambda: x.double() > _kth_largest(x.double(), _top_k(args)),
            float("-inf"),
            lambda kept: x.double(),
        ),
        lambda x: x.element_size(),
    ),
}


def _routine(name: str, op: _Op) -> Routine:
    def make_case(args: argparse.Namespace, device: torch.device) -> Case:
        logits = torch.randn(args.batch_size, args.vocab_size, device=device) * args.logits_scale
        x = logits.to(args.input_dtype) if op.from_logits else torch.softmax(logits, dim=-1)

        def ours() -> Backend:
            import flashinfer

            api = getattr(flashinfer, name)
            return Backend(lambda: op.ours(api, args, x))

        check = op.check(args, x) if op.check is not None else None
        return Case(
            label=f"{args.batch_size} x {args.vocab_size} {dtype_name(x.dtype)}",
            backends=build(
                args.backends,
                {OURS: ours, "torch": lambda: Backend(lambda: op.torch_call(args, x))},
            ),
            bytes=x.numel() * (x.element_size() + op.out_bytes(x)) + 4 * args.batch_size,
            reference=None
            if check is not None
            else lambda: torch.softmax(x.double() / args.temperature, dim=-1),
            check=check,
            atol=1e-6,
            rtol=1e-3,
        )

    source = "logits" if op.from_logits else "probs"
    return Routine(
        name,
        FAMILY,
        f"{name} ({source}) vs the torch eager pipeline",
        (OURS, "torch"),
        make_case,
        pdl=name == "softmax",
    )


for _name, _op in _OPS.items():
    register(_routine(_name, _op))
