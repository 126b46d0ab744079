"""Templates of the sampling family (flashinfer/sampling.py).

The sampling references draw exactly the kernels' tokens (same Philox stream) with
:func:`~flashinfer.testing.reference.sample_rows`, from the row restricted to the set the
API keeps (``top_p_set``, ``top_k_set``, ``min_p_set``; their sources are embedded too).
"""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Scalar, Tensor, TraceTemplate, Var, module_constants

_AXES = {"batch_size": Var(), "vocab_size": Const(abbrev="v")}
_ROWS = ("batch_size", "vocab_size")
_SAMPLER = (
    module_constants(ref, ("_PHILOX_MUL", "_PHILOX_WEYL", "_MASK32")),
    ref.philox4x32_10,
    ref.philox_words,
    ref._float32,
    ref.uniform_open01,
    ref.exponential_race,
)
_SETS = (ref.mass_above, ref.top_k_set, ref.top_p_set, ref.min_p_set)
_PARAMS = {
    "top_k": Scalar("int32", description="Per-row tensor [batch_size] or an int."),
    "top_p": Scalar("float32", description="Per-row tensor [batch_size] or a float."),
    "min_p": Scalar("float32", description="Per-row tensor [batch_size] or a float."),
}
_SAMPLES = {"samples": Tensor(("batch_size",), dtype="int32")}


def _sampler(name: str, source: str, params: tuple[str, ...], kept: str) -> TraceTemplate:
    return TraceTemplate(
        op_type="sampling",
        name_prefix=name,
        description=f"One token per row of {source}, drawn from {kept}.",
        axes=_AXES,
        inputs={source: Tensor(_ROWS), **{p: _PARAMS[p] for p in params}},
        outputs=_SAMPLES,
        tags=("status:verified",),
        reference=ref.sample_rows,
        reference_deps=(*_SAMPLER, *_SETS),
    )


sampling_from_probs_trace = _sampler("sampling", "probs", (), "the whole row")
sampling_from_logits_trace = _sampler(
    "sampling_from_logits", "logits", (), "softmax(logits) (the row's softmax)"
)
top_p_sampling_from_probs_trace = _sampler(
    "top_p_sampling", "probs", ("top_p",), "top_p_set(probs, top_p)"
)
top_k_sampling_from_probs_trace = _sampler(
    "top_k_sampling", "probs", ("top_k",), "top_k_set(probs, top_k)"
)
min_p_sampling_from_probs_trace = _sampler(
    "min_p_sampling", "probs", ("min_p",), "min_p_set(probs, min_p)"
)
top_k_top_p_sampling_from_probs_trace = _sampler(
    "top_k_top_p_sampling",
    "probs",
    ("top_k", "top_p"),
    "the top-k set, renormalized, then its top-p set (filter_apply_order 'top_k_first') or "
    'both sets of the row ("joint")',
)
top_k_top_p_sampling_from_logits_trace = _sampler(
    "top_k_top_p_sampling_from_logits",
    "logits",
    ("top_k", "top_p"),
    "softmax(logits) filtered as top_k_top_p_sampling_from_probs",
)


def _renorm(name: str, param: str, kept: str, dtype: str | None) -> TraceTemplate:
    return TraceTemplate(
        op_type="sampling",
        name_prefix=name,
        description=f"probs restricted to {kept}, each row divided by its kept mass.",
        axes=_AXES,
        inputs={"probs": Tensor(_ROWS), param: _PARAMS[param]},
        outputs={"renorm_probs": Tensor(_ROWS, dtype=dtype, dtype_from=None if dtype else "probs")},
        tags=("status:verified",),
        reference=ref.renormalize,
        reference_deps=_SETS,
    )


top_p_renorm_probs_trace = _renorm(
    "top_p_renorm_probs", "top_p", "top_p_set(probs, top_p)", "float32"
)
top_k_renorm_probs_trace = _renorm("top_k_renorm_probs", "top_k", "top_k_set(probs, top_k)", None)

top_k_mask_logits_trace = TraceTemplate(
    op_type="sampling",
    name_prefix="top_k_mask_logits",
    description="logits outside each row's top k set to -inf.",
    axes=_AXES,
    inputs={"logits": Tensor(_ROWS), "top_k": _PARAMS["top_k"]},
    outputs={"masked_logits": Tensor(_ROWS, dtype_from="logits")},
    tags=("status:verified",),
    reference=ref.top_k_mask_logits,
    reference_deps=(ref.top_k_set,),
)

softmax_trace = TraceTemplate(
    op_type="softmax",
    name_prefix="softmax",
    description="softmax(logits / temperature) per row.",
    axes=_AXES,
    inputs={
        "logits": Tensor(_ROWS),
        "temperature": Scalar(
            "float32", optional=True, description="Per-row tensor [batch_size], a float or None."
        ),
    },
    outputs={"probs": Tensor(_ROWS, dtype="float32")},
    tags=("status:verified",),
    reference=ref.softmax,
)
