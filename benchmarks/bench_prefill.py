"""Prefill attention benchmark (GPU): (a) single_prefill_with_kv_cache over 8192 tokens and (b)
BatchPrefillWithPagedKVCacheWrapper over 16 requests x 2048 tokens, page 16; both causal, 32
query / 8 KV heads, head_dim 128 (--head_dim), bf16. Each case is checked against a float64
torch reference first, then timed next to torch's flash SDPA on the same data in the same run.
Reports TFLOP/s (a causal mask counts the visible pairs only), the ratio to torch and the share
of the device's dense bf16 tensor-core peak. Results go to benchmarks/results/prefill.md;
``--kv_dtype float8_e4m3fn`` (or e5m2) measures an fp8 KV cache (torch dequantizes it inside its
timed call) into prefill_<kv_dtype>.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_prefill.py [--output FILE] [--probe] [--head_dim D] [--kv_dtype
DTYPE] [--tilings all|m2kv32,m1kv64c2,...|fastest:FILE]. --probe adds rows that tell the batch
case's costs apart: the same batch over ragged (contiguous) K/V, and over pages of 1 and of 64
tokens. --tilings runs every case once per kernel tiling (docs/attention.md), in this process,
and names the fastest (the best geometric mean of the single and batch paged speedups);
fastest:FILE runs the one an earlier --tilings table FILE named, so one device command can
measure every tiling and then record the winner. Without --tilings the tiling is
FLASHINFER_PREFILL_TILING's or the default.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from gpu_script import (
    RESULTS,
    device_facts,
    failed,
    guarded,
    measure,
    script_args,
    timing_fact,
)
from report import write_report

from flashinfer.jit.prefill import (
    DEFAULT_TILINGS,
    HEAD_DIMS,
    PrefillTiling,
    accepted_tilings,
    gen_prefill_module,
    prefill_tiling,
)

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


def shape_flags(head_dim: int, kv_dtype: str = "bfloat16") -> list[str]:
    return [
        "--num_qo_heads",
        "32",
        "--num_kv_heads",
        "8",
        "--head_dim_qk",
        str(head_dim),
        "--q_dtype",
        "bfloat16",
        "--kv_dtype",
        kv_dtype,
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


HEADER = (
    "tiling",
    "routine",
    "case",
    "flashinfer us",
    "TFLOP/s",
    "of peak",
    "torch us",
    "torch TFLOP/s",
    "speedup",
)


def row(
    tiling: str,
    routine: str,
    flags: Sequence[str],
    head_dim: int,
    peak: float | None,
    kv_dtype: str = "bfloat16",
) -> tuple[str, ...]:
    all_flags = [*flags, *shape_flags(head_dim, kv_dtype)]
    result = measure(routine, all_flags, backends=("fa2", "flash"))
    ours, theirs = result["fa2"], result["flash"]
    ours_ms, torch_ms = ours["median_time"], theirs["median_time"]
    return (
        tiling,
        routine,
        str(ours["case"]),
        f"{ours_ms * 1e3:.0f}",
        f"{ours['tflops']:.0f}",
        f"{ours['tflops'] / peak:.0%}" if peak else "n/a",
        f"{torch_ms * 1e3:.0f}",
        f"{theirs['tflops']:.0f}",
        f"x{torch_ms / ours_ms:.2f}",
    )


FASTEST_FACT = "fastest tiling (geometric mean of the single and batch paged speedups)"


def fastest(table: Sequence[tuple[str, ...]], cases_per_tiling: int) -> tuple[str, float] | None:
    """The tiling whose target cases (CASES, the first rows of each tiling's run) have the best
    geometric mean speedup over torch, and that mean; a tiling with a failed target case is
    out (None when every one is)."""
    means = {}
    for first in range(0, len(table), cases_per_tiling):
        targets = table[first : first + len(CASES)]
        if failed(targets):
            continue
        speedups = [float(r[-1].removeprefix("x")) for r in targets]
        means[targets[0][0]] = math.prod(speedups) ** (1 / len(speedups))
    if not means:
        return None
    name = max(means, key=means.__getitem__)
    return name, means[name]


def recorded_fastest(path: Path, head_dim: int) -> str:
    """The tiling an earlier --tilings table at ``path`` (for ``head_dim``) named fastest."""
    try:
        text = path.read_text()
    except OSError as err:
        raise SystemExit(f"--tilings fastest:{path}: {err}") from None
    pattern = rf"^- {re.escape(FASTEST_FACT)}: (\S+) at head_dim (\d+)"
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        raise SystemExit(f"--tilings fastest:{path}: no '{FASTEST_FACT}' line in it")
    if int(match.group(2)) != head_dim:
        raise SystemExit(
            f"--tilings fastest:{path}: it measured head_dim {match.group(2)}, not {head_dim}"
        )
    return match.group(1)


def parse_tilings(spec: str, head_dim: int, fp8: bool = False) -> list[PrefillTiling]:
    """``all`` (every tiling the kernel takes at ``head_dim``, over an fp8 cache with
    ``fp8``), names like m2kv32, m1kv64c2, or ``fastest:FILE`` (the one a --tilings table
    names)."""
    if spec == "all":
        return accepted_tilings(head_dim, fp8)
    if spec.startswith("fastest:"):
        spec = recorded_fastest(Path(spec.removeprefix("fastest:")), head_dim)
    tilings = []
    for name in spec.split(","):
        tiling = PrefillTiling.from_name(name.strip())
        if tiling is None:
            raise SystemExit(f"--tilings: {name!r} is not m<tiles>kv<tokens>[c<ctas>], e.g. m2kv32")
        try:
            tiling.check(head_dim, fp8)
        except ValueError as err:
            raise SystemExit(f"--tilings: {err}") from None
        tilings.append(tiling)
    return tilings


@contextlib.contextmanager
def kernel_tiling(tiling: PrefillTiling) -> Iterator[None]:
    """flashinfer.prefill's API on modules built with ``tiling`` while inside (its module
    cache and its CTAs-per-device cache, which plan() reads, swapped out and restored)."""
    api = importlib.import_module("flashinfer.prefill")
    original = api.get_prefill_module
    built: dict[tuple[Any, int, str, Any, int | None], Any] = {}

    def get_prefill_module(
        dtype: Any,
        head_dim: int,
        pos_encoding: str = "NONE",
        kv_dtype: Any = None,
        head_dim_vo: int | None = None,
    ) -> Any:
        key = (dtype, head_dim, pos_encoding, kv_dtype, head_dim_vo)
        if key not in built:
            spec = gen_prefill_module(dtype, head_dim, tiling, pos_encoding, kv_dtype, head_dim_vo)
            built[key] = spec.build_and_load()
        return built[key]

    api.get_prefill_module = get_prefill_module
    api._max_ctas.cache_clear()
    try:
        yield
    finally:
        api.get_prefill_module = original
        api._max_ctas.cache_clear()


def rows(
    cases: list[tuple[str, list[str]]],
    tilings: list[PrefillTiling] | None,
    head_dim: int,
    peak: float | None,
    kv_dtype: str = "bfloat16",
    measured: Callable[[list[tuple[str, ...]], int], None] = lambda table, tilings: None,
) -> list[tuple[str, ...]]:
    """The table's rows; ``measured(rows so far, tilings done)`` after each tiling."""

    def case_rows(name: str) -> list[tuple[str, ...]]:
        return [
            guarded((name, r), len(HEADER), lambda: row(name, r, flags, head_dim, peak, kv_dtype))
            for r, flags in cases
        ]

    if tilings is None:
        return case_rows(prefill_tiling(head_dim, kv_dtype != "bfloat16").name)
    table: list[tuple[str, ...]] = []
    for done, tiling in enumerate(tilings, 1):
        with kernel_tiling(tiling):
            table += case_rows(tiling.name)
        measured(table, done)
    return table


