"""The benchmark CLI of the reference's developer guide, for this library's kernels.

    python benchmarks/flashinfer_benchmark.py --routine BatchDecodeWithPagedKVCacheWrapper \\
        --backends fa2 cudnn --batch_size 32 --s_kv 2048 --num_qo_heads 32 --num_kv_heads 8 \\
        --head_dim_qk 128 --head_dim_vo 128 --page_size 16 --refcheck -vv \\
        --output_path results.csv
    python benchmarks/flashinfer_benchmark.py --testlist cases.txt --output_path results.csv
    python benchmarks/flashinfer_benchmark.py --routine rmsnorm --help   # a routine's flags

--routine is an API name (see benchmarks/routines/); --backends picks what runs it:
``fa2`` (this library), ``torch`` (the torch eager equivalent) and, for attention, SDPA's
``cudnn`` and ``flash`` kernels. Each backend is called once (--refcheck holds that output
to the float64 reference, or to the routine's validity check, and fails on a mismatch unless
--allow_output_mismatch), then timed with flashinfer.testing.bench_gpu_time: one ``[PERF]``
line each, in the reference's format, and one CSV row each with --output_path. A testlist
holds one command line per line (``#`` comments); they run one after another into one CSV,
a failing line is reported and the rest still run, and the exit status is 1 if any failed.
Without a GPU the command says so (and which lines it skips) and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import functools
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routines import BACKEND_ALIASES, ROUTINES, BackendUnavailable, Case, families  # noqa: E402

PERF_COLUMNS = (
    "routine",
    "median_time",
    "std_time",
    "tflops",
    "tb_per_sec",
    "backend",
    "resolved_backend",
)
GENERAL_COLUMNS = (
    "refcheck",
    "no_cuda_graph",
    "use_cupti",
    "allow_output_mismatch",
    "random_seed",
    "case_tag",
    "generate_repro_command",
    "repro_command",
    "enable_pdl",
)
OUR_COLUMNS = ("case", "copy_bw_fraction")  # the shape as tables show it; of a device copy's


class RefcheckFailed(AssertionError):
    """A backend's output disagrees with the reference (and no --allow_output_mismatch)."""


# -- arguments ---------------------------------------------------------------------------------


def _common_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashinfer_benchmark.py",
        description=__doc__.splitlines()[0],
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    parser.add_argument(
        "--routine",
        "-R",
        choices=sorted(ROUTINES),
        metavar="API",
        help="the API to benchmark (with --help, its flags are listed too): "
        + ", ".join(sorted(ROUTINES)),
    )
    parser.add_argument("--testlist", help="run each line of this file (one CSV)")
    parser.add_argument(
        "--refcheck", action="store_true", help="check every backend's output before timing"
    )
    parser.add_argument(
        "--allow_output_mismatch", action="store_true", help="report a refcheck mismatch and go on"
    )
    parser.add_argument("--random_seed", type=int, default=42)
    parser.add_argument(
        "--verbose", "-v", action="count", default=0, help="-v: progress, -vv: arguments and shapes"
    )
    parser.add_argument("--output_path", "--output-csv", help="write the results as CSV")
    parser.add_argument(
        "--num_iters", "-n", "--num-iters", type=int, default=30, help="timed iterations"
    )
    parser.add_argument(
        "--dry_run_iters", "-d", "--num-warmup", type=int, default=5, help="warm-up iterations"
    )
    parser.add_argument(
        "--no_cuda_graph",
        action="store_true",
        help="time eager calls (the default here; see --use_cuda_graph)",
    )
    parser.add_argument(
        "--use_cuda_graph",
        "--use-cuda-graph",
        action="store_true",
        help="time replays of a CUDA graph of one call",
    )
    parser.add_argument(
        "--use_cupti",
        "--enable-cupti",
        action="store_true",
        help="deprecated: CUPTI is the default timer when importable",
    )
    parser.add_argument(
        "--use_cuda_events", action="store_true", help="time with CUDA events instead of CUPTI"
    )
    parser.add_argument(
        "--no_l2_flush",
        "--no-l2-flush",
        action="store_true",
        help="keep the L2 warm between iterations",
    )
    parser.add_argument("--case_tag", default=None, help="a label for the CSV row")
    parser.add_argument(
        "--generate_repro_command",
        action="store_true",
        help="print (and store in the CSV) the command for this case",
    )
    parser.add_argument("--repro_command", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--enable_pdl",
        action="store_true",
        help="programmatic dependent launch where the API takes enable_pdl (off otherwise)",
    )
    return parser


