"""Templates of the gated activations (flashinfer/activation.py)."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Tensor, TraceTemplate, Var


def _gated(name: str, act: str, reference) -> TraceTemplate:
    return TraceTemplate(
        op_type="activation",
        name_prefix=name,
        description=f"{act}(input[..., :d]) * input[..., d:], d = hidden_size.",
        axes={
            "num_tokens": Var(),
            "hidden_size": Const(abbrev="h", description="d: the output's last dim."),
            "input_size": Const(abbrev="", description="2 * hidden_size."),
        },
        constraints=("input_size == 2 * hidden_size",),
        inputs={"input": Tensor(("num_tokens", "input_size"))},
        outputs={"output": Tensor(("num_tokens", "hidden_size"), param="out", dtype_from="input")},
        derived={"hidden_size": lambda axes: axes["input_size"] // 2},
        tags=("status:verified", "fused"),
        reference=reference,
        reference_deps=(ref.act_and_mul,),
    )


silu_and_mul_trace = _gated("silu_and_mul", "silu", ref.silu_and_mul)
gelu_and_mul_trace = _gated("gelu_and_mul", "gelu", ref.gelu_and_mul)
gelu_tanh_and_mul_trace = _gated("gelu_tanh_and_mul", "gelu_tanh", ref.gelu_tanh_and_mul)
