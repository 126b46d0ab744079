"""Decode attention benchmark (GPU): BatchDecodeWithPagedKVCacheWrapper.run for batch
{1, 16, 64, 256} x kv_len {512, 4k, 32k}, head_dim 128, 32 query / 8 KV heads, page 16,
bf16. Reports the achieved KV-read bandwidth as a fraction of the device copy bandwidth
measured in the same run (also with use_tensor_cores=True), and the speedup over torch
(gather the pages, then scaled_dot_product_attention with GQA). Each case is checked against
float64 torch first. Results go to benchmarks/results/decode.md. Without a GPU it says so
and exits 0.
Usage: python benchmarks/bench_decode.py [--output FILE] [--quick]
"""

from __future__ import annotations

import sys
from typing import Sequence

from gpu_script import copy_bandwidth, device_facts, measure, script_args, timing_fact
from report import write_report

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
BATCHES = (1, 16, 64, 256)
KV_LENS = (512, 4096, 32768)
SHAPE_FLAGS = [
    "--num_qo_heads",
    str(QO_HEADS),
    "--num_kv_heads",
    str(KV_HEADS),
    "--head_dim_qk",
    str(HEAD_DIM),
    "--page_size",
    str(PAGE),
    "--q_dtype",
    "bfloat16",
]


def row(batch: int, kv_len: int, copy_gbs: float) -> tuple[str, ...]:
    result = measure(
        "BatchDecodeWithPagedKVCacheWrapper",
        ["--batch_size", str(batch), "--s_kv", str(kv_len), *SHAPE_FLAGS],
        backends=("fa2", "torch", "fa2_tc"),
    )
    ours_ms, torch_ms = result["fa2"]["median_time"], result["torch"]["median_time"]
    tc_ms = result["fa2_tc"]["median_time"]
    kv_bytes = 2 * batch * kv_len * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    gbs = kv_bytes / (ours_ms * 1e-3) / 1e9
    tc_gbs = kv_bytes / (tc_ms * 1e-3) / 1e9
    return (
        str(batch),
        str(kv_len),
        f"{ours_ms * 1e3:.1f}",
        f"{gbs:.0f}",
        f"{gbs / copy_gbs:.0%}",
        f"{torch_ms * 1e3:.1f}",
        f"x{torch_ms / ours_ms:.1f}",
        f"{tc_ms * 1e3:.1f}",
        f"{tc_gbs / copy_gbs:.0%}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = script_args(
        "bench_decode.py",
        "decode.md",
        __doc__.splitlines()[0],
        quick_help="batch 64 x 4k and 1 x 32k only",
        argv=argv,
    )
    if args is None:
        return 0
    copy_gbs = copy_bandwidth()
    shapes = [(64, 4096), (1, 32768)] if args.quick else [(b, n) for b in BATCHES for n in KV_LENS]
    write_report(
        args.output,
        "Decode attention benchmark (GPU)",
        [
            *device_facts(),
            f"device copy bandwidth (measure_copy_bandwidth, read + write): {copy_gbs:.0f} GB/s",
            f"{QO_HEADS} query / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, page {PAGE}, bf16, "
            f"NHD, pages shuffled; plan() once, then run() timed ({timing_fact(100)})",
            "KV GB/s counts the K and V bytes read; torch = page gather + SDPA (enable_gqa, "
            "torch's kernel choice), both inside the timed call",
            "tensor cores = the same wrapper with use_tensor_cores=True (the prefill kernel, "
            "the GQA group packed into its rows)",
            "targets (issue 10): >= 80% of copy bandwidth at 64 x 4k and 1 x 32k; >= 3x torch",
            "command: `python benchmarks/bench_decode.py` (flashinfer_benchmark.py routine "
            "BatchDecodeWithPagedKVCacheWrapper, backends fa2, torch and fa2_tc)",
        ],
        [
            "batch",
            "kv_len",
            "flashinfer us",
            "KV GB/s",
            "of copy BW",
            "torch us",
            "speedup",
            "tensor cores us",
            "tensor cores of copy BW",
        ],
        "rrrrrrrrr",
        [row(batch, kv_len, copy_gbs) for batch, kv_len in shapes],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