def build_parser(routine: str | None) -> argparse.ArgumentParser:
    """The common flags, plus the family flags and --backends of ``routine``."""
    parser = _common_parser()
    parser.add_argument("-h", "--help", action="help", help="show this help and exit")
    if routine in ROUTINES:
        entry = ROUTINES[routine]
        group = parser.add_argument_group(f"{entry.name} ({entry.family.name}): {entry.help}")
        group.add_argument(
            "--backends",
            nargs="+",
            default=[entry.backends[0]],
            choices=[*entry.backends, *BACKEND_ALIASES],
            help=f"what runs it (default {entry.backends[0]}; "
            f"{', '.join(BACKEND_ALIASES)}: {entry.backends[0]})",
        )
        entry.family.add_arguments(group)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """One command line (a testlist line) -> its arguments; argparse errors exit 2."""
    argv = list(argv)
    probe = _common_parser()
    known, _ = probe.parse_known_args(argv)
    parser = build_parser(known.routine)
    args = parser.parse_args(argv)
    if args.routine is None:
        parser.error("the following arguments are required: --routine/-R")
    routine = ROUTINES[args.routine]
    args.backends = list(dict.fromkeys(BACKEND_ALIASES.get(b, b) for b in args.backends))
    problem = routine.family.validate(args)
    if problem:
        parser.error(problem)
    if args.use_cupti:
        print("[WARNING] --use_cupti is deprecated: CUPTI is the default timer")
    args.use_cupti = not args.use_cuda_events
    args.use_cuda_graph = args.use_cuda_graph and not args.no_cuda_graph
    args.no_cuda_graph = not args.use_cuda_graph
    if args.generate_repro_command:
        args.repro_command = "python3 flashinfer_benchmark.py " + shlex.join(argv)
    if args.enable_pdl and not routine.pdl:
        print(f"[WARNING] {args.routine} takes no enable_pdl; --enable_pdl is ignored")
    return args


# -- refcheck ----------------------------------------------------------------------------------


def count_mismatches(
    actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float
) -> tuple[int, int]:
    """(elements outside ``atol + rtol * |expected|``, total); NaN never matches."""
    if actual.shape != expected.shape:
        raise ValueError(
            f"output has shape {tuple(actual.shape)}, the reference {tuple(expected.shape)}"
        )
    close = torch.isclose(actual.double(), expected.double(), rtol=rtol, atol=atol)
    return close.numel() - int(close.sum().item()), close.numel()


def refcheck(case: Case, outputs: dict[str, torch.Tensor]) -> list[str]:
    """One message per backend whose output fails: the routine's check where it has one,
    else agreement with the float64 reference (or, without one, the first backend)."""
    problems = []
    if case.check is not None:
        for backend, out in outputs.items():
            bad, total = case.check(out)
            if bad:
                problems.append(
                    f"Backend {backend} fails the routine's check: {bad} / {total} "
                    f"({100 * bad / total:.2f}%) elements are wrong"
                )
        return problems
    if case.reference is not None:
        truth, expected = "reference (float64)", case.reference()
    else:
        truth, expected = next(iter(outputs.items()))
    for backend, out in outputs.items():
        bad, total = count_mismatches(out, expected, case.atol, case.rtol)
        if bad:
            problems.append(
                f"Output tensor mismatch between backends {truth} and {backend}: "
                f"{bad} / {total} ({100 * bad / total:.2f}%) elements are different"
            )
    return problems


# -- running -----------------------------------------------------------------------------------


@functools.cache
def copy_bandwidth(device: torch.device) -> float:
    """GB/s of a device-to-device copy, measured once per process and device."""
    from flashinfer.testing import measure_copy_bandwidth

    return measure_copy_bandwidth(device)


