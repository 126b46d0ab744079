"""Templates of the norm family (flashinfer/norm.py): ``[tokens, hidden]``; a call with more
leading dims (``[batch, heads, head_dim]``) counts them all as rows."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

_AXES = {"batch_size": Var("Rows (tokens)."), "hidden_size": Const(abbrev="h")}
_ROWS = ("batch_size", "hidden_size")


def _rows(**fields) -> Tensor:
    return Tensor(_ROWS, flatten_leading=True, **fields)


_INPUT = _rows()
_WEIGHT = Tensor(("hidden_size",))
_EPS = Scalar("float32", description="Added to the mean square (default 1e-6).")
_SCALE = Scalar("float32", description="Quantization scale: out = fp8(y / scale).")


def _norm(name: str, description: str, reference, deps=(), tags=()) -> TraceTemplate:
    return TraceTemplate(
        op_type="rmsnorm",
        name_prefix=name,
        description=description,
        axes=_AXES,
        inputs={"input": _INPUT, "weight": _WEIGHT, "eps": _EPS},
        outputs={"output": _rows(param="out", dtype_from="input")},
        tags=("status:verified", *tags),
        reference=reference,
        reference_deps=deps,
    )


def _fused(name: str, description: str, tags=()) -> TraceTemplate:
    return TraceTemplate(
        op_type="rmsnorm",
        name_prefix=name,
        description=description,
        axes=_AXES,
        inputs={"input": _INPUT, "residual": _rows(), "weight": _WEIGHT, "eps": _EPS},
        outputs={
            "output": _rows(
                param="input",
                dtype_from="input",
                description="Normalized sum, written into input.",
            ),
            "residual": _rows(
                param="residual",
                dtype_from="residual",
                description="input + residual, written into residual.",
            ),
        },
        tags=("status:verified", "fused", *tags),
        reference=ref.fused_add_rmsnorm,
        reference_deps=(ref.rmsnorm,),
    )


rmsnorm_trace = _norm(
    "rmsnorm", "Root mean square normalization: x / rms(x) * weight.", ref.rmsnorm
)
gemma_rmsnorm_trace = _norm(
    "gemma_rmsnorm",
    "Gemma RMSNorm: x / rms(x) * (weight + 1).",
    ref.gemma_rmsnorm,
    (ref.rmsnorm,),
    ("model:gemma",),
)
fused_add_rmsnorm_trace = _fused(
    "fused_add_rmsnorm", "residual += input; input = rmsnorm(residual) * weight (in place)."
)
gemma_fused_add_rmsnorm_trace = _fused(
    "gemma_fused_add_rmsnorm",
    "residual += input; input = rmsnorm(residual) * (weight + 1) (in place).",
    ("model:gemma",),
)

rmsnorm_quant_trace = TraceTemplate(
    op_type="rmsnorm",
    name_prefix="rmsnorm_quant",
    description="RMSNorm, then fp8 e4m3: out = fp8(rmsnorm(input) * weight / scale).",
    axes=_AXES,
    inputs={"input": _INPUT, "weight": _WEIGHT, "scale": _SCALE, "eps": _EPS},
    outputs={"out": _rows(param="out", dtype_from="out", dtype="float8_e4m3fn")},
    tags=("status:verified", "quantization:fp8"),
    reference=ref.rmsnorm_quant,
    reference_deps=(ref.rmsnorm, ref.fp8_e4m3_quantize),
)

fused_add_rmsnorm_quant_trace = TraceTemplate(
    op_type="rmsnorm",
    name_prefix="fused_add_rmsnorm_quant",
    description="residual += input; out = fp8(rmsnorm(residual) * weight / scale).",
    axes=_AXES,
    inputs={
        "input": _INPUT,
        "residual": _rows(),
        "weight": _WEIGHT,
        "scale": _SCALE,
        "eps": _EPS,
    },
    outputs={
        "out": _rows(param="out", dtype_from="out", dtype="float8_e4m3fn"),
        "residual": _rows(
            param="residual",
            dtype_from="residual",
            description="input + residual, written into residual.",
        ),
    },
    tags=("status:verified", "fused", "quantization:fp8"),
    reference=ref.fused_add_rmsnorm_quant,
    reference_deps=(ref.rmsnorm, ref.fused_add_rmsnorm, ref.fp8_e4m3_quantize),
)

layernorm_trace = TraceTemplate(
    op_type="layernorm",
    name_prefix="layernorm",
    description="Layer normalization: (x - mean) / sqrt(var + eps) * gamma + beta.",
    axes=_AXES,
    inputs={
        "input": _INPUT,
        "gemma": Tensor(("hidden_size",), description="Scale (gamma)."),
        "beta": Tensor(("hidden_size",)),
        "eps": _EPS,
    },
    outputs={"output": _rows(dtype_from="input")},
    tags=("status:verified",),
    reference=ref.layernorm,
)
