"""The reference's trtllm-gen / xqa attention entry points, which run the reference's
precompiled TensorRT-LLM kernels (Blackwell's trtllm-gen; xqa on other GPUs). This library
has no such kernels. The functions exist with the reference's signatures because engines
import them with the wrappers when they load their FlashInfer backend (vLLM:
``from flashinfer.decode import trtllm_batch_decode_with_kv_cache``); a call raises
:class:`~flashinfer.utils.BackendNotSupportedError` naming the wrapper that runs the same
attention here, before it reads any argument."""

from __future__ import annotations

from typing import Any, NoReturn

from .utils import BackendNotSupportedError


def _refuse(api: str, backend: str, wrapper: str) -> NoReturn:
    raise BackendNotSupportedError(
        f"{api}: backend={backend!r} runs the reference's trtllm-gen/xqa kernels, which this "
        f"library does not have; use {wrapper} (backend 'fa2'), as engines do on GPUs "
        "without trtllm-gen"
    )


def trtllm_batch_decode_with_kv_cache(
    query: Any,
    kv_cache: Any,
    workspace_buffer: Any,
    block_tables: Any,
    seq_lens: Any,
    max_seq_len: int,
    bmm1_scale: Any = 1.0,
    bmm2_scale: Any = 1.0,
    window_left: int = -1,
    out: Any = None,
    out_dtype: Any = None,
    o_sf_scale: float | None = None,
    o_sf_vec_size: int | None = None,
    sinks: Any = None,
    kv_layout: str = "HND",
    enable_pdl: bool | None = None,
    backend: str = "auto",
    q_len_per_req: int | None = 1,
    o_scale: float | None = 1.0,
    mask: Any = None,
    max_q_len: int | None = None,
    cum_seq_lens_q: Any = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    kv_cache_sf: Any = None,
    uses_shared_paged_kv_idx: bool = True,
    lse: Any = None,
    return_lse: bool = False,
    bmm1_scale_log2: Any = None,
    multi_ctas_kv_counter_buffer: Any = None,
    enable_block_sparse_attention: bool = False,
) -> NoReturn:
    """The reference's decode over a dense block table on its trtllm-gen or xqa kernels:
    not available here (see the module docstring)."""
    _refuse("trtllm_batch_decode_with_kv_cache", backend, "BatchDecodeWithPagedKVCacheWrapper")


def trtllm_batch_context_with_kv_cache(
    query: Any,
    kv_cache: Any,
    workspace_buffer: Any,
    block_tables: Any,
    seq_lens: Any,
    max_q_len: int,
    max_kv_len: int,
    bmm1_scale: Any,
    bmm2_scale: Any,
    batch_size: int,
    cum_seq_lens_q: Any,
    cum_seq_lens_kv: Any,
    window_left: int = -1,
    out: Any = None,
    out_dtype: Any = None,
    o_sf_scale: float | None = None,
    o_sf_vec_size: int | None = None,
    kv_layout: str = "HND",
    enable_pdl: bool | None = None,
    sinks: Any = None,
    kv_cache_sf: Any = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    uses_shared_paged_kv_idx: bool = True,
    causal: bool = True,
    lse: Any = None,
    return_lse: bool = False,
    multi_ctas_kv_counter_buffer: Any = None,
) -> NoReturn:
    """The reference's prefill over a dense block table on its trtllm-gen kernels: not
    available here (see the module docstring)."""
    _refuse(
        "trtllm_batch_context_with_kv_cache", "trtllm-gen", "BatchPrefillWithPagedKVCacheWrapper"
    )
