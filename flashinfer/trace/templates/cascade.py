"""Templates of the cascade family (flashinfer/cascade.py)."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Tensor, TraceTemplate, Var
from .attention import _PAGED, _PAGED_HND

_AXES = {"seq_len": Var(), "num_heads": Const(abbrev="h"), "head_dim": Const(abbrev="d")}
_V = ("seq_len", "num_heads", "head_dim")
_S = ("seq_len", "num_heads")
_MERGED = "States merged: v weighted by 2^(s - s_merged); s_merged = log2(sum 2^s)."

merge_state_trace = TraceTemplate(
    op_type="merge_state",
    name_prefix="merge_state",
    description=_MERGED,
    axes=_AXES,
    inputs={"v_a": Tensor(_V), "s_a": Tensor(_S), "v_b": Tensor(_V), "s_b": Tensor(_S)},
    outputs={"v_merged": Tensor(_V, dtype_from="v_a"), "s_merged": Tensor(_S, dtype="float32")},
    tags=("status:verified",),
    reference=ref.merge_state,
    reference_deps=(ref.merge_states,),
)

merge_state_in_place_trace = TraceTemplate(
    op_type="merge_state",
    name_prefix="merge_state_in_place",
    description=_MERGED + " Written into v and s; rows where mask is False keep theirs.",
    axes=_AXES,
    inputs={
        "v": Tensor(_V),
        "s": Tensor(_S),
        "v_other": Tensor(_V),
        "s_other": Tensor(_S),
        "mask": Tensor(("seq_len",), optional=True),
    },
    outputs={
        "v": Tensor(_V, param="v", dtype_from="v"),
        "s": Tensor(_S, param="s", dtype_from="s"),
    },
    tags=("status:verified",),
    reference=ref.merge_state,
    reference_deps=(ref.merge_states,),
)

merge_states_trace = TraceTemplate(
    op_type="merge_state",
    name_prefix="merge_states",
    description="num_states attention states per row merged into one.",
    axes={
        "seq_len": Var(),
        "num_states": Var(),
        "num_heads": Const(abbrev="h"),
        "head_dim": Const(abbrev="d"),
    },
    inputs={
        "v": Tensor(("seq_len", "num_states", "num_heads", "head_dim")),
        "s": Tensor(("seq_len", "num_states", "num_heads")),
    },
    outputs={"v_merged": Tensor(_V, dtype_from="v"), "s_merged": Tensor(_S, dtype="float32")},
    tags=("status:verified",),
    reference=ref.merge_states,
)

cascade_run_trace = TraceTemplate(
    op_type="gqa_paged",
    name_prefix="cascade_paged",
    description="Multi-level cascade attention: each request attends to the pages of every "
    "level (shared prefixes first), as one paged prefill over the concatenated page "
    "tables. MultiLevelCascadeAttentionWrapper.run().",
    axes={
        "total_q": Var(),
        "num_qo_heads": Const(abbrev="h"),
        "num_kv_heads": Const(abbrev="kv"),
        "head_dim": Const(abbrev="d"),
        "num_pages": Var(),
        "page_size": Const(abbrev="ps"),
    },
    inputs={
        "q": Tensor(("total_q", "num_qo_heads", "head_dim")),
        "k_cache": Tensor(_PAGED, param="paged_kv_cache", tuple_idx=0, hnd_dims=_PAGED_HND),
        "v_cache": Tensor(_PAGED, param="paged_kv_cache", tuple_idx=1, hnd_dims=_PAGED_HND),
    },
    outputs={"output": Tensor(("total_q", "num_qo_heads", "head_dim"), dtype_from="q")},
    tags=("stage:prefill", "cascade", "status:verified"),
    reference=ref.batch_paged_attention,
    reference_deps=(ref.attention, ref.paged_rows),
    plan_attrs={"kv_layout": "_kv_layout"},
)
