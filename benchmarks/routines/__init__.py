"""Benchmark routines for flashinfer_benchmark.py; each kernel family registers its own.

A routine adds its shape flags to an argparse group and, given the parsed arguments,
builds one :class:`Case`: the flashinfer call, the torch reference it is compared
with, and the bytes and FLOPs it moves, for GB/s and TFLOP/s figures.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class Case:
    label: str  # the shape, for the table
    run: Callable[[], Any]  # the flashinfer call
    torch_run: Callable[[], Any]  # the fastest torch equivalent, timed for the speedup
    reference: Callable[[], torch.Tensor]  # float64 reference of run()'s output
    output: Callable[[], torch.Tensor]  # run()'s output after a call
    bytes: int  # bytes read + written by one call
    flops: int = 0  # 0 when TFLOP/s is not meaningful
    atol: float = 1e-2
    rtol: float = 1e-2


@dataclass
class Routine:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    make_case: Callable[[argparse.Namespace, torch.device], Case]


ROUTINES: dict[str, Routine] = {}


def register(routine: Routine) -> Routine:
    if routine.name in ROUTINES:
        raise ValueError(f"routine {routine.name!r} is registered twice")
    ROUTINES[routine.name] = routine
    return routine


def dtype_arg(text: str) -> torch.dtype:
    names = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float32": torch.float32, "fp32": torch.float32}
    try:
        return names[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"unknown dtype {text!r}; use one of {', '.join(names)}") from None


from . import activation, norm, page, prefill, rope  # noqa: E402,F401  (register their routines)
