"""JIT spec of the paged-KV module: one module per cache dtype."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info, render_dtype_config
from .registry import register_op


def page_uri(dtype: Any) -> str:
    return f"page_dtype_{dtype_info(dtype).short}"


def gen_page_module(dtype: Any) -> JitSpec:
    """Render the page config for ``dtype`` and return the module's spec."""
    uri = page_uri(dtype)
    config = render_dtype_config(uri, "page_config.h", dtype)
    return gen_jit_spec(
        uri,
        ["page_kernel.cu", "page.cc"],
        generated_sources=[config],
        function_args={
            "append_paged_kv_cache": ("append_key", "append_value", "batch_indices", "positions",
                                      "paged_k_cache", "paged_v_cache", "kv_indices",
                                      "kv_indptr", "kv_last_page_len", "hnd"),
        },
    )


register_op("page", lambda: [gen_page_module(d) for d in ("float16", "bfloat16", "float32")])
