"""JIT spec of the norm module: one module per dtype."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op


def gen_norm_module(dtype: Any) -> JitSpec:
    """Render the norm config for ``dtype`` and return the module's spec."""
    return gen_dtype_module(
        "norm",
        dtype,
        ["norm_kernel.cu", "norm.cc"],
        {
            "rmsnorm": ("out", "input", "weight", "eps"),
            "gemma_rmsnorm": ("out", "input", "weight", "eps"),
            "fused_add_rmsnorm": ("input", "residual", "weight", "eps"),
            "gemma_fused_add_rmsnorm": ("input", "residual", "weight", "eps"),
            "layernorm": ("out", "input", "gamma", "beta", "eps"),
            "dtype": (),
        },
    )


register_op("norm", lambda: [gen_norm_module(d) for d in ("float16", "bfloat16", "float32")])