def perf_line(backend: str, median: float, std: float, tflops: float, tb_per_sec: float) -> str:
    """The reference's [PERF] line."""
    return (
        f"[PERF] {backend.ljust(max(15, len(backend)))}:: median time {median:.3f} ms; "
        f"std {std:.3f} ms; achieved tflops {tflops:.3f} TFLOPs/sec; achieved tb_per_sec "
        f"{tb_per_sec:.3f} TB/sec"
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_routine(
    args: argparse.Namespace,
    device: torch.device,
    timer: Any = None,
    bandwidth: Callable[[torch.device], float] = copy_bandwidth,
) -> list[dict[str, Any]]:
    """Build the case, call each backend once (its output kept for --refcheck), time it;
    returns one result row per backend that ran. ``timer`` and ``bandwidth`` replace
    the GPU ones (the tests run routines on CPU tensors)."""
    from flashinfer.testing import bench_gpu_time

    copy_gbs = bandwidth(device)  # before the case's tensors take the memory
    torch.manual_seed(args.random_seed)
    case = ROUTINES[args.routine].make_case(args, device)
    if args.verbose >= 1:
        print(f"[INFO] {args.routine}: {case.label}; backends {', '.join(case.backends)}")
    if args.verbose >= 2:
        print(f"[VVERBOSE] {args = }")
    if args.generate_repro_command:
        print(
            f"[INFO] To reproduce this test case, run the following command: {args.repro_command}"
        )
    outputs: dict[str, torch.Tensor] = {}
    times: dict[str, tuple[float, float]] = {}
    for name, backend in case.backends.items():
        try:
            result = backend.call()  # compiles, plans lazily, and shows what it returns
        except BackendUnavailable as err:
            print(f"[INFO] {name} backend skipped: {err}")
            continue
        _synchronize(device)
        if args.refcheck:
            outputs[name] = backend.output(result).detach().clone()
        times[name] = bench_gpu_time(
            backend.call,
            num_warmup=args.dry_run_iters,
            num_iters=args.num_iters,
            enable_cupti=args.use_cupti,
            l2_flush=not args.no_l2_flush,
            use_cuda_graph=args.use_cuda_graph,
            timer=timer,
        )
    if args.refcheck and outputs:
        problems = refcheck(case, outputs)
        for problem in problems:
            print(f"[ERROR] {problem}")
        if problems and not args.allow_output_mismatch:
            raise RefcheckFailed(f"{args.routine} {case.label}: " + "; ".join(problems))
        if not problems and args.verbose >= 1:
            print(f"[INFO] refcheck passed: {', '.join(outputs)}")
    rows = []
    for name, (median, std) in times.items():
        seconds = median * 1e-3
        tb_per_sec = case.bytes / seconds / 1e12
        tflops = case.flops / seconds / 1e12
        print(perf_line(name, median, std, tflops, tb_per_sec))
        rows.append(
            {
                "routine": args.routine,
                "median_time": median,
                "std_time": std,
                "tflops": tflops,
                "tb_per_sec": tb_per_sec,
                "backend": name,
                "resolved_backend": case.backends[name].resolved or name,
                "case": case.label,
                "copy_bw_fraction": tb_per_sec * 1e3 / copy_gbs,
            }
        )
    return rows


def csv_columns() -> list[str]:
    """The reference's perf columns, every family's flag columns, the general ones, ours."""
    family_columns = [c for family in families() for c in family.columns]
    return list(dict.fromkeys([*PERF_COLUMNS, *family_columns, *GENERAL_COLUMNS, *OUR_COLUMNS]))


def _csv_value(value: Any) -> Any:
    return str(value) if isinstance(value, torch.dtype) else value


def write_rows(path: str, rows: Iterable[dict[str, Any]], args: argparse.Namespace) -> None:
    """Append ``rows`` to the CSV at ``path``; a column a row leaves unset takes the
    argument of that name (or stays empty: another family's flag)."""
    columns = csv_columns()
    with open(path, "a", newline="") as fh:
        writer = csv.writer(fh)
        for row in rows:
            writer.writerow(
                [_csv_value(row[c] if c in row else getattr(args, c, "")) for c in columns]
            )


def start_csv(path: str) -> None:
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerow(csv_columns())


# -- command lines and testlists -------------------------------------------------------------


def read_testlist(path: str) -> list[str]:
    """The command lines of a testlist: one a line, blank lines and ``#`` comments skipped."""
    with open(path) as fh:
        lines = [line.strip() for line in fh]
    return [line for line in lines if line and not line.startswith("#")]


def _parse_line(line: str) -> argparse.Namespace | None:
    """A testlist line's arguments, or None after argparse reported its error."""
    try:
        return parse_args(shlex.split(line))
    except SystemExit:
        print(f"[ERROR] Cannot parse test: {line}")
        return None


def run_cases(
    cases: list[tuple[str, argparse.Namespace]],
    output_path: str | None,
    device: torch.device,
    keep_going: bool,
    **run_options: Any,
) -> int:
    """Run each (command line, arguments) case into one CSV; 1 if any failed. Without
    ``keep_going`` (a single command line) a failure other than a refcheck propagates."""
    if output_path:
        start_csv(output_path)
    failed = 0
    for line, args in cases:
        try:
            rows = run_routine(args, device, **run_options)
        except RefcheckFailed as err:
            print(f"[ERROR] Refcheck failed: {line}\n[ERROR] {err}")
            failed += 1
            continue
        except Exception as err:  # noqa: BLE001 - one failing line must not stop the list
            if not keep_going:
                raise
            print(f"[ERROR] Error running test: {line}\n[ERROR] Error: {err}")
            if args.verbose >= 1:
                traceback.print_exc()
            failed += 1
            continue
        if output_path:
            write_rows(output_path, rows, args)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    options, rest = _common_parser().parse_known_args(argv)
    if options.testlist is not None:
        lines = read_testlist(options.testlist)
        parsed = [(line, _parse_line(line)) for line in lines]
        cases = [(line, args) for line, args in parsed if args is not None]
        bad_lines = len(parsed) - len(cases)
    else:
        cases, bad_lines = [(shlex.join(argv), parse_args(argv))], 0
    if not torch.cuda.is_available():
        print("flashinfer_benchmark: no CUDA GPU visible; nothing to benchmark")
        for line, _ in cases:
            print(f"[SKIPPED] {line}")
        if options.output_path:
            start_csv(options.output_path)
        return 2 if bad_lines else 0
    device = torch.device("cuda", torch.cuda.current_device())
    if any(args.verbose >= 2 for _, args in cases):
        print(f"[VVERBOSE] gpu_name = {torch.cuda.get_device_name(device)!r}")
    status = run_cases(cases, options.output_path, device, keep_going=options.testlist is not None)
    return max(status, 2 if bad_lines else 0)


if __name__ == "__main__":
    sys.exit(main())
