"""JIT spec of the norm module: one module per dtype."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info, render_dtype_config
from .registry import register_op


def norm_uri(dtype: Any) -> str:
    return f"norm_dtype_{dtype_info(dtype).short}"


def gen_norm_module(dtype: Any) -> JitSpec:
    """Render the norm config for ``dtype`` and return the module's spec."""
    uri = norm_uri(dtype)
    config = render_dtype_config(uri, "norm_config.h", dtype)
    return gen_jit_spec(
        uri,
        ["norm_kernel.cu", "norm.cc"],
        generated_sources=[config],
        function_args={
            "rmsnorm": ("out", "input", "weight", "eps"),
            "gemma_rmsnorm": ("out", "input", "weight", "eps"),
            "fused_add_rmsnorm": ("input", "residual", "weight", "eps"),
            "gemma_fused_add_rmsnorm": ("input", "residual", "weight", "eps"),
            "layernorm": ("out", "input", "gamma", "beta", "eps"),
            "dtype": (),
        },
    )


register_op("norm", lambda: [gen_norm_module(d) for d in ("float16", "bfloat16", "float32")])
