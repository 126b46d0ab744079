"""Templates of the RoPE family (flashinfer/rope.py)."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

_HEADS = {
    "num_qo_heads": Const(abbrev="h"),
    "num_kv_heads": Const(abbrev="kv"),
    "head_dim": Const(abbrev="d"),
}
_Q = Tensor(("nnz", "num_qo_heads", "head_dim"))
_K = Tensor(("nnz", "num_kv_heads", "head_dim"))
_SCALARS = {
    "rotary_dim": Scalar("int32", optional=True, description="Rotated dims (default: head_dim)."),
    "rope_scale": Scalar("float32"),
    "rope_theta": Scalar("float32"),
}
_LLAMA31 = {
    "low_freq_factor": Scalar("float32"),
    "high_freq_factor": Scalar("float32"),
    "old_context_len": Scalar("int32"),
}
_DEPS = (ref.rope_frequencies, ref.rope)


def _outputs(inplace: bool) -> dict[str, Tensor]:
    if inplace:
        return {
            "q_rope": Tensor(_Q.dims, param="q", dtype_from="q", description="Written into q."),
            "k_rope": Tensor(_K.dims, param="k", dtype_from="k", description="Written into k."),
        }
    return {"q_rope": Tensor(_Q.dims, dtype_from="q"), "k_rope": Tensor(_K.dims, dtype_from="k")}


def _rope(name: str, *, ragged: bool, llama31: bool, inplace: bool) -> TraceTemplate:
    positions: dict = (
        {"indptr": Tensor(("len_indptr",)), "offsets": Tensor(("batch_size",))}
        if ragged
        else {"pos_ids": Tensor(("nnz",))}
    )
    axes: dict = {"nnz": Var(), **_HEADS}
    if ragged:
        axes.update(len_indptr=Var(), batch_size=Var())
    return TraceTemplate(
        op_type="rope",
        name_prefix=name,
        description=(
            ("Llama 3.1 frequency-scaled " if llama31 else "") + "rotary embedding of q "
            "and k"
            + (" in place" if inplace else "")
            + ", positions from "
            + ("indptr + offsets" if ragged else "pos_ids")
            + "."
        ),
        axes=axes,
        constraints=("len_indptr == batch_size + 1",) if ragged else (),
        inputs={"q": _Q, "k": _K, **positions, **_SCALARS, **(_LLAMA31 if llama31 else {})},
        outputs=_outputs(inplace),
        tags=("status:verified",) + (("model:llama",) if llama31 else ()),
        reference=ref.rope_ragged if ragged else ref.rope_pos_ids,
        reference_deps=(*_DEPS, ref.rope_pos_ids) if ragged else _DEPS,
    )


apply_rope_trace = _rope("rope", ragged=True, llama31=False, inplace=False)
apply_rope_inplace_trace = _rope("rope_inplace", ragged=True, llama31=False, inplace=True)
apply_rope_pos_ids_trace = _rope("rope_pos_ids", ragged=False, llama31=False, inplace=False)
apply_rope_pos_ids_inplace_trace = _rope(
    "rope_pos_ids_inplace", ragged=False, llama31=False, inplace=True
)
apply_llama31_rope_trace = _rope("llama31_rope", ragged=True, llama31=True, inplace=False)
apply_llama31_rope_inplace_trace = _rope(
    "llama31_rope_inplace", ragged=True, llama31=True, inplace=True
)
apply_llama31_rope_pos_ids_trace = _rope(
    "llama31_rope_pos_ids", ragged=False, llama31=True, inplace=False
)
apply_llama31_rope_pos_ids_inplace_trace = _rope(
    "llama31_rope_pos_ids_inplace", ragged=False, llama31=True, inplace=True
)


def _cos_sin(inplace: bool) -> TraceTemplate:
    suffix = "_inplace" if inplace else ""
    q = Tensor(
        ("nnz", "q_size"),
        param="query",
        dtype_from="query",
        description="Written into query." if inplace else "",
    )
    k = Tensor(
        ("nnz", "k_size"),
        param="key",
        dtype_from="key",
        description="Written into key." if inplace else "",
    )
    return TraceTemplate(
        op_type="rope",
        name_prefix=f"rope_with_cos_sin_cache{suffix}",
        description="Rotary embedding of flat [nnz, heads * head_size] query/key with angles "
        "from the [cos | sin] rows of cos_sin_cache at positions.",
        axes={
            "nnz": Var(),
            "num_qo_heads": Const(abbrev="h"),
            "num_kv_heads": Const(abbrev="kv"),
            "head_size": Const(abbrev="d"),
            "q_size": Const(abbrev=""),
            "k_size": Const(abbrev=""),
            "max_seq_len": Var(),
            "rotary_dim": Const(abbrev="r"),
        },
        constraints=("q_size == num_qo_heads * head_size", "k_size == num_kv_heads * head_size"),
        inputs={
            "positions": Tensor(("nnz",)),
            "query": Tensor(("nnz", "q_size")),
            "key": Tensor(("nnz", "k_size")),
            "head_size": Scalar("int32"),
            "cos_sin_cache": Tensor(("max_seq_len", "rotary_dim")),
            "is_neox": Scalar("bool"),
        },
        outputs={
            "query_rope" if not inplace else "query": q,
            "key_rope" if not inplace else "key": k,
        },
        derived={
            "num_qo_heads": lambda a: a["q_size"] // a["head_size"],
            "num_kv_heads": lambda a: a["k_size"] // a["head_size"],
        },
        tags=("status:verified",),
        reference=ref.rope_cos_sin_cache,
        reference_deps=(ref.rope,),
    )


apply_rope_with_cos_sin_cache_trace = _cos_sin(False)
apply_rope_with_cos_sin_cache_inplace_trace = _cos_sin(True)
