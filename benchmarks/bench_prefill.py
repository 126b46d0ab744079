"""Prefill attention benchmark (GPU): (a) single_prefill_with_kv_cache over 8192 tokens and
(b) BatchPrefillWithPagedKVCacheWrapper over 16 requests x 2048 tokens, page 16; both causal,
32 query / 8 KV heads, head_dim 128, bf16. Each case is checked against a float64 torch
reference first, then timed next to torch's flash SDPA on the same data in the same run.
Reports TFLOP/s (a causal mask counts the visible pairs only), the ratio to torch and the
share of the device's dense bf16 tensor-core peak. Results go to
benchmarks/results/prefill.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_prefill.py [--output FILE] [--probe];
FLASHINFER_PREFILL_TILING=128:m2kv32 (for example) measures another kernel tiling. --probe adds
rows that tell the batch case's costs apart: the same batch over ragged (contiguous) K/V, and
over pages of 1 and of 64 tokens.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch
from gpu_script import device_facts, measure, script_args, timing_fact
from report import write_report

from flashinfer.jit.prefill import DEFAULT_TILINGS, prefill_tiling

# 16 requests of 2048 query and 2048 KV tokens; torch reads the pages gathered before timing
BATCH = ["--batch_size", "16", "--s_qo", "2048", "--s_kv", "2048", "--causal"]
UNTIMED_GATHER = ["--torch_gather", "untimed"]
CASES = [  # (routine, its flags)
    ("single_prefill_with_kv_cache", ["--s_qo", "8192", "--s_kv", "8192", "--causal"]),
    ("BatchPrefillWithPagedKVCacheWrapper", [*BATCH, "--page_size", "16", *UNTIMED_GATHER]),
]
PROBE_CASES = [
    ("BatchPrefillWithRaggedKVCacheWrapper", BATCH),
    *(
        ("BatchPrefillWithPagedKVCacheWrapper", [*BATCH, "--page_size", page, *UNTIMED_GATHER])
        for page in ("1", "64")
    ),
]
SHAPE_FLAGS = [
    "--num_qo_heads",
    "32",
    "--num_kv_heads",
    "8",
    "--head_dim_qk",
    "128",
    "--q_dtype",
    "bfloat16",
]

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s; the most
# specific names first, as torch.cuda.get_device_name() spells them.
DENSE_BF16_PEAKS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
]


def dense_bf16_peak(device_name: str) -> float | None:
    """The data-sheet dense bf16 peak of this device (None when the name is not known)."""
    return next((peak for key, peak in DENSE_BF16_PEAKS if key in device_name), None)


def row(routine: str, flags: Sequence[str], peak: float | None) -> tuple[str, ...]:
    result = measure(routine, [*flags, *SHAPE_FLAGS], backends=("fa2", "flash"))
    ours, theirs = result["fa2"], result["flash"]
    ours_ms, torch_ms = ours["median_time"], theirs["median_time"]
    return (
        routine,
        str(ours["case"]),
        f"{ours_ms * 1e3:.0f}",
        f"{ours['tflops']:.0f}",
        f"{ours['tflops'] / peak:.0%}" if peak else "n/a",
        f"{torch_ms * 1e3:.0f}",
        f"{theirs['tflops']:.0f}",
        f"x{torch_ms / ours_ms:.2f}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--probe", action="store_true", help="also the ragged batch and pages of 1 and 64"
    )
    args = script_args("bench_prefill.py", "prefill.md", argv=argv, parser=parser)
    if args is None:
        return 0
    cases = CASES + PROBE_CASES if args.probe else CASES
    peak = dense_bf16_peak(torch.cuda.get_device_name())
    tiling = prefill_tiling(128)
    tiling_source = (
        "the default" if tiling == DEFAULT_TILINGS[128] else "from FLASHINFER_PREFILL_TILING"
    )
    peak_note = (
        f"dense bf16 peak used for the share: {peak:.0f} TFLOP/s (data sheet, by the device name)"
        if peak
        else "no data-sheet peak known for this device: no share"
    )
    write_report(
        args.output,
        "Prefill attention benchmark (GPU)",
        [
            *device_facts(),
            "32 query / 8 KV heads, head_dim 128, bf16, NHD, causal (bottom-right aligned); "
            "batch: 16 requests of 2048 query and 2048 KV tokens over shuffled pages of 16",
            f"each case checked against float64 torch first; then {timing_fact(100)}; batch: "
            "plan() once, run() timed",
            "TFLOP/s counts 4 * qo_heads * head_dim per visible (query, key) pair (causal: "
            "the bottom-right triangle)",
            "torch: scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION) with "
            "enable_gqa=True, on dense [B, H, L, D] views of the same data (batch: the pages "
            "gathered once, before timing)",
            peak_note,
            f"kernel tiling (head_dim 128): {tiling.name} ({tiling_source})",
            "command: `python benchmarks/bench_prefill.py` (flashinfer_benchmark.py routines, "
            "backends fa2 and flash)",
        ],
        [
            "routine",
            "case",
            "flashinfer us",
            "TFLOP/s",
            "of peak",
            "torch us",
            "torch TFLOP/s",
            "speedup",
        ],
        "llrrrrrr",
        [row(routine, flags, peak) for routine, flags in cases],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
