"""JIT specs of the prefill module: one per dtype and head_dim, the tensor-core kernel of
single, ragged and paged prefill (include/flashinfer/prefill.cuh)."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info
from .registry import register_op
from .render import PendingRender

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")


def prefill_uri(dtype: Any, head_dim: int) -> str:
    return f"prefill_{dtype_info(dtype).short}_hd{head_dim}"


# The binding functions' parameters, in order (the debug printer names arguments by them;
# CPU tests bind recorded launches with them).
BATCH_PREFILL_ARGS = (
    "q",
    "k",
    "v",
    "qo_indptr",
    "kv_indptr",
    "kv_indices",
    "kv_last_page_len",
    "custom_mask",
    "mask_indptr",
    "plan",
    "tmp_v",
    "tmp_lse",
    "out",
    "lse",
    "hnd",
    "work_capacity",
    "merge_capacity",
    "tmp_capacity",
    "grid_work",
    "grid_merge",
    "causal",
    "window_left",
    "score_scale",
    "score_cap",
    "enable_pdl",
)
SINGLE_PREFILL_ARGS = (
    "q",
    "k",
    "v",
    "custom_mask",
    "tmp_v",
    "tmp_lse",
    "out",
    "lse",
    "hnd",
    "causal",
    "window_left",
    "chunk_tokens",
    "num_chunks",
    "score_scale",
    "score_cap",
    "enable_pdl",
)


def gen_prefill_module(dtype: Any, head_dim: int) -> JitSpec:
    """The spec of the prefill module for ``dtype`` x ``head_dim`` (its attention config
    rendered when planned)."""
    info = dtype_info(dtype)
    if info.bits != 16:
        raise TypeError(f"prefill supports float16 and bfloat16, not {info.name}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    uri = prefill_uri(dtype, head_dim)
    config = PendingRender.of(
        "attention_config.jinja",
        uri,
        "attention_config.h",
        uri=uri,
        dtype_name=info.name,
        cuda_type=info.cuda_type,
        dlpack_code=info.dlpack_code,
        bits=info.bits,
        head_dim=head_dim,
    )
    return gen_jit_spec(
        uri,
        ["prefill_kernel.cu", "prefill.cc"],
        generated_sources=[config],
        supported_major_versions=[8, 9, 10, 11, 12],  # mma.sync m16n8k16, ldmatrix, cp.async
        function_args={
            "batch_prefill": BATCH_PREFILL_ARGS,
            "single_prefill": SINGLE_PREFILL_ARGS,
            "blocks_per_sm": (),
            "tile_rows": (),
        },
    )


register_op("prefill", lambda: [gen_prefill_module(d, h) for d in DTYPES for h in HEAD_DIMS])
