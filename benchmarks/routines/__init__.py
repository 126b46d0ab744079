"""Benchmark routines for flashinfer_benchmark.py, registered by family.

A family (attention, norm, sampling, ...) owns the flags its routines share, so a flag
means the same for every routine of the family (one testlist mixes them freely), and the
CSV columns those flags fill. A routine builds a :class:`Case` from the parsed flags: one
:class:`Backend` per requested backend (``fa2``: this library; ``torch``: the torch eager
equivalent; for attention also SDPA pinned to its ``cudnn`` or ``flash`` kernel), the float64
reference or validity check their outputs are held to by ``--refcheck``, and the bytes and
FLOPs of one call.

Building a case touches the device only through the backends asked for: with torch backends
alone it runs on CPU tensors, which is how the tests check routines without a GPU.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

OURS = "fa2"
# other names accepted by --backends, for testlists written for the reference
BACKEND_ALIASES = {"cuda": OURS}


class BackendUnavailable(RuntimeError):
    """This backend cannot run this case (say, an SDPA kernel that rejects the shape)."""


def _same(result: Any) -> Any:
    return result


@dataclass(frozen=True)
class Backend:
    """One backend of a case: ``call`` is what is timed; ``output`` turns its result into
    the tensor --refcheck compares (a layout change, kept out of the timed call)."""

    call: Callable[[], Any]
    output: Callable[[Any], torch.Tensor] = _same
    resolved: str | None = None  # what actually ran when it differs (auto -> fa2)


@dataclass
class Case:
    label: str  # the shape, for tables and logs
    backends: dict[str, Backend]
    bytes: int  # bytes read + written by one call (TB/s)
    flops: int = 0  # 0 where TFLOP/s means nothing
    reference: Callable[[], torch.Tensor] | None = None  # float64 truth for every backend
    check: Callable[[torch.Tensor], tuple[int, int]] | None = None  # (bad, total) elements
    atol: float = 1e-2
    rtol: float = 1e-2


@dataclass(frozen=True)
class Family:
    name: str
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    columns: tuple[str, ...]  # CSV columns that its flags fill
    validate: Callable[[argparse.Namespace], str | None] = lambda args: None  # error message


@dataclass(frozen=True)
class Routine:
    name: str  # the API's name, as the reference's CLI spells it
    family: Family
    help: str
    backends: tuple[str, ...]
    make_case: Callable[[argparse.Namespace, torch.device], Case]
    pdl: bool = False  # the API takes enable_pdl (--enable_pdl is passed on)


ROUTINES: dict[str, Routine] = {}


def register(routine: Routine) -> Routine:
    if routine.name in ROUTINES:
        raise ValueError(f"routine {routine.name!r} is registered twice")
    ROUTINES[routine.name] = routine
    return routine


def families() -> list[Family]:
    """Every family with a registered routine, in registration order."""
    return list({id(r.family): r.family for r in ROUTINES.values()}.values())


def flag(group: argparse._ArgumentGroup, name: str, *aliases: str, **kwargs: Any) -> None:
    """``--name`` (the reference's underscore spelling) plus its dashed alias and
    ``aliases`` (earlier names of ours)."""
    names = [f"--{name}"]
    dashed = f"--{name.replace('_', '-')}"
    if dashed != names[0]:
        names.append(dashed)
    group.add_argument(*names, *aliases, dest=name, **kwargs)


_DTYPES = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "e4m3": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "e5m2": torch.float8_e5m2,
}


def dtype_arg(*allowed: torch.dtype) -> Callable[[str], torch.dtype]:
    """An argparse type: a dtype name (the reference's or short) among ``allowed``."""
    names = [n for n, d in _DTYPES.items() if d in allowed]

    def parse(text: str) -> torch.dtype:
        dtype = _DTYPES.get(text.lower())
        if dtype not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown dtype {text!r}; use one of {', '.join(names)}"
            )
        return dtype

    return parse


HALF_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def half_tolerance(dtype: torch.dtype) -> float:
    """atol = rtol for outputs rounded to ``dtype`` from float32 math."""
    return 2e-2 if dtype == torch.bfloat16 else 1e-2


def build(
    backends: Iterable[str], factories: dict[str, Callable[[], Backend]]
) -> dict[str, Backend]:
    """The requested backends, each built by its factory (so only those touch memory)."""
    return {name: factories[name]() for name in backends}


def count_bad(bad: torch.Tensor) -> tuple[int, int]:
    """(number of True elements, total) of a boolean tensor."""
    return int(bad.sum().item()), bad.numel()


# registration order: the order of the families' columns in the CSV
from . import attention, norm, activation, rope, page, cascade, sampling  # noqa: E402,F401,I001
