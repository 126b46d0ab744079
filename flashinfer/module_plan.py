"""The reference's compiled-module plan entry, ``wrapper._cached_module.plan(*args)``, which
engines call directly to re-plan a CUDA-graph decode wrapper whose page-table buffers they
fill themselves (vLLM's ``fast_plan_decode``, with the arguments of the reference's
tensor-core plan). Our wrappers keep their schedule in Python, so ``_cached_module`` is a
:class:`ModulePlan`: the compiled module, plus a ``plan`` that re-plans the wrapper it
belongs to and returns its new plan record, which run() then launches with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class PlanArgs:
    """The reference's tensor-core plan arguments after its three workspace buffers
    (``kv_indptr``: page offsets; ``kv_lens``: each request's KV length)."""

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
    window_left: int
    fixed_split_size: int = -1
    disable_split_kv: bool = False


# positional arguments of the reference's plan: three workspaces, then PlanArgs' first 13
# fields, and with its fa2 backend fixed_split_size, disable_split_kv, num_colocated_ctas
_SHORT, _LONG = 16, 19


class ModulePlan:
    """A compiled module (every attribute forwarded to it) whose ``plan(*args)`` takes the
    reference's positional plan arguments and calls ``replan`` with them."""

    def __init__(self, module: Any, replan: Callable[[PlanArgs], Any]) -> None:
        self.module = module
        self._replan = replan

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # (not set yet: a copy being built)
            raise AttributeError(name)
        return getattr(self.module, name)

    def plan(self, *args: Any) -> Any:
        if len(args) not in (_SHORT, _LONG):
            raise TypeError(
                f"plan() takes the reference's {_SHORT} or {_LONG} positional arguments "
                f"(three workspace buffers, qo_indptr, kv_indptr, kv_lens, ...), got {len(args)}"
            )
        fields = args[3:_SHORT]
        if len(args) == _LONG:
            if args[18] not in (0, None):
                raise ValueError(f"num_colocated_ctas must be 0, got {args[18]!r}")
            fields = (*fields, args[16], args[17])
        return self._replan(PlanArgs(*fields))
