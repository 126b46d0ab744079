"""One fi_trace call per traced API with realistic (model) shapes; writes fi_trace_out/.

Regenerate after adding or changing a template, then commit the JSON files:

    rm -rf tests/trace/fi_trace_out && python tests/trace/example.py

Tensors are created under FakeTensorMode: only shapes and dtypes exist, nothing is
allocated, compiled or launched, so this runs on any machine. Files written (one per call
below): append_paged_kv_cache, cascade_paged, fused_add_rmsnorm(_quant), gelu(_tanh)_and_mul,
gemma_(fused_add_)rmsnorm, get_batch_indices_positions, get_seq_lens, gqa_paged_decode,
gqa_paged_prefill, gqa_ragged, gqa_single_decode/prefill, layernorm, llama31_rope*,
merge_state(s)(_in_place), min_p/top_k/top_p/top_k_top_p sampling, packbits,
rmsnorm(_quant), rope*, rope_with_cos_sin_cache*, sampling(_from_logits), segment_packbits,
silu_and_mul, softmax, top_k_mask_logits, top_k/top_p_renorm_probs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashinfer
from flashinfer.fi_trace import fi_trace

OUT_DIR = Path(__file__).resolve().parent / "fi_trace_out"

bf16, f16, f32, i32 = torch.bfloat16, torch.float16, torch.float32, torch.int32


def t(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


def examples() -> list[tuple[Callable[..., Any], dict[str, Any]]]:
    """(API, its arguments): Llama-3.1-8B-like sizes (hidden 4096, 32/8 heads of 128)."""
    tokens, hidden, vocab = 16, 4096, 128256
    q, kv = t(tokens, 32, 128), t(tokens, 8, 128)
    cache = (t(64, 16, 8, 128), t(64, 16, 8, 128))
    probs = t(tokens, vocab, dtype=f32)
    rope_args = dict(q=q, k=kv, pos_ids=t(tokens, dtype=i32))
    ragged_rope = dict(q=q, k=kv, indptr=t(3, dtype=i32), offsets=t(2, dtype=i32))
    cos_sin = dict(
        positions=t(tokens, dtype=torch.int64),
        query=t(tokens, 32 * 128),
        key=t(tokens, 8 * 128),
        head_size=128,
        cos_sin_cache=t(4096, 128, dtype=f32),
    )
    norm = dict(input=t(tokens, hidden), weight=t(hidden))
    fused = dict(norm, residual=t(tokens, hidden))
    fp8 = t(tokens, hidden, dtype=torch.float8_e4m3fn)
    state = dict(v_a=q, s_a=t(tokens, 32, dtype=f32), v_b=q, s_b=t(tokens, 32, dtype=f32))
    return [
        (flashinfer.rmsnorm, norm),
        (flashinfer.gemma_rmsnorm, norm),
        (flashinfer.fused_add_rmsnorm, fused),
        (flashinfer.gemma_fused_add_rmsnorm, fused),
        (flashinfer.rmsnorm_quant, dict(norm, out=fp8, scale=1.0)),
        (flashinfer.fused_add_rmsnorm_quant, dict(fused, out=fp8, scale=1.0)),
        (
            flashinfer.layernorm,
            dict(input=t(tokens, 768), gemma=t(768, dtype=f32), beta=t(768, dtype=f32)),
        ),
        (flashinfer.silu_and_mul, dict(input=t(tokens, 2 * 14336))),
        (flashinfer.gelu_and_mul, dict(input=t(tokens, 2 * 16384))),
        (flashinfer.gelu_tanh_and_mul, dict(input=t(tokens, 2 * 16384))),
        (flashinfer.apply_rope, ragged_rope),
        (flashinfer.apply_rope_inplace, ragged_rope),
        (flashinfer.apply_rope_pos_ids, rope_args),
        (flashinfer.apply_rope_pos_ids_inplace, rope_args),
        (flashinfer.apply_llama31_rope, ragged_rope),
        (flashinfer.apply_llama31_rope_inplace, ragged_rope),
        (flashinfer.apply_llama31_rope_pos_ids, rope_args),
        (flashinfer.apply_llama31_rope_pos_ids_inplace, rope_args),
        (flashinfer.apply_rope_with_cos_sin_cache, cos_sin),
        (flashinfer.apply_rope_with_cos_sin_cache_inplace, cos_sin),
        (
            flashinfer.append_paged_kv_cache,
            dict(
                append_key=kv,
                append_value=kv,
                batch_indices=t(tokens, dtype=i32),
                positions=t(tokens, dtype=i32),
                paged_kv_cache=cache,
                kv_indices=t(64, dtype=i32),
                kv_indptr=t(3, dtype=i32),
                kv_last_page_len=t(2, dtype=i32),
            ),
        ),
        (
            flashinfer.get_seq_lens,
            dict(kv_indptr=t(3, dtype=i32), kv_last_page_len=t(2, dtype=i32), page_size=16),
        ),
        (
            flashinfer.get_batch_indices_positions,
            dict(append_indptr=t(3, dtype=i32), seq_lens=t(2, dtype=i32), nnz=tokens),
        ),
        (flashinfer.softmax, dict(logits=probs, temperature=0.7)),
        (flashinfer.sampling_from_probs, dict(probs=probs)),
        (flashinfer.sampling_from_logits, dict(logits=probs)),
        (flashinfer.top_p_sampling_from_probs, dict(probs=probs, top_p=0.9)),
        (flashinfer.top_k_sampling_from_probs, dict(probs=probs, top_k=50)),
        (flashinfer.min_p_sampling_from_probs, dict(probs=probs, min_p=0.05)),
        (flashinfer.top_k_top_p_sampling_from_probs, dict(probs=probs, top_k=50, top_p=0.9)),
        (flashinfer.top_k_top_p_sampling_from_logits, dict(logits=probs, top_k=50, top_p=0.9)),
        (flashinfer.top_p_renorm_probs, dict(probs=probs, top_p=0.9)),
        (flashinfer.top_k_renorm_probs, dict(probs=probs, top_k=50)),
        (flashinfer.top_k_mask_logits, dict(logits=probs, top_k=50)),
        (
            flashinfer.single_decode_with_kv_cache,
            dict(q=t(32, 128), k=t(2048, 8, 128), v=t(2048, 8, 128)),
        ),
        (
            flashinfer.single_prefill_with_kv_cache,
            dict(q=q, k=t(2048, 8, 128), v=t(2048, 8, 128), causal=True),
        ),
        (
            flashinfer.BatchDecodeWithPagedKVCacheWrapper.run,
            dict(q=t(2, 32, 128), paged_kv_cache=cache),
        ),
        (flashinfer.BatchPrefillWithPagedKVCacheWrapper.run, dict(q=q, paged_kv_cache=cache)),
        (
            flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run,
            dict(q=q, k=t(512, 8, 128), v=t(512, 8, 128)),
        ),
        (  # DeepSeek's MLA prefill: q and k of head_dim 192, v and the output of 128
            flashinfer.BatchPrefillWithRaggedKVCacheWrapper.run,
            dict(q=t(tokens, 16, 192), k=t(512, 16, 192), v=t(512, 16, 128)),
        ),
        (flashinfer.MultiLevelCascadeAttentionWrapper.run, dict(q=q, paged_kv_cache=cache)),
        (flashinfer.merge_state, state),
        (
            flashinfer.merge_state_in_place,
            dict(v=q, s=state["s_a"], v_other=q, s_other=state["s_b"]),
        ),
        (flashinfer.merge_states, dict(v=t(tokens, 3, 32, 128), s=t(tokens, 3, 32, dtype=f32))),
        (flashinfer.packbits, dict(x=t(1000, dtype=torch.bool))),
        (flashinfer.segment_packbits, dict(x=t(1000, dtype=torch.bool), indptr=t(3, dtype=i32))),
    ]


def main(out_dir: Path = OUT_DIR) -> list[Path]:
    written = []
    with FakeTensorMode():
        for api, kwargs in examples():
            definition = fi_trace(api, save_dir=out_dir, **kwargs)
            written.append(out_dir / f"{definition['name']}.json")
    return written


if __name__ == "__main__":
    paths = main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR)
    print(f"wrote {len(paths)} definitions to {paths[0].parent}")
