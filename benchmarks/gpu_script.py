"""What the GPU benchmark scripts share: their flags (--output, --quick), the exit when no
GPU is visible, the facts every results table opens with, and timing routines through
flashinfer_benchmark (refcheck first, then CUDA events, eager calls, L2 flushed), and the
guard that turns a case that raises into an error row."""

from __future__ import annotations

import argparse
import datetime
import sys
import traceback
from pathlib import Path
from typing import Callable, Sequence

import flashinfer_benchmark
import torch

RESULTS = Path(__file__).resolve().parent / "results"


def script_args(
    script: str,
    results_file: str | None,
    description: str = "",
    quick_help: str | None = None,
    argv: Sequence[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace | None:
    """The arguments of ``parser`` (default: a new one with ``description``) plus --output
    (default ``results/<results_file>``) and, given ``quick_help``, --quick; None (after
    saying so) when no GPU is visible."""
    parser = parser or argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--output",
        type=Path,
        default=None if results_file is None else RESULTS / results_file,
        help="the results table (markdown)",
    )
    if quick_help:
        parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU visible; nothing to measure")
        return None
    return args


def device_facts() -> list[str]:
    """The date and device lines of a results table."""
    return [
        f"date: {datetime.date.today().isoformat()}",
        f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
    ]


def timing_fact(num_iters: int) -> str:
    return (
        f"median of {num_iters} CUDA-event-timed calls, L2 flushed before each "
        "(flashinfer.testing.bench_gpu_time)"
    )


def measure(
    routine: str,
    flags: Sequence[str],
    backends: Sequence[str] = ("fa2", "torch"),
    num_iters: int = 100,
    num_warmup: int = 10,
) -> dict[str, dict[str, object]]:
    """Backend -> the flashinfer_benchmark result row of ``routine`` run with ``flags``:
    refchecked, then timed with CUDA events (eager calls, L2 flushed)."""
    args = flashinfer_benchmark.parse_args(
        [
            "--routine",
            routine,
            "--backends",
            *backends,
            "--refcheck",
            "--use_cuda_events",
            "--num_iters",
            str(num_iters),
            "--dry_run_iters",
            str(num_warmup),
            *flags,
        ]
    )
    device = torch.device("cuda", torch.cuda.current_device())
    rows = flashinfer_benchmark.run_routine(args, device)
    torch.cuda.empty_cache()
    return {str(row["backend"]): row for row in rows}


def copy_bandwidth() -> float:
    """GB/s of a device copy (the one the result rows' copy_bw_fraction divides by)."""
    return flashinfer_benchmark.copy_bandwidth(torch.device("cuda", torch.cuda.current_device()))


ERROR_PREFIX = "error: "


def guarded(
    cells: Sequence[str], width: int, make: Callable[[], tuple[str, ...]]
) -> tuple[str, ...]:
    """``make()``'s row of ``width`` cells or, when it raises (a refcheck, an out-of-memory
    error, a backend that declines), the case's leading ``cells``, the error, and "-" for
    the rest, with the traceback's last frames on stderr: a failing case costs its row, not
    the table (a lent GPU's minutes may not run the command again)."""
    try:
        return make()
    except Exception as err:  # noqa: BLE001 - any failure of one case is reported in its row
        traceback.print_exc(limit=-3, file=sys.stderr)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        message = str(err).splitlines()[0][:80] if str(err) else ""
        error = f"{ERROR_PREFIX}{type(err).__name__}: {message}".replace("|", "/")
        return (*cells, error, *["-"] * (width - len(cells) - 1))


def failed(rows: Sequence[Sequence[str]]) -> int:
    """How many rows are guarded() error rows; a script exits 1 when any is."""
    return sum(any(cell.startswith(ERROR_PREFIX) for cell in row) for row in rows)
