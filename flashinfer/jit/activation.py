"""JIT spec of the gated-activation module: one module per dtype, all activations in it."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op


def gen_act_and_mul_module(dtype: Any) -> JitSpec:
    """The spec of the activation module for ``dtype`` (its config rendered when planned)."""
    return gen_dtype_module(
        "activation",
        dtype,
        ["activation_kernel.cu", "activation.cc"],
        {
            name: ("out", "input", "enable_pdl")
            for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
        },
    )


register_op(
    "activation",
    lambda: [gen_act_and_mul_module(d) for d in ("float16", "bfloat16", "float32")],
)
