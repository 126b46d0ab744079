"""JIT spec of the gated-activation module: one module per dtype, all activations in it."""

from __future__ import annotations

from typing import Any

from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info, render_dtype_config
from .registry import register_op


def activation_uri(dtype: Any) -> str:
    return f"activation_dtype_{dtype_info(dtype).short}"


def gen_act_and_mul_module(dtype: Any) -> JitSpec:
    """Render the activation config for ``dtype`` and return the module's spec."""
    uri = activation_uri(dtype)
    config = render_dtype_config(uri, "activation_config.h", dtype)
    return gen_jit_spec(
        uri,
        ["activation_kernel.cu", "activation.cc"],
        generated_sources=[config],
        function_args={
            name: ("out", "input")
            for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
        },
    )


register_op(
    "activation",
    lambda: [gen_act_and_mul_module(d) for d in ("float16", "bfloat16", "float32")],
)
