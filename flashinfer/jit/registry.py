"""Every op's module specializations, so ``precompile`` can build them all.

Each ``flashinfer/jit/<op>.py`` registers a function listing its specs; this module
imports those files on demand.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

from .core import JitSpec

_OP_MODULES = (
    "flashinfer.jit.norm",
    "flashinfer.jit.activation",
    "flashinfer.jit.rope",
    "flashinfer.jit.page",
    "flashinfer.jit.sampling",
    "flashinfer.jit.decode",
    "flashinfer.jit.prefill",
)
_OPS: dict[str, Callable[[], Iterable[JitSpec]]] = {}


def register_op(name: str, specializations: Callable[[], Iterable[JitSpec]]) -> None:
    if name in _OPS and _OPS[name] is not specializations:
        raise ValueError(f"op {name!r} is registered twice")
    _OPS[name] = specializations


def registered_ops() -> dict[str, Callable[[], Iterable[JitSpec]]]:
    for module in _OP_MODULES:
        importlib.import_module(module)
    return dict(_OPS)


def specs_for(ops: Iterable[str] | None = None) -> list[JitSpec]:
    """The specs of ``ops`` (all registered ops when None)."""
    available = registered_ops()
    names = list(available) if ops is None else list(ops)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(
            f"unknown op(s) {', '.join(unknown)}; registered: {', '.join(sorted(available))}"
        )
    return [spec for name in names for spec in available[name]()]
