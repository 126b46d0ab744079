"""flashinfer: LLM-serving CUDA kernels, JIT-compiled per specialization and cached."""

from __future__ import annotations

import tvm_ffi as _tvm_ffi  # noqa: F401 - loads modules; imported here so first calls stay fast

from .log import setup_logging as _setup_logging
from .version import __version__

_setup_logging()

from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul  # noqa: E402
from .api_logging import flashinfer_api  # noqa: E402
from .cascade import merge_state, merge_state_in_place, merge_states  # noqa: E402
from .decode import (  # noqa: E402
    BatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from .page import append_paged_kv_cache, get_batch_indices_positions  # noqa: E402
from .rope import (  # noqa: E402
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from .sampling import (  # noqa: E402
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from .norm import (  # noqa: E402
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    get_norm_module,
    layernorm,
    rmsnorm,
)

__all__ = [
    "__version__",
    "BatchDecodeWithPagedKVCacheWrapper",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "single_decode_with_kv_cache",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "flashinfer_api",
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "get_norm_module",
    "layernorm",
    "rmsnorm",
    "silu_and_mul",
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]
