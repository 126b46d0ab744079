"""Norm family benchmark (GPU): rmsnorm, fused_add_rmsnorm and layernorm over several
shapes and dtypes, through flashinfer_benchmark.py's routines (each checked against its
float64 reference first): time, achieved bandwidth as a fraction of a device copy measured
in the same run, and speedup over the torch eager equivalent.

Usage: python benchmarks/bench_norm.py [--output benchmarks/results/norm.md]
Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from report import write_report  # noqa: E402

import flashinfer_benchmark  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ROUTINES = ["rmsnorm", "fused_add_rmsnorm", "layernorm"]
SHAPES = [(1, 4096), (128, 4096), (2048, 4096), (8192, 4096), (4096, 8192), (8192, 4097)]
DTYPES = ["bf16", "fp16"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/norm.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_norm: no CUDA GPU visible; nothing to measure")
        return 0
    rows = []
    for routine in ROUTINES:
        for dtype in DTYPES:
            for tokens, hidden in SHAPES:
                run_args = flashinfer_benchmark.parse_args(
                    ["--routine", routine, "--dtype", dtype, "--batch-size", str(tokens),
                     "--hidden-size", str(hidden), "--refcheck"])
                row = flashinfer_benchmark.run(run_args)
                rows.append((routine, row["case"], f"{row['median_ms'] * 1e3:.1f}",
                             f"{row['gb_per_s']:.0f}", f"{row['copy_bw_fraction']:.0%}",
                             f"x{row['speedup_vs_torch']:.2f}"))
    write_report(
        args.output,
        "Norm family benchmark (GPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
            "each row: refcheck against float64 torch, then flashinfer.testing.bench_gpu_time "
            "(median of 100 CUDA-event-timed calls, L2 flushed before each); bandwidth as a "
            "fraction of measure_copy_bandwidth() in the same run",
            "torch equivalents: rms_norm; residual add + rms_norm; layer_norm",
            "command: `python benchmarks/bench_norm.py`",
        ],
        ["op", "case", "flashinfer us", "GB/s", "of copy BW", "speedup vs torch eager"],
        "llrrrr",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
