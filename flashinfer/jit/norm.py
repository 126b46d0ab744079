"""JIT specs of the norm modules: one module per input dtype, and the fp8-output
(``rmsnorm_quant``) kernels in a module of their own, so the plain norms never compile them."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op

_DTYPES = ("float16", "bfloat16", "float32")


def gen_norm_module(dtype: Any) -> JitSpec:
    """The spec of the norm module for ``dtype`` (its config rendered when planned)."""
    return gen_dtype_module(
        "norm",
        dtype,
        ["norm_kernel.cu", "norm.cc"],
        {
            "rmsnorm": ("out", "input", "weight", "eps", "enable_pdl"),
            "gemma_rmsnorm": ("out", "input", "weight", "eps", "enable_pdl"),
            "fused_add_rmsnorm": ("input", "residual", "weight", "eps", "enable_pdl"),
            "gemma_fused_add_rmsnorm": ("input", "residual", "weight", "eps", "enable_pdl"),
            "layernorm": ("out", "input", "gemma", "beta", "eps", "enable_pdl"),
            "dtype": (),
        },
    )


def gen_norm_quant_module(dtype: Any) -> JitSpec:
    """The spec of the fp8 e4m3 output norms for input ``dtype``."""
    return gen_dtype_module(
        "norm_quant",
        dtype,
        ["norm_quant_kernel.cu", "norm_quant.cc"],
        {
            "rmsnorm_quant": (
                "out",
                "input",
                "weight",
                "scale",
                "scale_value",
                "eps",
                "enable_pdl",
            ),
            "fused_add_rmsnorm_quant": (
                "out",
                "input",
                "residual",
                "weight",
                "scale",
                "scale_value",
                "eps",
                "enable_pdl",
            ),
            "dtype": (),
        },
    )


register_op("norm", lambda: [gen_norm_module(d) for d in _DTYPES])
register_op("norm_quant", lambda: [gen_norm_quant_module(d) for d in _DTYPES])
