"""Gated activation benchmark (GPU): silu/gelu/gelu_tanh_and_mul over several shapes and dtypes, each
checked against its float64 reference, then timed; bandwidth as a fraction of a device copy
measured in the same run, and speedup over the torch eager equivalent. Without a GPU it
says so and exits 0. Usage: python benchmarks/bench_activation.py [--output benchmarks/results/activation.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

import flashinfer_benchmark  # noqa: E402

if __name__ == "__main__":
    sys.exit(flashinfer_benchmark.family_main(
        "Gated activation benchmark (GPU)",
        ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"],
        ["bf16", "fp16"],
        [(1, 14336), (16, 14336), (2048, 11008), (8192, 14336), (8192, 4097)],
        Path(__file__).resolve().parent / "results" / "activation.md",
        "act(x[..., :d]) * x[..., d:] in eager mode",
        "bench_activation.py",
    ))
