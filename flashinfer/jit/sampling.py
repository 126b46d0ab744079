"""JIT spec of the sampling module: one module per input dtype (logits, and the
probabilities of renorm_probs; sampled probabilities are float32 in every module)."""

from __future__ import annotations

from typing import Any

from .core import JitSpec
from .dtypes import gen_dtype_module
from .registry import register_op


def gen_sampling_module(dtype: Any) -> JitSpec:
    """The spec of the sampling module for logits of ``dtype`` (its config rendered when
    planned)."""
    return gen_dtype_module(
        "sampling",
        dtype,
        ["sampling_kernel.cu", "sampling.cc"],
        {
            "softmax": ("out", "logits", "temperatures", "temperature", "pdl"),
            "sampling_from_probs": (
                "out",
                "valid",
                "probs",
                "indices",
                "top_k_values",
                "top_p_values",
                "min_p_values",
                "top_k",
                "top_p",
                "min_p",
                "which",
                "top_k_first",
                "seed_values",
                "offset_values",
                "seed",
                "offset",
            ),
            "sampling_from_logits": (
                "out",
                "logits",
                "indices",
                "seed_values",
                "offset_values",
                "seed",
                "offset",
            ),
            "renorm_probs": (
                "out",
                "probs",
                "top_k_values",
                "top_p_values",
                "top_k",
                "top_p",
                "which",
            ),
            "top_k_mask_logits": ("out", "logits", "top_k_values", "top_k"),
        },
    )


register_op(
    "sampling", lambda: [gen_sampling_module(d) for d in ("float16", "bfloat16", "float32")]
)
