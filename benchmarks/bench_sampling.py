"""Sampling benchmark (GPU): latency per call of top_k_top_p_sampling_from_logits
(top_k=50, top_p=0.9, bf16 logits) for batch {1, 32, 128, 512} x vocab {32k, 128k, 256k},
against the torch pipeline it replaces (softmax, sort, cumsum, mask, multinomial), plus
the other sampling ops at batch 128 x vocab 128k against their torch eager equivalents.
Every row is checked first: sampled tokens must lie in the reference filter set, renorm
and mask outputs must keep exactly the right tokens. Results go to
benchmarks/results/sampling.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_sampling.py [--output FILE] [--quick]
"""

from __future__ import annotations

import sys
from typing import Sequence

from gpu_script import device_facts, failed, guarded, measure, script_args, timing_fact
from report import write_report

TOP_K, TOP_P = 50, 0.9
BATCHES = (1, 32, 128, 512)
VOCABS = (32768, 131072, 262144)
OTHERS = [
    ("softmax", ["--temperature", "0.8"]),
    ("sampling_from_logits", []),
    ("sampling_from_probs", []),
    ("top_p_sampling_from_probs", []),
    ("top_k_sampling_from_probs", []),
    ("min_p_sampling_from_probs", []),
    ("top_p_renorm_probs", []),
    ("top_k_renorm_probs", []),
    ("top_k_mask_logits", []),
]
NUM_ITERS = 50


def row(
    routine: str, batch: int, vocab: int, dtype: str, label: str, flags: Sequence[str] = ()
) -> tuple[str, ...]:
    result = measure(
        routine,
        [
            "--batch_size",
            str(batch),
            "--vocab_size",
            str(vocab),
            "--input_dtype",
            dtype,
            "--logits_scale",
            "3",
            "--top_k",
            str(TOP_K),
            "--top_p",
            str(TOP_P),
            *flags,
        ],
        num_iters=NUM_ITERS,
        num_warmup=5,
    )
    ours_ms, torch_ms = result["fa2"]["median_time"], result["torch"]["median_time"]
    return (
        routine,
        label,
        f"{ours_ms * 1e3:.1f}",
        f"{torch_ms * 1e3:.1f}",
        f"x{torch_ms / ours_ms:.1f}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = script_args(
        "bench_sampling.py",
        "sampling.md",
        __doc__.splitlines()[0],
        quick_help="batch 128 x vocab 128k only",
        argv=argv,
    )
    if args is None:
        return 0
    shapes = [(128, 131072)] if args.quick else [(b, v) for b in BATCHES for v in VOCABS]
    header = ["op", "batch x vocab", "flashinfer us", "torch us", "speedup"]
    joint = "top_k_top_p_sampling_from_logits"
    rows = [
        guarded(
            (joint, f"{batch} x {vocab // 1024}k"),
            len(header),
            lambda: row(joint, batch, vocab, "bfloat16", f"{batch} x {vocab // 1024}k"),
        )
        for batch, vocab in shapes
    ]
    rows += [
        guarded(
            (name, "128 x 128k fp32"),
            len(header),
            lambda: row(name, 128, 131072, "float32", "128 x 128k fp32", flags),
        )
        for name, flags in OTHERS
    ]
    write_report(
        args.output,
        "Sampling benchmark (GPU)",
        [
            *device_facts(),
            f"{timing_fact(NUM_ITERS)}; top_k={TOP_K}, top_p={TOP_P}; logits randn * 3, "
            "probabilities their softmax",
            "torch pipeline: softmax, sort, top-k/top-p masks via cumsum, multinomial; every "
            "other op against its torch eager equivalent (benchmarks/routines/sampling.py)",
            "target (issue 9): >= 5x the torch pipeline at batch 128 x vocab 128k",
            "command: `python benchmarks/bench_sampling.py` (flashinfer_benchmark.py routines, "
            "backends fa2 and torch)",
        ],
        header,
        "llrrr",
        rows,
    )
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
