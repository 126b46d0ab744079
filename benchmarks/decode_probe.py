"""Decode timing probe (GPU): where the time of BatchDecodeWithPagedKVCacheWrapper.run goes
for the shapes whose figures in results/decode.md looked wrong (1 x 4096 slower than
1 x 32768). For each shape and split (``fixed_split_size`` in pages, the planner's own
choice, or ``disable_split_kv``) it prints the plan and four timings side by side:

- events: bench_gpu_time as the decode table times it (CUDA events, L2 flushed);
- graph: the same with the call replayed from a CUDA graph (no host work inside);
- no flush: events without the L2 flush (no dirty flush lines to write back first);
- decode / merge / span: the kernels' own device times from torch.profiler, L2 flushed
  before each call (span: decode start to merge end, the gap between them included).

Events far above graph point at the host or the timer; graph far above span at the launch;
span far above decode + merge at the gap between the kernels; decode itself high at the
kernel. Every output is first checked against float64 torch (rel err: the largest error over
the largest reference value); the script exits 1 if any is off. Without a GPU it says so and
exits 0. Usage: python benchmarks/decode_probe.py [--output FILE] [--iters N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from typing import Callable, Sequence

import torch
from gpu_script import device_facts, script_args
from report import write_report

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
SHAPES = ((1, 4096), (16, 4096), (1, 32768), (16, 512))  # 16 x 512: 1 x 4096's chunk shape
SPLITS: tuple[int | str | None, ...] = (None, 4, 8, 16, 32, 64, 256, "off")
KERNELS = ("DecodeKernel", "MergeChunksKernel")
MAX_REL_ERR = 1e-2  # bf16 output of a float32 softmax


def paged_inputs(batch: int, kv_len: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The decode table's data: shuffled pages of a combined NHD cache. q is scaled up so
    the softmax is peaked and a chunk left out changes the output well beyond rounding."""
    pages = -(-kv_len // PAGE)
    page_ids = torch.randperm(batch * pages, device=device).view(batch, pages)
    cache = torch.randn(
        batch * pages, 2, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device
    )
    return {
        "q": 4 * torch.randn(batch, QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device),
        "cache": cache,
        "page_ids": page_ids,
        "indptr": torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32, device=device),
        "indices": page_ids.reshape(-1).to(torch.int32),
        "last": torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32, device=device),
    }


def reference(data: dict[str, torch.Tensor], kv_len: int) -> torch.Tensor:
    """float64 attention of each request's query over its pages."""
    q = data["q"]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        kv = data["cache"][data["page_ids"][b]].double()
        k, v = (kv[:, i].reshape(-1, KV_HEADS, HEAD_DIM)[:kv_len] for i in (0, 1))
        rows = q[b].double().view(KV_HEADS, -1, HEAD_DIM)
        probs = (torch.einsum("hgd,khd->hgk", rows, k) / math.sqrt(HEAD_DIM)).softmax(-1)
        out[b] = torch.einsum("hgk,khd->hgd", probs, v).reshape(QO_HEADS, HEAD_DIM)
    return out


