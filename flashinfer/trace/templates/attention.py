"""Templates of the attention APIs (flashinfer/decode.py, flashinfer/prefill.py).

Wrapper ``run`` templates list what ``plan()`` fixes (page table, causal, sm_scale) as
optional inputs; ``fi_trace(wrapper.run, ...)`` fills them from the planned wrapper
(``plan_attrs``), the class-level ``Wrapper.run.fi_trace(...)`` leaves their dtypes unknown.
"""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

_HEADS = {
    "num_qo_heads": Const(abbrev="h"),
    "num_kv_heads": Const(abbrev="kv"),
    "head_dim": Const(abbrev="d"),
}
# prefill's v and output rows: head_dim's, or 128 under a head_dim of 192 (MLA prefill, the one
# unequal pair: left out of the name, which head_dim 192 already tells apart)
_PREFILL_HEADS = {
    **_HEADS,
    "head_dim_vo": Const(
        abbrev="", description="v's and the output's head_dim: head_dim, or 128 with 192."
    ),
}
_PAGED = ("num_pages", "page_size", "num_kv_heads", "head_dim")
_PAGED_HND = ("num_pages", "num_kv_heads", "page_size", "head_dim")
_LSE = "Base-2 log-sum-exp of the scores (returned when return_lse)."


def _planned(dims: tuple[str, ...], what: str) -> Tensor:
    return Tensor(dims, optional=True, description=f"{what} Set by plan(), not run().")


def _sm_scale(planned: bool) -> Scalar:
    return Scalar(
        "float32",
        optional=True,
        description="Softmax scale, default 1/sqrt(head_dim)."
        + (" Set by plan(), not run()." if planned else ""),
    )


def _paged_cache(v_dim: str = "head_dim") -> dict[str, Tensor]:
    """The k and v caches of ``paged_kv_cache``; v's rows of ``v_dim``."""
    v_paged, v_hnd = (*_PAGED[:3], v_dim), (*_PAGED_HND[:3], v_dim)
    return {
        "k_cache": Tensor(_PAGED, param="paged_kv_cache", tuple_idx=0, hnd_dims=_PAGED_HND),
        "v_cache": Tensor(v_paged, param="paged_kv_cache", tuple_idx=1, hnd_dims=v_hnd),
    }


def _outputs(rows: str, dim: str = "head_dim") -> dict[str, Tensor]:
    return {
        "output": Tensor((rows, "num_qo_heads", dim), param="out", dtype_from="q"),
        "lse": Tensor(
            (rows, "num_qo_heads"), param="lse", dtype="float32", optional=True, description=_LSE
        ),
    }


single_decode_with_kv_cache_trace = TraceTemplate(
    op_type="gqa_single",
    name_prefix="gqa_single_decode",
    description="Decode attention of one query token per head over one request's KV.",
    axes={"kv_len": Var(), **_HEADS},
    inputs={
        "q": Tensor(("num_qo_heads", "head_dim")),
        "k": Tensor(
            ("kv_len", "num_kv_heads", "head_dim"), hnd_dims=("num_kv_heads", "kv_len", "head_dim")
        ),
        "v": Tensor(
            ("kv_len", "num_kv_heads", "head_dim"), hnd_dims=("num_kv_heads", "kv_len", "head_dim")
        ),
        "sm_scale": _sm_scale(False),
    },
    outputs={
        "output": Tensor(("num_qo_heads", "head_dim"), dtype_from="q"),
        "lse": Tensor(("num_qo_heads",), dtype="float32", optional=True, description=_LSE),
    },
    tags=("stage:decode", "status:verified"),
    reference=ref.attention,
)

single_prefill_with_kv_cache_trace = TraceTemplate(
    op_type="gqa_single",
    name_prefix="gqa_single_prefill",
    description="Prefill attention of one request (causal aligned to the bottom right).",
    axes={"qo_len": Var(), "kv_len": Var(), **_PREFILL_HEADS},
    inputs={
        "q": Tensor(("qo_len", "num_qo_heads", "head_dim")),
        "k": Tensor(
            ("kv_len", "num_kv_heads", "head_dim"), hnd_dims=("num_kv_heads", "kv_len", "head_dim")
        ),
        "v": Tensor(
            ("kv_len", "num_kv_heads", "head_dim_vo"),
            hnd_dims=("num_kv_heads", "kv_len", "head_dim_vo"),
        ),
        "causal": Scalar("bool"),
        "sm_scale": _sm_scale(False),
    },
    outputs={
        "output": Tensor(("qo_len", "num_qo_heads", "head_dim_vo"), dtype_from="q"),
        "lse": Tensor(("qo_len", "num_qo_heads"), dtype="float32", optional=True, description=_LSE),
    },
    tags=("stage:prefill", "status:verified"),
    reference=ref.attention,
)

