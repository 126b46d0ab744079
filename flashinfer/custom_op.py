"""Kernel launches as torch custom ops (``torch.ops.flashinfer.<name>``), so compiled models
and graph captures see one opaque node per launch instead of a call into a loaded module.

The convention every kernel API follows: the public function validates its arguments and
allocates its outputs in plain torch code (traceable), then makes one op call that writes
the tensors named in ``mutates_args`` and returns nothing. The op's real implementation
loads the module and launches; its fake implementation touches no data, so tracing with
fake tensors (``torch.compile``, ``make_fx``, ``torch.export``) neither compiles nor
launches anything.

An eager call on plain tensors runs the implementation directly instead of going through
the dispatcher: torch 2.13 handles a Python op that mutates its arguments in 30 to 300 us
a call (its version-counter step grows with the square of the argument count), against
about 1 us for this check. Anything traced (dynamo), under a dispatch mode (fake tensors,
make_fx, functionalization, recorders) or given tensor subclasses goes through the op.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch._library.custom_ops import CustomOpDef
from torch._subclasses.fake_tensor import is_fake

NAMESPACE = "flashinfer"
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _writes_only(*args: Any, **kwargs: Any) -> None:
    """The fake implementation of an op that returns nothing: its effect is on its
    arguments, which fake tensors already describe."""
    return None


def _dispatched(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call must go through the dispatcher to be seen (see the module doc)."""
    if torch.compiler.is_compiling():  # first: dynamo folds it, and traces nothing after
        return True
    if torch._C._len_torch_dispatch_stack():
        return True
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and type(value) not in _PLAIN:
            return True
    return False


class KernelOp:
    """A registered op (``op``, a CustomOpDef) and its implementation, called as the op."""

    def __init__(self, op: CustomOpDef, impl: Callable[..., Any]) -> None:
        self.op = op
        self.impl = impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _dispatched(args, kwargs):
            return self.op(*args, **kwargs)
        return self.impl(*args, **kwargs)


def kernel_op(
    name: str, *, mutates_args: Sequence[str], fake: Callable[..., Any] | None = None
) -> Callable[[Callable[..., Any]], KernelOp]:
    """Register the decorated function as ``torch.ops.flashinfer.<name>`` (schema from its
    type hints). ``mutates_args`` names exactly the arguments it writes; ``fake`` computes
    the results of an op that returns tensors (default: the op returns None)."""

    def register(impl: Callable[..., Any]) -> KernelOp:
        op = torch.library.custom_op(
            f"{NAMESPACE}::{name}", impl, mutates_args=tuple(mutates_args), device_types="cuda"
        )
        op.register_fake(fake or _writes_only)
        return KernelOp(op, impl)

    return register


def is_symbolic(*tensors: torch.Tensor) -> bool:
    """True while tracing (dynamo, or any fake or meta tensor among ``tensors``): data
    pointers are not real then, so checks that read them (aliasing, alignment) must use
    storage identity or be skipped rather than report a false error."""
    if torch.compiler.is_compiling():
        return True
    if torch._C._len_torch_dispatch_stack() == 0 and all(
        type(t) is torch.Tensor and not t.is_meta for t in tensors
    ):
        return False  # plain tensors, no mode active: real, known without is_fake's cost
    return any(is_fake(t) or t.is_meta for t in tensors)
