"""JIT spec of the paged-KV module: one module per cache dtype."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op


def gen_page_module(dtype: Any) -> JitSpec:
    """The spec of the page module for caches of ``dtype`` (float16, bfloat16, float32 or
    fp8; its config rendered when planned)."""
    return gen_dtype_module(
        "page",
        dtype,
        ["page_kernel.cu", "page.cc"],
        {
            "append_paged_kv_cache": (
                "append_key",
                "append_value",
                "batch_indices",
                "positions",
                "paged_k_cache",
                "paged_v_cache",
                "kv_indices",
                "kv_indptr",
                "kv_last_page_len",
                "hnd",
            ),
        },
        fp8=True,
    )


# fp8 caches (decode reads them) are appended to with fp8 keys: their modules build on first use
register_op("page", lambda: [gen_page_module(d) for d in ("float16", "bfloat16", "float32")])
