"""JIT specs of the decode module (one per dtype, head_dim, position encoding and KV cache
dtype) and of the cascade module (one per dtype)."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info, gen_dtype_module
from .kv_dtype import KV_FP8_DTYPES, check_rope_cache, kv_dtype_info
from .pos_encoding import SCORE_ARGS, pos_encoding_suffix
from .registry import register_op
from .render import PendingRender

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")


def decode_uri(dtype: Any, head_dim: int, pos_encoding: str = "NONE", kv_dtype: Any = None) -> str:
    q, kv = dtype_info(dtype), kv_dtype_info(dtype, kv_dtype)
    kv_part = "" if kv == q else f"_kv{kv.short}"
    return f"decode_{q.short}_hd{head_dim}{kv_part}{pos_encoding_suffix(pos_encoding)}"


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


def gen_decode_module(
    dtype: Any, head_dim: int, pos_encoding: str = "NONE", kv_dtype: Any = None
) -> JitSpec:
    """The spec of the decode module for ``dtype`` (q and the output) x ``head_dim`` (its
    config rendered when planned), built for ``pos_encoding`` (a ``pos_encoding_mode``:
    "NONE", "ROPE_LLAMA", which rotates q and k in the kernel, or "ALIBI") and a KV cache of
    ``kv_dtype`` (None: ``dtype``; or float8_e4m3fn, float8_e5m2)."""
    info = dtype_info(dtype)
    if info.bits != 16:
        raise TypeError(f"decode supports float16 and bfloat16, not {info.name}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    kv = kv_dtype_info(dtype, kv_dtype)
    check_rope_cache(kv.name, pos_encoding)
    uri = decode_uri(dtype, head_dim, pos_encoding, kv_dtype)
    config = PendingRender.of(
        "attention_config.jinja",
        uri,
        "attention_config.h",
        uri=uri,
        dtype_name=info.name,
        cuda_type=info.cuda_type,
        dlpack_code=info.dlpack_code,
        bits=info.bits,
        kv_dtype_name=kv.name,
        kv_cuda_type=kv.cuda_type,
        kv_dlpack_code=kv.dlpack_code,
        kv_bits=kv.bits,
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
            "kv_dtype": (),
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
# the builds a cache's dtype or pos_encoding_mode asks for, as ops of their own
register_op(
    "decode_fp8",
    lambda: [
        gen_decode_module(d, h, "NONE", kv)
        for d in DTYPES
        for h in HEAD_DIMS
        for kv in KV_FP8_DTYPES
    ],
)
register_op(
    "decode_pos_encoding",
    lambda: [
        gen_decode_module(d, h, pos)
        for d in DTYPES
        for h in HEAD_DIMS
        for pos in ("ROPE_LLAMA", "ALIBI")
    ],
)
register_op("cascade", lambda: [gen_cascade_module(d) for d in ("float16", "bfloat16", "float32")])
