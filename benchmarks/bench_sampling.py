"""Sampling benchmark (GPU): latency per call of top_k_top_p_sampling_from_logits
(top_k=50, top_p=0.9, bf16 logits) for batch {1, 32, 128, 512} x vocab {32k, 128k, 256k},
against the torch pipeline it replaces (softmax, sort, cumsum, mask, multinomial), plus
the other sampling ops at batch 128 x vocab 128k. Every flashinfer row is checked first:
its tokens must lie in the reference top-k/top-p set. Results go to
benchmarks/results/sampling.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_sampling.py [--output FILE] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch  # noqa: E402

from report import write_report  # noqa: E402

TOP_K, TOP_P = 50, 0.9
BATCHES = (1, 32, 128, 512)
VOCABS = (32768, 131072, 262144)


def torch_top_k_top_p(logits: torch.Tensor) -> torch.Tensor:
    """The sort-based pipeline serving stacks use without flashinfer."""
    probs = torch.softmax(logits.float(), dim=-1)
    ranked, order = probs.sort(dim=-1, descending=True)
    ranked[:, TOP_K:] = 0
    exclusive = ranked.cumsum(-1) - ranked
    ranked[exclusive >= TOP_P * ranked.sum(-1, keepdim=True)] = 0
    picked = torch.multinomial(ranked, 1)
    return order.gather(-1, picked).squeeze(-1)


def check(logits: torch.Tensor, tokens: torch.Tensor) -> None:
    from flashinfer.testing import reference

    probs = torch.softmax(logits.double(), dim=-1)
    keep = reference.top_k_set(probs, TOP_K) & reference.top_p_set(probs, TOP_P + 1e-5)
    if not keep.gather(1, tokens.long()[:, None]).all():
        raise SystemExit("CHECK FAILED: a sampled token lies outside the top-k/top-p set")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "sampling.md")
    parser.add_argument("--quick", action="store_true", help="batch 128 x vocab 128k only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_sampling.py: no CUDA GPU visible; nothing to measure")
        return 0
    import flashinfer
    from flashinfer.testing import bench_gpu_time

    def timed(fn) -> float:  # noqa: ANN001
        return bench_gpu_time(fn, num_warmup=5, num_iters=50)[0]

    rows = []
    shapes = [(128, 131072)] if args.quick else [(b, v) for b in BATCHES for v in VOCABS]
    for batch, vocab in shapes:
        logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16) * 3
        ours = flashinfer.top_k_top_p_sampling_from_logits(logits, TOP_K, TOP_P, seed=1)
        check(logits, ours)
        fi_ms = timed(lambda: flashinfer.top_k_top_p_sampling_from_logits(logits, TOP_K, TOP_P))
        torch_ms = timed(lambda: torch_top_k_top_p(logits))
        rows.append(("top_k_top_p_sampling_from_logits", f"{batch} x {vocab // 1024}k",
                     f"{fi_ms * 1e3:.1f}", f"{torch_ms * 1e3:.1f}", f"x{torch_ms / fi_ms:.1f}"))

    logits = torch.randn(128, 131072, device="cuda") * 3
    probs = torch.softmax(logits, dim=-1)
    others = [
        ("softmax", lambda: flashinfer.softmax(logits, 0.8), lambda: torch.softmax(logits / 0.8, -1)),
        ("sampling_from_logits", lambda: flashinfer.sampling_from_logits(logits),
         lambda: torch.multinomial(torch.softmax(logits, -1), 1)),
        ("sampling_from_probs", lambda: flashinfer.sampling_from_probs(probs),
         lambda: torch.multinomial(probs, 1)),
        ("top_p_sampling_from_probs", lambda: flashinfer.top_p_sampling_from_probs(probs, TOP_P),
         None),
        ("top_k_sampling_from_probs", lambda: flashinfer.top_k_sampling_from_probs(probs, TOP_K),
         lambda: torch.multinomial(probs.topk(TOP_K).values, 1)),
        ("min_p_sampling_from_probs", lambda: flashinfer.min_p_sampling_from_probs(probs, 0.1),
         None),
        ("top_p_renorm_probs", lambda: flashinfer.top_p_renorm_probs(probs, TOP_P), None),
        ("top_k_renorm_probs", lambda: flashinfer.top_k_renorm_probs(probs, TOP_K), None),
        ("top_k_mask_logits", lambda: flashinfer.top_k_mask_logits(logits, TOP_K), None),
    ]
    for name, ours_fn, torch_fn in others:
        fi_ms = timed(ours_fn)
        torch_ms = timed(torch_fn) if torch_fn else None
        rows.append((name, "128 x 128k fp32", f"{fi_ms * 1e3:.1f}",
                     "-" if torch_ms is None else f"{torch_ms * 1e3:.1f}",
                     "-" if torch_ms is None else f"x{torch_ms / fi_ms:.1f}"))

    write_report(
        args.output,
        "Sampling benchmark (GPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
            "median of 50 CUDA-event-timed calls, L2 flushed before each "
            "(flashinfer.testing.bench_gpu_time); top_k=50, top_p=0.9",
            "torch pipeline: softmax, sort, top-k/top-p masks via cumsum, multinomial; the "
            "simpler ops are compared with their nearest torch call where one exists",
            "target (issue 9): >= 5x the torch pipeline at batch 128 x vocab 128k",
            "command: `python benchmarks/bench_sampling.py`",
        ],
        ["op", "batch x vocab", "flashinfer us", "torch us", "speedup"],
        "llrrr",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