def kernel_times(
    run: Callable[[], object], flush: Callable[[], object], iters: int
) -> tuple[float, float, float]:
    """Median device us of the decode kernel, the merge kernel (0 without one) and the span
    from decode start to the last kernel's end, over ``iters`` calls each after ``flush``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush()
            run()
        torch.cuda.synchronize()
    found = {name: [] for name in KERNELS}
    for event in prof.events():
        name = next((k for k in KERNELS if k in event.name), None)
        if name and event.device_type == DeviceType.CUDA:
            found[name].append(event.time_range)
    if not found["DecodeKernel"]:
        raise RuntimeError("torch.profiler recorded no DecodeKernel launch")
    decode, merge = (sorted(found[k], key=lambda r: r.start) for k in KERNELS)
    spans = [last.end - first.start for first, last in zip(decode, merge or decode)]
    return (
        statistics.median(r.elapsed_us() for r in decode),
        statistics.median(r.elapsed_us() for r in merge) if merge else 0.0,
        statistics.median(spans),
    )


def probe(batch: int, kv_len: int, iters: int, max_ctas: int) -> tuple[list[list[str]], bool]:
    """The table rows of one shape, and whether every split's output matched."""
    from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
    from flashinfer.testing import bench_gpu_time
    from flashinfer.testing.timing import _l2_flush_buffer

    device = torch.device("cuda", torch.cuda.current_device())
    data = paged_inputs(batch, kv_len, device)
    expected = reference(data, kv_len)
    flush = _l2_flush_buffer(device.index).zero_
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    out = torch.empty_like(data["q"])

    def run() -> torch.Tensor:
        return wrapper.run(data["q"], data["cache"], out=out, enable_pdl=False)

    rows, all_ok = [], True
    for split in SPLITS:
        wrapper.plan(
            data["indptr"],
            data["indices"],
            data["last"],
            QO_HEADS,
            KV_HEADS,
            HEAD_DIM,
            PAGE,
            q_data_type=torch.bfloat16,
            fixed_split_size=split if isinstance(split, int) else None,
            disable_split_kv=split == "off",
        )
        run()
        torch.cuda.synchronize()
        rel = ((out.double() - expected).abs().max() / expected.abs().max()).item()
        all_ok &= rel <= MAX_REL_ERR
        plan = wrapper._plan_info.schedule
        ctas = plan.num_work * KV_HEADS
        fan_in = max((b - a for a, b in zip(plan.merge_indptr, plan.merge_indptr[1:])), default=1)
        timed = [
            bench_gpu_time(run, num_iters=iters, **options)[0] * 1e3
            for options in ({}, {"use_cuda_graph": True}, {"l2_flush": False})
        ]
        kernels = kernel_times(run, flush, iters)
        rows.append(
            [
                f"{batch} x {kv_len}",
                "auto" if split is None else str(split),
                str(plan.chunk_size or "-"),
                str(ctas),
                f"{ctas / max_ctas:.2f}",
                str(fan_in),
                *(f"{t:.1f}" for t in (*timed, *kernels)),
                f"{rel:.1e}" + ("" if rel <= MAX_REL_ERR else " BAD"),
            ]
        )
    return rows, all_ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50, help="timed calls per figure")
    args = script_args("decode_probe.py", "decode_probe.md", argv=argv, parser=parser)
    if args is None:
        return 0
    from flashinfer.decode import _max_ctas

    device = torch.device("cuda", torch.cuda.current_device())
    # plan()'s own arguments for this cache (no position encoding, a bf16 cache)
    group, bf16 = QO_HEADS // KV_HEADS, torch.bfloat16
    max_ctas = _max_ctas(bf16, HEAD_DIM, group, device, "NONE", bf16)
    torch.manual_seed(0)
    rows, ok = [], True
    for batch, kv_len in SHAPES:
        shape_rows, shape_ok = probe(batch, kv_len, args.iters, max_ctas)
        rows += shape_rows
        ok &= shape_ok
    write_report(
        args.output,
        "Decode timing probe (GPU)",
        [
            *device_facts(),
            f"{QO_HEADS} query / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, page {PAGE}, bf16, "
            f"NHD, pages shuffled; CTAs the device holds at once: {max_ctas}",
            "split: fixed_split_size in pages, auto (the planner), off (disable_split_kv); "
            "chunk in tokens; waves = CTAs / CTAs held at once; fan-in: chunks merged per head",
            f"medians of {args.iters} calls, us: events, graph and no flush from "
            "bench_gpu_time; decode, merge and span from torch.profiler (L2 flushed)",
        ],
        [
            "shape",
            "split",
            "chunk",
            "CTAs",
            "waves",
            "fan-in",
            "events",
            "graph",
            "no flush",
            "decode",
            "merge",
            "span",
            "rel err",
        ],
        "llrrrrrrrrrrr",
        rows,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
