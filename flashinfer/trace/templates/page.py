"""Templates of the paged KV-cache family (flashinfer/page.py)."""

from __future__ import annotations

from ...testing import reference as ref
from ..template import Const, Scalar, Tensor, TraceTemplate, Var

_CACHE = ("num_pages", "page_size", "num_kv_heads", "head_dim")
_CACHE_HND = ("num_pages", "num_kv_heads", "page_size", "head_dim")

append_paged_kv_cache_trace = TraceTemplate(
    op_type="append_paged_kv_cache",
    name_prefix="append_paged_kv_cache",
    description="Write appended keys/values into a paged KV cache at (batch_indices, positions).",
    axes={
        "nnz": Var("Appended tokens."),
        "num_kv_heads": Const(abbrev="kv"),
        "head_dim": Const(abbrev="d"),
        "num_pages": Var(),
        "page_size": Const(abbrev="ps"),
        "batch_size": Var(),
        "len_indptr": Var(),
        "num_kv_indices": Var(),
    },
    constraints=("len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"),
    inputs={
        "append_key": Tensor(("nnz", "num_kv_heads", "head_dim")),
        "append_value": Tensor(("nnz", "num_kv_heads", "head_dim")),
        "batch_indices": Tensor(("nnz",)),
        "positions": Tensor(("nnz",)),
        "k_cache": Tensor(_CACHE, param="paged_kv_cache", tuple_idx=0, hnd_dims=_CACHE_HND),
        "v_cache": Tensor(_CACHE, param="paged_kv_cache", tuple_idx=1, hnd_dims=_CACHE_HND),
        "kv_indices": Tensor(("num_kv_indices",)),
        "kv_indptr": Tensor(("len_indptr",)),
        "kv_last_page_len": Tensor(("batch_size",)),
    },
    outputs={
        "k_cache": Tensor(
            _CACHE,
            param="paged_kv_cache",
            tuple_idx=0,
            hnd_dims=_CACHE_HND,
            dtype_from="append_key",
            description="Updated in place.",
        ),
        "v_cache": Tensor(
            _CACHE,
            param="paged_kv_cache",
            tuple_idx=1,
            hnd_dims=_CACHE_HND,
            dtype_from="append_key",
            description="Updated in place.",
        ),
    },
    tags=("status:verified",),
    reference=ref.append_paged_kv_cache,
)

get_seq_lens_trace = TraceTemplate(
    op_type="get_seq_lens",
    name_prefix="get_seq_lens",
    description="Each request's KV length from its page count and last page's fill.",
    axes={"batch_size": Var(), "len_indptr": Var(), "page_size": Const(abbrev="ps")},
    constraints=("len_indptr == batch_size + 1",),
    inputs={
        "kv_indptr": Tensor(("len_indptr",)),
        "kv_last_page_len": Tensor(("batch_size",)),
        "page_size": Scalar("int32"),
    },
    outputs={"seq_lens": Tensor(("batch_size",), dtype_from="kv_last_page_len")},
    tags=("status:verified",),
    reference=ref.seq_lens,
)

get_batch_indices_positions_trace = TraceTemplate(
    op_type="get_batch_indices_positions",
    name_prefix="get_batch_indices_positions",
    description="Each appended token's request and KV position.",
    axes={"nnz": Var(), "batch_size": Var(), "len_indptr": Var()},
    constraints=("len_indptr == batch_size + 1",),
    inputs={
        "append_indptr": Tensor(("len_indptr",)),
        "seq_lens": Tensor(("batch_size",)),
        "nnz": Scalar("int32"),
    },
    outputs={
        "batch_indices": Tensor(("nnz",), param="batch_indices", dtype="int32"),
        "positions": Tensor(("nnz",), param="positions", dtype="int32"),
    },
    tags=("status:verified",),
    reference=ref.batch_indices_positions,
)