def command_flags(args: argparse.Namespace) -> str:
    """The flags that chose what was measured, as typed."""
    flags = " --probe" if args.probe else ""
    if args.head_dim != 128:
        flags += f" --head_dim {args.head_dim}"
    if args.kv_dtype != "bfloat16":
        flags += f" --kv_dtype {args.kv_dtype}"
    return flags + (f" --tilings {args.tilings}" if args.tilings else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--probe", action="store_true", help="also the ragged batch and pages of 1 and 64"
    )
    parser.add_argument("--head_dim", type=int, choices=HEAD_DIMS, default=128)
    parser.add_argument(
        "--kv_dtype",
        choices=("bfloat16", "float8_e4m3fn", "float8_e5m2"),
        default="bfloat16",
        help="the KV cache's dtype (q and the output stay bf16)",
    )
    parser.add_argument(
        "--tilings",
        default=None,
        help="'all', comma-separated names such as m1kv64,m2kv32, or fastest:FILE",
    )
    args = script_args("bench_prefill.py", None, argv=argv, parser=parser)
    if args is None:
        return 0
    fp8 = args.kv_dtype != "bfloat16"
    output = args.output or RESULTS / ("prefill.md" if not fp8 else f"prefill_{args.kv_dtype}.md")
    head_dim = args.head_dim
    tilings = None if args.tilings is None else parse_tilings(args.tilings, head_dim, fp8)
    cases = CASES + PROBE_CASES if args.probe else CASES
    peak = dense_bf16_peak(torch.cuda.get_device_name())
    if tilings is None:
        tiling = prefill_tiling(head_dim, fp8)
        source = (
            "the default"
            if tiling == DEFAULT_TILINGS[head_dim]
            else "from FLASHINFER_PREFILL_TILING"
        )
        tiling_note = f"kernel tiling (head_dim {head_dim}): {tiling.name} ({source})"
    else:
        default = DEFAULT_TILINGS[head_dim].name
        tiling_note = f"kernel tilings (head_dim {head_dim}; the default is {default}): --tilings"
    peak_note = (
        f"dense bf16 peak used for the share: {peak:.0f} TFLOP/s (data sheet, by the device name)"
        if peak
        else "no data-sheet peak known for this device: no share"
    )
    kv_note = (
        [f"{args.kv_dtype} KV cache: torch attends to it dequantized to bf16 inside its timed call"]
        if fp8
        else []
    )

    def report(table: list[tuple[str, ...]], done: int | None = None) -> None:
        """Write the table; ``done`` tilings of several: a partial one, so a run cut off
        (a GPU pass's time limit) leaves the tilings it measured."""
        notes = []
        if done is not None and tilings is not None and done < len(tilings):
            notes = [f"partial: {done} of {len(tilings)} tilings measured so far"]
        winner = fastest(table, len(cases)) if tilings is not None and len(tilings) > 1 else None
        if winner is not None:
            notes.append(f"{FASTEST_FACT}: {winner[0]} at head_dim {head_dim}, x{winner[1]:.2f}")
        write_report(
            output,
            "Prefill attention benchmark (GPU)" + (f", {args.kv_dtype} KV cache" if fp8 else ""),
            [
                *device_facts(),
                f"32 query / 8 KV heads, head_dim {head_dim}, bf16, NHD, causal (bottom-right "
                "aligned); batch: 16 requests of 2048 query and 2048 KV tokens over shuffled "
                "pages of 16",
                *kv_note,
                f"each case checked against float64 torch first; then {timing_fact(100)}; "
                "batch: plan() once, run() timed",
                "TFLOP/s counts 4 * qo_heads * head_dim per visible (query, key) pair (causal: "
                "the bottom-right triangle)",
                "torch: scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION) with "
                "enable_gqa=True, on dense [B, H, L, D] views of the same data (batch: the "
                "pages gathered once, before timing)",
                peak_note,
                tiling_note,
                *notes,
                f"command: `python benchmarks/bench_prefill.py{command_flags(args)}` "
                "(flashinfer_benchmark.py routines, backends fa2 and flash)",
            ],
            list(HEADER),
            "lllrrrrrr",
            table,
            echo=done is None,
        )

    table = rows(cases, tilings, head_dim, peak, args.kv_dtype, measured=report)
    report(table)
    return 1 if failed(table) else 0


if __name__ == "__main__":
    sys.exit(main())
