"""Decode attention benchmark (GPU): BatchDecodeWithPagedKVCacheWrapper.run for batch
{1, 16, 64, 256} x kv_len {512, 4k, 32k}, head_dim 128, 32 query / 8 KV heads, page 16,
bf16. Reports the achieved KV-read bandwidth as a fraction of the device copy bandwidth
measured in the same run (also with use_tensor_cores=True), and the speedup over torch
(gather the pages, then scaled_dot_product_attention with GQA). Each case is checked against
float64 torch first. Results go to benchmarks/results/decode.md. ``--kv_dtype float8_e4m3fn``
(or float8_e5m2) runs the same over an fp8 cache (the CUDA-core kernel; torch dequantizes
inside its timed call) into decode_<kv_dtype>.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_decode.py [--output FILE] [--quick] [--kv_dtype DTYPE]
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from gpu_script import (
    RESULTS,
    copy_bandwidth,
    device_facts,
    failed,
    guarded,
    measure,
    script_args,
    timing_fact,
)
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


def row(batch: int, kv_len: int, copy_gbs: float, kv_dtype: str) -> tuple[str, ...]:
    fp8 = kv_dtype != "bfloat16"
    backends = ("fa2", "torch") if fp8 else ("fa2", "torch", "fa2_tc")
    result = measure(
        "BatchDecodeWithPagedKVCacheWrapper",
        ["--batch_size", str(batch), "--s_kv", str(kv_len), *SHAPE_FLAGS, "--kv_dtype", kv_dtype],
        backends=backends,
    )
    ours_ms, torch_ms = result["fa2"]["median_time"], result["torch"]["median_time"]
    kv_bytes = 2 * batch * kv_len * KV_HEADS * HEAD_DIM * (1 if fp8 else 2)  # K and V
    gbs = kv_bytes / (ours_ms * 1e-3) / 1e9
    cells = (
        str(batch),
        str(kv_len),
        f"{ours_ms * 1e3:.1f}",
        f"{gbs:.0f}",
        f"{gbs / copy_gbs:.0%}",
        f"{torch_ms * 1e3:.1f}",
        f"x{torch_ms / ours_ms:.1f}",
    )
    if fp8:
        return cells
    tc_ms = result["fa2_tc"]["median_time"]
    tc_gbs = kv_bytes / (tc_ms * 1e-3) / 1e9
    return (*cells, f"{tc_ms * 1e3:.1f}", f"{tc_gbs / copy_gbs:.0%}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kv_dtype",
        choices=("bfloat16", "float8_e4m3fn", "float8_e5m2"),
        default="bfloat16",
        help="the KV cache's dtype (q and the output stay bf16)",
    )
    args = script_args(
        "bench_decode.py",
        None,
        quick_help="batch 64 x 4k and 1 x 32k only",
        argv=argv,
        parser=parser,
    )
    if args is None:
        return 0
    fp8 = args.kv_dtype != "bfloat16"
    output = args.output or RESULTS / ("decode.md" if not fp8 else f"decode_{args.kv_dtype}.md")
    copy_gbs = copy_bandwidth()
    shapes = [(64, 4096), (1, 32768)] if args.quick else [(b, n) for b in BATCHES for n in KV_LENS]
    header = ["batch", "kv_len", "flashinfer us", "KV GB/s", "of copy BW", "torch us", "speedup"]
    if not fp8:
        header += ["tensor cores us", "tensor cores of copy BW"]
    table = [
        guarded(
            (str(batch), str(kv_len)),
            len(header),
            lambda: row(batch, kv_len, copy_gbs, args.kv_dtype),
        )
        for batch, kv_len in shapes
    ]
    write_report(
        output,
        "Decode attention benchmark (GPU)" + (f", {args.kv_dtype} KV cache" if fp8 else ""),
        [
            *device_facts(),
            f"device copy bandwidth (measure_copy_bandwidth, read + write): {copy_gbs:.0f} GB/s",
            f"{QO_HEADS} query / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, page {PAGE}, bf16 q, "
            f"{args.kv_dtype} KV, NHD, pages shuffled; plan() once, then run() timed "
            f"({timing_fact(100)})",
            "KV GB/s counts the K and V bytes read; torch = page gather + SDPA (enable_gqa, "
            "torch's kernel choice), both inside the timed call"
            + (", after dequantizing the gathered fp8 pages to bf16" if fp8 else ""),
            "tensor cores = the same wrapper with use_tensor_cores=True (the prefill kernel, "
            "the GQA group packed into its rows)"
            if not fp8
            else "tensor cores: not run (the wrapper runs an fp8 cache on the CUDA-core kernel)",
            "targets (issue 10): >= 80% of copy bandwidth at 64 x 4k and 1 x 32k; >= 3x torch",
            f"command: `python benchmarks/bench_decode.py --kv_dtype {args.kv_dtype}` "
            "(flashinfer_benchmark.py routine BatchDecodeWithPagedKVCacheWrapper)",
        ],
        header,
        "r" * len(header),
        table,
    )
    return 1 if failed(table) else 0


if __name__ == "__main__":
    sys.exit(main())
