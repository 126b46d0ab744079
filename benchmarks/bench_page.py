"""Paged KV append benchmark (GPU): append_paged_kv_cache over several token counts and
dtypes, checked (exactly) by reading the written slots back, then timed; bandwidth as a
fraction of a device copy measured in the same run, and speedup over torch indexed writes.
Without a GPU it says so and exits 0. Usage: python benchmarks/bench_page.py [--output ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import flashinfer_benchmark  # noqa: E402

if __name__ == "__main__":
    sys.exit(flashinfer_benchmark.family_main(
        "Paged KV append benchmark (GPU)",
        ["append_paged_kv_cache"],
        ["bf16", "fp16"],
        [(1, 128), (64, 128), (2048, 128), (16384, 128), (16384, 256)],
        Path(__file__).resolve().parent / "results" / "page.md",
        "k_cache[page, slot] = key; v_cache[page, slot] = value (advanced indexing)",
        "bench_page.py",
    ))
