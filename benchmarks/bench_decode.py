"""Decode attention benchmark (GPU): BatchDecodeWithPagedKVCacheWrapper.run for batch
{1, 16, 64, 256} x kv_len {512, 4k, 32k}, head_dim 128, 32 query / 8 KV heads, page 16,
bf16. Reports the achieved KV-read bandwidth as a fraction of the device copy bandwidth
measured in the same run, and the speedup over torch (gather the pages, then
scaled_dot_product_attention with GQA). Each case is checked against torch first.
Results go to benchmarks/results/decode.md. Without a GPU it says so and exits 0.
Usage: python benchmarks/bench_decode.py [--output FILE] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch  # noqa: E402

from report import write_report  # noqa: E402

QO_HEADS, KV_HEADS, HEAD_DIM, PAGE, DTYPE = 32, 8, 128, 16, torch.bfloat16
BATCHES = (1, 16, 64, 256)
KV_LENS = (512, 4096, 32768)


def make_case(batch: int, kv_len: int):  # noqa: ANN201
    pages_per = (kv_len + PAGE - 1) // PAGE
    num_pages = batch * pages_per
    k_cache = torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    v_cache = torch.randn_like(k_cache)
    indices = torch.randperm(num_pages, device="cuda").to(torch.int32)
    indptr = torch.arange(0, num_pages + 1, pages_per, dtype=torch.int32)
    last = torch.full((batch,), kv_len - (pages_per - 1) * PAGE, dtype=torch.int32)
    q = torch.randn(batch, QO_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    return q, k_cache, v_cache, indices, indptr, last


def torch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 indices: torch.Tensor, kv_len: int) -> torch.Tensor:
    """What a torch implementation must do with a paged cache: gather, then attend."""
    batch = q.shape[0]
    pages = indices.long().view(batch, -1)
    k = k_cache[pages].reshape(batch, -1, KV_HEADS, HEAD_DIM)[:, :kv_len].transpose(1, 2)
    v = v_cache[pages].reshape(batch, -1, KV_HEADS, HEAD_DIM)[:, :kv_len].transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
    return out[:, :, 0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "decode.md")
    parser.add_argument("--quick", action="store_true", help="batch 64 x 4k and 1 x 32k only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_decode.py: no CUDA GPU visible; nothing to measure")
        return 0
    import flashinfer
    from flashinfer.testing import bench_gpu_time, measure_copy_bandwidth

    copy_gbs = measure_copy_bandwidth()
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    shapes = [(64, 4096), (1, 32768)] if args.quick else [(b, n) for b in BATCHES for n in KV_LENS]
    def measure(batch: int, kv_len: int) -> tuple[str, ...]:
        """One row; the case's tensors are freed when it returns."""
        q, k_cache, v_cache, indices, indptr, last = make_case(batch, kv_len)
        wrapper.plan(indptr, indices, last, QO_HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=DTYPE)
        out = wrapper.run(q, (k_cache, v_cache))
        want = torch_decode(q, k_cache, v_cache, indices, kv_len)
        if not torch.allclose(out.float(), want.float(), atol=2e-2, rtol=2e-2):
            diff = (out.float() - want.float()).abs().max().item()
            raise SystemExit(f"CHECK FAILED at batch {batch} x {kv_len}: max abs diff {diff:.3g}")
        ours_ms = bench_gpu_time(lambda: wrapper.run(q, (k_cache, v_cache), out=out))[0]
        torch_ms = bench_gpu_time(lambda: torch_decode(q, k_cache, v_cache, indices, kv_len),
                                  num_iters=20)[0]
        kv_bytes = 2 * batch * kv_len * KV_HEADS * HEAD_DIM * k_cache.element_size()
        gbs = kv_bytes / (ours_ms * 1e-3) / 1e9
        return (str(batch), str(kv_len), f"{ours_ms * 1e3:.1f}", f"{gbs:.0f}",
                f"{gbs / copy_gbs:.0%}", f"{torch_ms * 1e3:.1f}", f"x{torch_ms / ours_ms:.1f}")

    rows = []
    for batch, kv_len in shapes:
        rows.append(measure(batch, kv_len))
        torch.cuda.empty_cache()

    write_report(
        args.output,
        "Decode attention benchmark (GPU)",
        [
            f"date: {datetime.date.today().isoformat()}",
            f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}",
            f"device copy bandwidth (measure_copy_bandwidth, read + write): {copy_gbs:.0f} GB/s",
            f"{QO_HEADS} query / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, page {PAGE}, bf16, "
            "NHD, pages shuffled; plan() once, then run() timed (median of 100, L2 flushed)",
            "KV GB/s counts the K and V bytes read; torch = page gather + SDPA (enable_gqa)",
            "targets (issue 10): >= 80% of copy bandwidth at 64 x 4k and 1 x 32k; >= 3x torch",
            "command: `python benchmarks/bench_decode.py`",
        ],
        ["batch", "kv_len", "flashinfer us", "KV GB/s", "of copy BW", "torch us", "speedup"],
        "rrrrrrr",
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
