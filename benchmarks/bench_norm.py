"""RMSNorm benchmark (GPU): achieved bandwidth vs a device copy measured in the same run,
and time vs torch.nn.functional.rms_norm. Checks results against torch before timing.

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

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(1, 4096), (128, 4096), (2048, 4096), (8192, 4096), (4096, 8192), (8192, 4097)]
DTYPES = [torch.bfloat16, torch.float16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/norm.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_norm: no CUDA GPU visible; nothing to measure")
        return 0

    import flashinfer
    from flashinfer.testing import bench_gpu_time, measure_copy_bandwidth, reference

    copy_gbs = measure_copy_bandwidth()
    rows = []
    for dtype in DTYPES:
        for tokens, hidden in SHAPES:
            x = torch.randn(tokens, hidden, dtype=dtype, device="cuda")
            w = torch.randn(hidden, dtype=dtype, device="cuda")
            out = torch.empty_like(x)
            flashinfer.rmsnorm(x, w, 1e-6, out=out)
            torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6),
                                       atol=2e-2, rtol=2e-2)
            ours, _ = bench_gpu_time(flashinfer.rmsnorm, (x, w, 1e-6), {"out": out})
            theirs, _ = bench_gpu_time(torch.nn.functional.rms_norm, (x, (hidden,), w, 1e-6))
            nbytes = (2 * x.numel() + w.numel()) * x.element_size()
            gbs = nbytes / (ours * 1e-3) / 1e9
            rows.append((str(dtype).removeprefix("torch."), tokens, hidden, ours * 1e3, gbs,
                         gbs / copy_gbs, theirs / ours))

    write_report(
        args.output,
        "RMSNorm benchmark (GPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
            f"measured device copy bandwidth: {copy_gbs:.0f} GB/s (read + write)",
            "times: flashinfer.testing.bench_gpu_time (median of 100 CUDA-event-timed calls, "
            "L2 flushed before each)",
            "command: `python benchmarks/bench_norm.py`",
        ],
        ["dtype", "tokens", "hidden", "flashinfer us", "GB/s", "of copy BW",
         "speedup vs torch rms_norm"],
        "lrrrrrr",
        [(d, str(t), str(h), f"{us:.1f}", f"{g:.0f}", f"{f:.0%}", f"x{s:.2f}")
         for d, t, h, us, g, f, s in rows],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
