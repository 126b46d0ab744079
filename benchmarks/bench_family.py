"""Per-family kernel benchmarks (GPU): each routine of the family over several shapes and
dtypes, checked against its float64 reference, then timed next to its torch eager
equivalent; bandwidth as a fraction of a device copy measured in the same run. Results go
to benchmarks/results/<family>.md. Without a GPU it says so and exits 0.

Usage: python benchmarks/bench_family.py {norm,activation,rope,page} [--output FILE] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from gpu_script import RESULTS, device_facts, failed, guarded, measure, script_args
from report import write_report


@dataclass(frozen=True)
class Sweep:
    title: str
    routines: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]
    flags: Callable[[int, int], list[str]]  # a shape -> the family's flags
    torch_note: str


def _rows_by_width(rows: int, width: int) -> list[str]:
    return ["--batch_size", str(rows), "--hidden_size", str(width)]


def _tokens_by_head_dim(tokens: int, head_dim: int) -> list[str]:
    return ["--batch_size", "1", "--seq_len", str(tokens), "--head_dim", str(head_dim)]


SWEEPS = {
    "norm": Sweep(
        "Norm family benchmark (GPU)",
        ("rmsnorm", "rmsnorm_quant", "fused_add_rmsnorm", "layernorm"),
        ((1, 4096), (128, 4096), (2048, 4096), (8192, 4096), (4096, 8192), (8192, 4097)),
        lambda rows, width: [*_rows_by_width(rows, width), "--scale", "0.0625"],
        "rms_norm; rms_norm + fp8 cast; residual add + rms_norm; layer_norm",
    ),
    "activation": Sweep(
        "Gated activation benchmark (GPU)",
        ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
        ((1, 14336), (16, 14336), (2048, 11008), (8192, 14336), (8192, 4097)),
        _rows_by_width,
        "act(x[..., :d]) * x[..., d:] in eager mode",
    ),
    "rope": Sweep(
        "RoPE benchmark (GPU)",
        ("apply_rope_pos_ids",),
        ((1, 128), (64, 128), (2048, 128), (8192, 128), (8192, 256)),
        _tokens_by_head_dim,
        "q * cos + rotate_half(q) * sin on q [nnz, 32, d] and k [nnz, 8, d], positions 0 .. nnz-1",
    ),
    "page": Sweep(
        "Paged KV append benchmark (GPU)",
        ("append_paged_kv_cache",),
        ((1, 128), (64, 128), (2048, 128), (16384, 128), (16384, 256)),
        _tokens_by_head_dim,
        "k_cache[page, slot] = key; v_cache[page, slot] = value (advanced indexing)",
    ),
}
DTYPES = ("bfloat16", "float16")
HEADER = ["op", "case", "flashinfer us", "GB/s", "of copy BW", "speedup vs torch eager"]


def sweep_rows(sweep: Sweep, quick: bool) -> list[tuple[str, ...]]:
    """Each routine x dtype x shape (quick: bf16 at the middle shape), one table row each."""
    dtypes = DTYPES[:1] if quick else DTYPES
    shapes = sweep.shapes[len(sweep.shapes) // 2 :][:1] if quick else sweep.shapes

    def row(routine: str, dtype: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        result = measure(routine, [*sweep.flags(*shape), "--input_dtype", dtype])
        ours, theirs = result["fa2"], result["torch"]
        return (
            routine,
            str(ours["case"]),
            f"{ours['median_time'] * 1e3:.1f}",
            f"{ours['tb_per_sec'] * 1e3:.0f}",
            f"{ours['copy_bw_fraction']:.0%}",
            f"x{theirs['median_time'] / ours['median_time']:.2f}",
        )

    return [
        guarded((routine, f"{shape} {dtype}"), len(HEADER), lambda: row(routine, dtype, shape))
        for routine in sweep.routines
        for dtype in dtypes
        for shape in shapes
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(SWEEPS))
    args = script_args(
        "bench_family.py",
        None,
        quick_help="bf16 at one shape per routine",
        argv=argv,
        parser=parser,
    )
    if args is None:
        return 0
    sweep = SWEEPS[args.family]
    table = sweep_rows(sweep, args.quick)
    write_report(
        args.output or RESULTS / f"{args.family}.md",
        sweep.title,
        [
            *device_facts(),
            "each row: refcheck against float64 torch, then flashinfer.testing.bench_gpu_time "
            "(median of 100 CUDA-event-timed calls, L2 flushed before each); bandwidth as a "
            "fraction of measure_copy_bandwidth() in the same run",
            f"torch equivalents: {sweep.torch_note}",
            f"command: `python benchmarks/bench_family.py {args.family}`",
        ],
        HEADER,
        "llrrrr",
        table,
    )
    return 1 if failed(table) else 0


if __name__ == "__main__":
    sys.exit(main())
