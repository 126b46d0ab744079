"""flashinfer: LLM-serving CUDA kernels, JIT-compiled per specialization and cached.

The kernel APIs are imported on first use (``flashinfer.rmsnorm`` loads
``flashinfer.norm``), so ``import flashinfer`` stays cheap however many families exist.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import tvm_ffi as _tvm_ffi  # noqa: F401 - loads modules; imported here so first calls stay fast

from .log import setup_logging as _setup_logging
from .version import __version__

_setup_logging()

from .api_logging import flashinfer_api  # noqa: E402

# public name -> the submodule that defines it
_API_MODULES: dict[str, tuple[str, ...]] = {
    "activation": ("gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"),
    "cascade": (
        "MultiLevelCascadeAttentionWrapper",
        "merge_state",
        "merge_state_in_place",
        "merge_states",
    ),
    "decode": (
        "BatchDecodeWithPagedKVCacheWrapper",
        "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
        "fast_decode_plan",
        "single_decode_with_kv_cache",
    ),
    "norm": (
        "fused_add_rmsnorm",
        "fused_add_rmsnorm_quant",
        "gemma_fused_add_rmsnorm",
        "gemma_rmsnorm",
        "get_norm_module",
        "layernorm",
        "rmsnorm",
        "rmsnorm_quant",
    ),
    "page": ("append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"),
    "prefill": (
        "BatchPrefillWithPagedKVCacheWrapper",
        "BatchPrefillWithRaggedKVCacheWrapper",
        "single_prefill_with_kv_cache",
        "single_prefill_with_kv_cache_return_lse",
    ),
    "quantization": ("packbits", "segment_packbits"),
    "rope": (
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
    ),
    "sampling": (
        "chain_speculative_sampling",
        "min_p_sampling_from_probs",
        "sampling_from_logits",
        "sampling_from_probs",
        "softmax",
        "top_k_mask_logits",
        "top_k_renorm_prob",
        "top_k_renorm_probs",
        "top_k_sampling_from_probs",
        "top_k_top_p_sampling_from_logits",
        "top_k_top_p_sampling_from_probs",
        "top_p_renorm_prob",
        "top_p_renorm_probs",
        "top_p_sampling_from_probs",
    ),
}
_LAZY = {name: module for module, names in _API_MODULES.items() for name in names}

__all__ = ["__version__", "flashinfer_api", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif _is_submodule(name):
        # as ``import flashinfer; flashinfer.sampling.top_p_...`` reaches it (vLLM's sampler
        # does): the reference's __init__ imports every submodule, ours on first use
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'flashinfer' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def _is_submodule(name: str) -> bool:
    """A module or package of ours (not a data directory, which imports as a namespace)."""
    if name.startswith("_"):
        return False
    spec = importlib.util.find_spec(f"{__name__}.{name}")
    return spec is not None and spec.origin is not None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
