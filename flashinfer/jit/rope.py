"""JIT spec of the RoPE module: one module per q/k dtype, every RoPE variant in it."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op

_OUTPUTS_INPUTS = ("q_out", "k_out", "q", "k", "pos_ids")


def gen_rope_module(dtype: Any) -> JitSpec:
    """The spec of the rope module for ``dtype`` (its config rendered when planned)."""
    return gen_dtype_module(
        "rope",
        dtype,
        ["rope_kernel.cu", "rope.cc"],
        {
            "apply_rope_pos_ids": (
                *_OUTPUTS_INPUTS,
                "rotary_dim",
                "interleave",
                "rope_scale",
                "rope_theta",
            ),
            "apply_llama31_rope_pos_ids": (
                *_OUTPUTS_INPUTS,
                "rotary_dim",
                "interleave",
                "rope_scale",
                "rope_theta",
                "low_freq_factor",
                "high_freq_factor",
                "old_context_len",
            ),
            "apply_rope_cos_sin_cache": (*_OUTPUTS_INPUTS, "cos_sin_cache", "interleave"),
        },
    )


register_op("rope", lambda: [gen_rope_module(d) for d in ("float16", "bfloat16", "float32")])
