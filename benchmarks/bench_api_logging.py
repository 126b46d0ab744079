"""API logging overhead (CPU): per-call cost of @flashinfer_api at levels 0, 1, 3 and 5
on a trivial function with two 3x4 tensor arguments, against the undecorated function
measured in the same run. Log lines go to a temp file (flushed per call, as in use).

Usage: python benchmarks/bench_api_logging.py [--output benchmarks/results/api_logging.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import timeit
from pathlib import Path

import torch  # noqa: E402
from report import cpu_description, write_report  # noqa: E402

from flashinfer.api_logging import ApiLogger  # noqa: E402
from flashinfer.logdest import Destination  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS_US = {1: 5.0, 3: 30.0, 5: 100.0}


def trivial(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a


def per_call_seconds(func, a: torch.Tensor, b: torch.Tensor, number: int) -> float:  # noqa: ANN001
    return min(timeit.repeat(lambda: func(a, b), number=number, repeat=7)) / number


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/api_logging.md")
    args = parser.parse_args()
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = per_call_seconds(trivial, a, b, 200_000)
        rows.append(("undecorated", f"{base * 1e9:.0f}", "", ""))
        for level, number in ((0, 200_000), (1, 50_000), (3, 20_000), (5, 5_000)):
            logger = ApiLogger(level, Destination(os.path.join(tmp, f"log{level}.txt")))
            decorated = logger.decorate(trivial)
            cost = per_call_seconds(decorated, a, b, number)
            overhead_us = max(cost - base, 0.0) * 1e6
            target = TARGETS_US.get(level)
            verdict = (
                "identity"
                if decorated is trivial
                else f"<= {target:g} us: {'met' if overhead_us <= target else 'MISSED'}"
            )
            rows.append((f"level {level}", f"{cost * 1e9:.0f}", f"{overhead_us:.2f}", verdict))
    write_report(
        args.output,
        "API logging overhead (CPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"machine: {cpu_description()}; torch {torch.__version__}, "
            f"Python {platform.python_version()}",
            "function: two 3x4 float32 CPU tensors in, one out; log to a file, flushed per call",
            "figures: best of 7 repeats of many calls",
            "command: `python benchmarks/bench_api_logging.py`",
        ],
        ["decoration", "ns / call", "overhead us / call", "target"],
        "lrrl",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
