"""Norm family benchmark (GPU): rmsnorm, rmsnorm_quant, fused_add_rmsnorm and layernorm over several shapes and dtypes, each
checked against its float64 reference, then timed; bandwidth as a fraction of a device copy
measured in the same run, and speedup over the torch eager equivalent. Without a GPU it
says so and exits 0. Usage: python benchmarks/bench_norm.py [--output benchmarks/results/norm.md]
"""

from __future__ import annotations

import sys
from pathlib import Path

import flashinfer_benchmark  # noqa: E402

if __name__ == "__main__":
    sys.exit(flashinfer_benchmark.family_main(
        "Norm family benchmark (GPU)",
        ["rmsnorm", "rmsnorm_quant", "fused_add_rmsnorm", "layernorm"],
        ["bf16", "fp16"],
        [(1, 4096), (128, 4096), (2048, 4096), (8192, 4096), (4096, 8192), (8192, 4097)],
        Path(__file__).resolve().parent / "results" / "norm.md",
        "rms_norm; rms_norm + fp8 cast; residual add + rms_norm; layer_norm",
        "bench_norm.py",
    ))
