"""RoPE benchmark (GPU): apply_rope_pos_ids over several token counts and dtypes, checked
against the complex-number float64 reference, then timed; bandwidth as a fraction of a
device copy measured in the same run, and speedup over a torch eager NeoX implementation.
Without a GPU it says so and exits 0. Usage: python benchmarks/bench_rope.py [--output ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import flashinfer_benchmark  # noqa: E402

if __name__ == "__main__":
    sys.exit(flashinfer_benchmark.family_main(
        "RoPE benchmark (GPU)",
        ["rope"],
        ["bf16", "fp16"],
        [(1, 128), (64, 128), (2048, 128), (8192, 128), (8192, 256)],
        Path(__file__).resolve().parent / "results" / "rope.md",
        "q * cos + rotate_half(q) * sin on q [nnz, 32, d] and k [nnz, 8, d]",
        "bench_rope.py",
    ))
