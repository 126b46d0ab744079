"""JIT specs of the decode module (one per dtype and head_dim) and of the cascade module
(one per dtype)."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info, gen_dtype_module
from .pos_encoding import SCORE_ARGS, pos_encoding_suffix
from .registry import register_op
from .render import PendingRender

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")


def decode_uri(dtype: Any, head_dim: int, pos_encoding: str = "NONE") -> str:
    return f"decode_{dtype_info(dtype).short}_hd{head_dim}{pos_encoding_suffix(pos_encoding)}"


# The binding functions' parameters, in order (the debug printer names arguments by them;
# CPU tests bind recorded launches with them).
BATCH_DECODE_ARGS = (
    "q",
    "k_cache",
    "v_cache",
    "kv_indptr",
    "kv_indices",
    "kv_last_page_len",
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
    "window_left",
    *SCORE_ARGS,
)
SINGLE_DECODE_ARGS = (
    "q",
    "k",
    "v",
    "tmp_v",
    "tmp_lse",
    "out",
    "lse",
    "hnd",
    "window_left",
    "chunk_tokens",
    "num_chunks",
    *SCORE_ARGS,
)


def gen_decode_module(dtype: Any, head_dim: int, pos_encoding: str = "NONE") -> JitSpec:
    """The spec of the decode module for ``dtype`` x ``head_dim`` (its config rendered when
    planned), built for ``pos_encoding`` (a ``pos_encoding_mode``: "NONE", "ROPE_LLAMA", which
    rotates q and k in the kernel, or "ALIBI")."""
    info = dtype_info(dtype)
    if info.bits != 16:
        raise TypeError(f"decode supports float16 and bfloat16, not {info.name}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    uri = decode_uri(dtype, head_dim, pos_encoding)
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
        pos_encoding=pos_encoding,
    )
    return gen_jit_spec(
        uri,
        ["decode_kernel.cu", "decode.cc"],
        generated_sources=[config],
        supported_major_versions=[8, 9, 10, 11, 12],  # cp.async: sm_80 and later
        function_args={
            "batch_decode": BATCH_DECODE_ARGS,
            "single_decode": SINGLE_DECODE_ARGS,
            "blocks_per_sm": ("group",),
            "pos_encoding": (),
        },
    )


def gen_cascade_module(dtype: Any) -> JitSpec:
    """The state-merging module for attention outputs of ``dtype``."""
    return gen_dtype_module(
        "cascade",
        dtype,
        ["cascade_kernel.cu", "cascade.cc"],
        {
            "merge_state": ("v_a", "s_a", "v_b", "s_b", "v_out", "s_out", "mask", "in_place"),
            "merge_states": ("v", "s", "v_out", "s_out"),
        },
    )


register_op("decode", lambda: [gen_decode_module(d, h) for d in DTYPES for h in HEAD_DIMS])
register_op("cascade", lambda: [gen_cascade_module(d) for d in ("float16", "bfloat16", "float32")])
