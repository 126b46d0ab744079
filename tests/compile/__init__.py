"""The kernel APIs as torch custom ops: tracing with fake tensors, export, compile, opcheck.

``cpu_kernels`` lets CPU tests that stand a recorder in for a compiled module run the ops'
real implementations on CPU tensors (the ops are registered for CUDA only).
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Iterator

import torch
from torch._library import custom_ops
from torch.library import CustomOpDef


def module_ops(*modules: ModuleType) -> list[CustomOpDef]:
    """The flashinfer custom ops whose implementations the ``modules`` define."""
    names = {module.__name__ for module in modules}
    return [
        op
        for op in list(custom_ops.OPDEFS.values())
        if op._namespace == "flashinfer" and op._init_fn.__module__ in names
    ]


@contextlib.contextmanager
def cpu_kernels(*modules: ModuleType) -> Iterator[None]:
    """The real implementations of the ``modules``' ops registered for CPU tensors while the
    block runs (``_init_fn`` is the function ``kernel_op`` decorated). Ops that already have
    a CPU kernel (an enclosing block) are left to it."""
    library = torch.library.Library("flashinfer", "IMPL")
    for op in module_ops(*modules):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op._qualname, "CPU"):
            library.impl(op._name, op._init_fn, "CPU")
    try:
        yield
    finally:
        library._destroy()
