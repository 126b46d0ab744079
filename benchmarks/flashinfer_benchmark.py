"""One benchmark entry point for every kernel family.

    python benchmarks/flashinfer_benchmark.py --routine rmsnorm --batch-size 8192 \
        --hidden-size 4096 --dtype bf16 --refcheck [--output-csv FILE] [-v]

Prints one table row per run: median and std time, achieved GB/s and TFLOP/s where
meaningful, fraction of the device copy bandwidth measured in the same run, and the
speedup over the torch equivalent. --refcheck compares the output with a float64 torch
reference before timing and exits 1 on a mismatch. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routines import ROUTINES  # noqa: E402

COLUMNS = ["routine", "case", "median_ms", "std_ms", "gb_per_s", "tflop_per_s",
           "copy_bw_fraction", "speedup_vs_torch"]


def build_parser(routine: str | None = None) -> argparse.ArgumentParser:
    """The common flags, plus the shape flags of ``routine`` (each routine has its own
    namespace of flags, so families may reuse names such as --batch-size)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routine", required=True, choices=sorted(ROUTINES),
                        help="what to benchmark; --routine NAME --help lists its flags")
    parser.add_argument("--refcheck", action="store_true",
                        help="compare with the float64 torch reference before timing")
    parser.add_argument("--output-csv", type=Path, help="append the results to this CSV file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print progress")
    parser.add_argument("--num-iters", type=int, default=100)
    parser.add_argument("--num-warmup", type=int, default=10)
    parser.add_argument("--use-cuda-graph", action="store_true",
                        help="time graph replays (no launch overhead)")
    parser.add_argument("--no-l2-flush", action="store_true", help="keep the L2 warm")
    parser.add_argument("--enable-cupti", action="store_true", help="time with CUPTI records")
    if routine in ROUTINES:
        entry = ROUTINES[routine]
        entry.add_arguments(parser.add_argument_group(f"{entry.name}: {entry.help}"))
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--routine")
    known, _ = probe.parse_known_args(argv)
    return build_parser(known.routine).parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, object]:
    from flashinfer.testing import bench_gpu_time, measure_copy_bandwidth

    device = torch.device("cuda", torch.cuda.current_device())
    case = ROUTINES[args.routine].make_case(args, device)
    case.run()
    torch.cuda.synchronize()
    if args.refcheck:
        expected = case.reference()
        actual = case.output().double()
        if not torch.allclose(actual, expected, atol=case.atol, rtol=case.rtol):
            diff = (actual - expected).abs().nan_to_num(float("inf")).max().item()
            raise SystemExit(f"REFCHECK FAILED for {args.routine} {case.label}: "
                             f"max abs diff {diff:.4g} (atol {case.atol}, rtol {case.rtol})")
        if args.verbose:
            print(f"refcheck passed: {args.routine} {case.label}")
    options = dict(num_warmup=args.num_warmup, num_iters=args.num_iters,
                   l2_flush=not args.no_l2_flush, use_cuda_graph=args.use_cuda_graph,
                   enable_cupti=args.enable_cupti)
    median, std = bench_gpu_time(case.run, **options)
    torch_median, _ = bench_gpu_time(case.torch_run, **options)
    copy_gbs = measure_copy_bandwidth(device)
    gbs = case.bytes / (median * 1e-3) / 1e9
    return {
        "routine": args.routine,
        "case": case.label,
        "median_ms": median,
        "std_ms": std,
        "gb_per_s": gbs,
        "tflop_per_s": case.flops / (median * 1e-3) / 1e12 if case.flops else None,
        "copy_bw_fraction": gbs / copy_gbs,
        "speedup_vs_torch": torch_median / median,
    }


def sweep(routines: list[str], dtypes: list[str], shapes: list[tuple[int, int]]
          ) -> list[tuple[str, ...]]:
    """Each routine x dtype x (batch, hidden) shape, refchecked then timed: table rows for
    the per-family bench scripts."""
    rows = []
    for routine in routines:
        for dtype in dtypes:
            for batch, hidden in shapes:
                row = run(parse_args(["--routine", routine, "--dtype", dtype, "--batch-size",
                                      str(batch), "--hidden-size", str(hidden), "--refcheck"]))
                rows.append((routine, str(row["case"]), f"{row['median_ms'] * 1e3:.1f}",
                             f"{row['gb_per_s']:.0f}", f"{row['copy_bw_fraction']:.0%}",
                             f"x{row['speedup_vs_torch']:.2f}"))
    return rows


SWEEP_HEADER = ["op", "case", "flashinfer us", "GB/s", "of copy BW", "speedup vs torch eager"]


def family_main(title: str, routines: list[str], dtypes: list[str],
                shapes: list[tuple[int, int]], output: Path, torch_note: str,
                command: str) -> int:
    """A per-family bench script: sweep, then write the results table to ``output``."""
    import datetime

    from report import write_report

    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--output", type=Path, default=output)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"{command}: no CUDA GPU visible; nothing to measure")
        return 0
    write_report(
        args.output,
        title,
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
            "each row: refcheck against float64 torch, then flashinfer.testing.bench_gpu_time "
            "(median of 100 CUDA-event-timed calls, L2 flushed before each); bandwidth as a "
            "fraction of measure_copy_bandwidth() in the same run",
            f"torch equivalents: {torch_note}",
            f"command: `python benchmarks/{command}`",
        ],
        SWEEP_HEADER,
        "llrrrr",
        sweep(routines, dtypes, shapes),
    )
    return 0


def format_row(row: dict[str, object]) -> str:
    def cell(key: str, fmt: str) -> str:
        value = row[key]
        return "-" if value is None else format(value, fmt)

    return (f"{row['routine']:<10} {row['case']:<22} {cell('median_ms', '.4f'):>10} "
            f"{cell('std_ms', '.4f'):>8} {cell('gb_per_s', '.0f'):>8} "
            f"{cell('tflop_per_s', '.1f'):>7} {cell('copy_bw_fraction', '.1%'):>8} "
            f"{cell('speedup_vs_torch', '.2f'):>8}")


HEADER = (f"{'routine':<10} {'case':<22} {'median ms':>10} {'std ms':>8} {'GB/s':>8} "
          f"{'TFLOP/s':>7} {'of copy':>8} {'vs torch':>8}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("flashinfer_benchmark: no CUDA GPU visible; nothing to benchmark")
        return 0
    row = run(args)
    print(f"device: {torch.cuda.get_device_name()}")
    print(HEADER)
    print(format_row(row))
    if args.output_csv:
        new = not args.output_csv.exists()
        with open(args.output_csv, "a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