_DECODE_PLAN = {
    "kv_indptr": "_paged_kv_indptr_buf",
    "kv_indices": "_paged_kv_indices_buf",
    "kv_last_page_len": "_paged_kv_last_page_len_buf",
    "sm_scale": "_sm_scale",
    "kv_layout": "_kv_layout",
}

batch_decode_run_trace = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="gqa_paged_decode",
    description="Batched decode (one query token per request) over a paged KV cache; the page "
    "table is fixed by plan(). BatchDecodeWithPagedKVCacheWrapper.run().",
    axes={
        "batch_size": Var(),
        **_HEADS,
        "num_pages": Var(),
        "page_size": Const(abbrev="ps"),
        "len_indptr": Var(),
        "num_kv_indices": Var(),
    },
    constraints=("len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"),
    inputs={
        "q": Tensor(("batch_size", "num_qo_heads", "head_dim")),
        **_paged_cache(),
        "kv_indptr": _planned(("len_indptr",), "Page offsets per request."),
        "kv_indices": _planned(("num_kv_indices",), "Page ids."),
        "kv_last_page_len": _planned(("batch_size",), "Fill of each request's last page."),
        "sm_scale": _sm_scale(True),
    },
    outputs=_outputs("batch_size"),
    tags=("stage:decode", "status:verified"),
    reference=ref.batch_paged_attention,
    reference_deps=(ref.attention, ref.paged_rows),
    plan_attrs=_DECODE_PLAN,
)

batch_prefill_paged_run_trace = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="gqa_paged_prefill",
    description="Batched prefill over a paged KV cache; qo_indptr, the page table and causal "
    "are fixed by plan(). BatchPrefillWithPagedKVCacheWrapper.run().",
    axes={
        "total_q": Var(),
        **_PREFILL_HEADS,
        "num_pages": Var(),
        "page_size": Const(abbrev="ps"),
        "batch_size": Var(),
        "len_indptr": Var(),
        "num_kv_indices": Var(),
    },
    constraints=(
        "len_indptr == batch_size + 1",
        "total_q == qo_indptr[-1].item()",
        "num_kv_indices == kv_indptr[-1].item()",
    ),
    inputs={
        "q": Tensor(("total_q", "num_qo_heads", "head_dim")),
        **_paged_cache("head_dim_vo"),
        "qo_indptr": _planned(("len_indptr",), "Query offsets per request."),
        "kv_indptr": _planned(("len_indptr",), "Page offsets per request."),
        "kv_indices": _planned(("num_kv_indices",), "Page ids."),
        "kv_last_page_len": _planned(("batch_size",), "Fill of each request's last page."),
        "causal": Scalar("bool", optional=True, description="Set by plan(), not run()."),
        "sm_scale": _sm_scale(True),
    },
    outputs=_outputs("total_q", "head_dim_vo"),
    tags=("stage:prefill", "status:verified"),
    reference=ref.batch_paged_attention,
    reference_deps=(ref.attention, ref.paged_rows),
    plan_attrs={**_DECODE_PLAN, "qo_indptr": "_qo_indptr_buf", "causal": "_causal"},
)

batch_prefill_ragged_run_trace = TraceTemplate(
    op_type="gqa_ragged",
    name_prefix="gqa_ragged",
    description="Batched prefill over ragged K/V; qo_indptr, kv_indptr and causal are fixed "
    "by plan(). BatchPrefillWithRaggedKVCacheWrapper.run().",
    axes={
        "total_q": Var(),
        "total_kv": Var(),
        **_PREFILL_HEADS,
        "batch_size": Var(),
        "len_indptr": Var(),
    },
    constraints=(
        "len_indptr == batch_size + 1",
        "total_q == qo_indptr[-1].item()",
        "total_kv == kv_indptr[-1].item()",
    ),
    inputs={
        "q": Tensor(("total_q", "num_qo_heads", "head_dim")),
        "k": Tensor(("total_kv", "num_kv_heads", "head_dim")),
        "v": Tensor(("total_kv", "num_kv_heads", "head_dim_vo")),
        "qo_indptr": _planned(("len_indptr",), "Query offsets per request."),
        "kv_indptr": _planned(("len_indptr",), "KV offsets per request."),
        "causal": Scalar("bool", optional=True, description="Set by plan(), not run()."),
        "sm_scale": _sm_scale(True),
    },
    outputs=_outputs("total_q", "head_dim_vo"),
    tags=("stage:prefill", "status:verified"),
    reference=ref.batch_ragged_attention,
    reference_deps=(ref.attention,),
    plan_attrs={
        "qo_indptr": "_qo_indptr_buf",
        "kv_indptr": "_kv_indptr_buf",
        "causal": "_causal",
        "sm_scale": "_sm_scale",
    },
)
