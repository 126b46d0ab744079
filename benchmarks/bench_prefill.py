"""Prefill attention benchmark (GPU): (a) single_prefill_with_kv_cache over 8192 tokens and
(b) BatchPrefillWithPagedKVCacheWrapper over 16 requests x 2048 tokens, page 16; both causal,
32 query / 8 KV heads, head_dim 128, bf16. Each case is checked against a float64 torch
reference first, then timed next to torch's flash SDPA on the same data in the same run.
Reports TFLOP/s (a causal mask counts half the FLOPs), the ratio to torch and the share of
the device's dense bf16 tensor-core peak. Results go to benchmarks/results/prefill.md.
Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_prefill.py [--output FILE]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch  # noqa: E402

from report import write_report  # noqa: E402

CASES = [  # (routine, its flags)
    ("single_prefill_with_kv_cache", ["--qo-len", "8192", "--causal"]),
    ("BatchPrefillWithPagedKVCacheWrapper",
     ["--batch-size", "16", "--qo-len", "2048", "--page-size", "16", "--causal"]),
]
SHAPE_FLAGS = ["--num-qo-heads", "32", "--num-kv-heads", "8", "--head-dim", "128",
               "--dtype", "bf16"]

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s; the most
# specific names first, as torch.cuda.get_device_name() spells them.
DENSE_BF16_PEAKS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H800", 989.0),
                    ("H200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0)]


def dense_bf16_peak(device_name: str) -> float | None:
    """The data-sheet dense bf16 peak of this device (None when the name is not known)."""
    return next((peak for key, peak in DENSE_BF16_PEAKS if key in device_name), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "prefill.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_prefill.py: no CUDA GPU visible; nothing to measure")
        return 0
    import flashinfer_benchmark
    from flashinfer.testing import bench_gpu_time
    from routines import ROUTINES

    device = torch.device("cuda", torch.cuda.current_device())
    name = torch.cuda.get_device_name()
    peak = dense_bf16_peak(name)

    def measure(routine: str, flags: list[str]) -> tuple[str, ...]:
        """One row; the case's tensors are freed when it returns."""
        case = ROUTINES[routine].make_case(
            flashinfer_benchmark.parse_args(["--routine", routine, *flags, *SHAPE_FLAGS]), device)
        case.run()
        expected = case.reference()
        actual = case.output().double()
        if not torch.allclose(actual, expected, atol=case.atol, rtol=case.rtol):
            diff = (actual - expected).abs().nan_to_num(float("inf")).max().item()
            raise SystemExit(f"CHECK FAILED for {routine} {case.label}: max abs diff {diff:.3g}")
        del expected, actual
        torch.cuda.empty_cache()
        ours_ms = bench_gpu_time(case.run)[0]
        torch_ms = bench_gpu_time(case.torch_run)[0]
        ours, theirs = (case.flops / (ms * 1e-3) / 1e12 for ms in (ours_ms, torch_ms))
        return (routine, case.label, f"{ours_ms * 1e3:.0f}", f"{ours:.0f}",
                f"{ours / peak:.0%}" if peak else "n/a", f"{torch_ms * 1e3:.0f}", f"{theirs:.0f}",
                f"x{torch_ms / ours_ms:.2f}")

    rows = []
    for routine, flags in CASES:
        rows.append(measure(routine, flags))
        torch.cuda.empty_cache()

    peak_note = (f"dense bf16 peak used for the share: {peak:.0f} TFLOP/s (data sheet, by the "
                 "device name)" if peak else "no data-sheet peak known for this device: no share")
    write_report(
        args.output,
        "Prefill attention benchmark (GPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {name}; torch {torch.__version__}",
            "32 query / 8 KV heads, head_dim 128, bf16, NHD, causal (bottom-right aligned); "
            "batch: 16 requests of 2048 query and 2048 KV tokens over shuffled pages of 16",
            "each case checked against float64 torch first; then median of 100 CUDA-event-timed "
            "calls, L2 flushed before each (flashinfer.testing.bench_gpu_time); batch: plan() "
            "once, run() timed",
            "TFLOP/s counts 4 * qo * kv * qo_heads * head_dim per request, halved for causal",
            "torch: scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION) with "
            "enable_gqa=True, on dense [B, H, L, D] views of the same data (no page gather)",
            peak_note,
            "command: `python benchmarks/bench_prefill.py`",
        ],
        ["routine", "case", "flashinfer us", "TFLOP/s", "of peak", "torch us", "torch TFLOP/s",
         "speedup"],
        "llrrrrrr",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
