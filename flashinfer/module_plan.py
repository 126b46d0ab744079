"""The reference's compiled-module plan entry, ``wrapper._cached_module.plan(*args)``, which
engines call directly to re-plan a decode wrapper whose page-table buffers they fill
themselves (vLLM's ``fast_plan_decode``, SGLang's own ``fast_decode_plan`` before it used
ours), with the arguments of the reference's tensor-core plan or of its CUDA-core decode
plan. Our wrappers keep their schedule in Python, so ``_cached_module`` is a
:class:`ModulePlan`: the compiled module, plus a ``plan`` that re-plans the wrapper it
belongs to and returns its new plan record, which run() then launches with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class PlanArgs:
    """The reference's tensor-core plan arguments after its three workspace buffers
    (``kv_indptr``: page offsets; ``kv_lens``: each request's KV length). ``window_left``
    is None in the oldest form, which took the window at run time (the wrapper's
    ``_window_left`` then); ``uniform_q_len`` is 0 or the query tokens of every request."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_lens: torch.Tensor
    total_num_rows: int
    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    page_size: int
    enable_cuda_graph: bool
    head_dim_qk: int
    head_dim_vo: int
    causal: bool
    window_left: int | None = None
    fixed_split_size: int = -1
    disable_split_kv: bool = False
    uniform_q_len: int = 0


# The positional forms the reference's plan has taken, as engines pinned to each release
# pass them: three workspaces and PlanArgs' first 12 fields (15), then window_left (16),
# fa2's fixed_split_size and disable_split_kv (18), num_colocated_ctas (19), uniform_q_len
# (20). vLLM has passed 15, 18, and 16 or 19 (by its _backend) over its releases.
_ARITIES = (15, 16, 18, 19, 20)
_FIELDS = 15  # the end of the fields every form has


@dataclass(frozen=True)
class DecodePlanArgs:
    """The reference's CUDA-core decode plan arguments after its three workspace buffers
    (``kv_indptr``: page offsets, on the host); ``q_data`` and ``kv_data`` are empty
    tensors whose dtypes are q's and the cache's."""

    kv_indptr: torch.Tensor
    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    page_size: int
    enable_cuda_graph: bool
    window_left: int
    logits_soft_cap: float
    head_dim_qk: int
    head_dim_vo: int
    q_data: torch.Tensor
    kv_data: torch.Tensor


def tensor_core_plan_args(args: tuple[Any, ...]) -> PlanArgs:
    """The fields of the reference's tensor-core plan, in any of its forms (``_ARITIES``)."""
    n = len(args)
    if n not in _ARITIES:
        forms = ", ".join(map(str, _ARITIES[:-1])) + f" or {_ARITIES[-1]}"
        raise TypeError(
            f"plan() takes the reference's {forms} positional arguments (three workspace "
            f"buffers, qo_indptr, kv_indptr, kv_lens, ...), got {n}"
        )
    if n >= 19 and args[18] not in (0, None):
        raise ValueError(f"num_colocated_ctas must be 0, got {args[18]!r}")
    extra: dict[str, Any] = {}
    if n >= 16:
        extra["window_left"] = args[15]
    if n >= 18:
        extra["fixed_split_size"] = args[16]
        extra["disable_split_kv"] = args[17]
    if n == 20:
        extra["uniform_q_len"] = args[19]
    return PlanArgs(*args[3:_FIELDS], **extra)


def cuda_core_plan_args(args: tuple[Any, ...]) -> DecodePlanArgs:
    """The fields of the reference's CUDA-core decode plan (15 arguments in every release
    engines call it with)."""
    if len(args) != 15:
        raise TypeError(
            "plan() takes the reference's 15 positional decode-plan arguments (three "
            f"workspace buffers, indptr, batch_size, ...), got {len(args)}"
        )
    for name, value in (("empty_q_data", args[13]), ("empty_kv_data", args[14])):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a tensor (its dtype is the plan's), got {type(value).__name__}"
            )
    return DecodePlanArgs(*args[3:])


class ModulePlan:
    """A compiled module (every attribute forwarded to it) whose ``plan(*args)`` takes the
    reference's positional plan arguments (read by ``parse``: :func:`tensor_core_plan_args`
    or :func:`cuda_core_plan_args`) and calls ``replan`` with them."""

    def __init__(
        self, module: Any, replan: Callable[[Any], Any], parse: Callable[[tuple[Any, ...]], Any]
    ) -> None:
        self.module = module
        self._replan = replan
        self._parse = parse

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # (not set yet: a copy being built)
            raise AttributeError(name)
        return getattr(self.module, name)

    def plan(self, *args: Any) -> Any:
        return self._replan(self._parse(args))
