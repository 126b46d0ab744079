"""The two prefill cases of bench_prefill.py (single causal 8192 tokens; 16 x 2048 causal over
shuffled pages of 16; 32 query / 8 KV heads, head_dim 128, bf16), each run twice, for a
profiler: `ncu --kernel-name regex:PrefillKernel --launch-skip 1 --launch-count 3 python
benchmarks/prefill_profile.py` captures the second single run and both batch runs (the first
launch compiles and warms up). Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import sys

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("prefill_profile.py: no CUDA GPU visible; nothing to profile")
        return 0
    import flashinfer

    torch.manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16, device="cuda")
    q = torch.randn(8192, 32, 128, **bf16)
    k, v = torch.randn(8192, 8, 128, **bf16), torch.randn(8192, 8, 128, **bf16)
    for _ in range(2):
        flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)

    batch, length, page = 16, 2048, 16
    pages_per_request = length // page
    num_pages = batch * pages_per_request
    cache = torch.randn(num_pages, 2, page, 8, 128, **bf16)
    int32 = dict(dtype=torch.int32, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    )
    wrapper.plan(
        torch.arange(0, (batch + 1) * length, length, **int32),
        torch.arange(0, (batch + 1) * pages_per_request, pages_per_request, **int32),
        torch.randperm(num_pages, device="cuda").to(torch.int32),
        torch.full((batch,), page, **int32),
        32,
        8,
        128,
        page,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    q_batch = torch.randn(batch * length, 32, 128, **bf16)
    for _ in range(2):
        wrapper.run(q_batch, cache)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
