"""The KV cache dtypes an attention module takes (q's own, or an fp8 type) and the position
encodings that rule some out; shared by the decode and prefill specs."""

from __future__ import annotations

from typing import Any

from .dtypes import FP8_NAMES, DTypeInfo, dtype_info, storage_info

KV_FP8_DTYPES = FP8_NAMES  # KV caches besides q's own dtype


def kv_dtype_info(dtype: Any, kv_dtype: Any) -> DTypeInfo:
    """The KV cache's dtype: q's (``kv_dtype`` None or equal) or an fp8 type."""
    q = dtype_info(dtype)
    if kv_dtype is None:
        return q
    try:
        info = storage_info(kv_dtype)
    except TypeError:
        info = None
    if info is None or (info != q and info.name not in KV_FP8_DTYPES):
        raise TypeError(
            f"unsupported KV cache dtype {kv_dtype!r} for q of {q.name}: the cache is q's "
            f"dtype or one of {', '.join(KV_FP8_DTYPES)}"
        )
    return info


def check_rope_cache(kv_dtype: Any, pos_encoding: str) -> None:
    """RoPE rotates keys in shared memory in the cache's type: refused for fp8, which would
    round the rotated keys."""
    name = str(kv_dtype).removeprefix("torch.")
    if pos_encoding == "ROPE_LLAMA" and name in KV_FP8_DTYPES:
        raise ValueError(
            f'pos_encoding_mode="ROPE_LLAMA" needs a 16-bit KV cache, not {name}: the kernel '
            "would round the rotated keys to fp8; apply RoPE before quantizing the cache"
        )
