"""Merging attention states computed over disjoint sets of keys.

A state is ``(v, s)``: ``v`` the attention output over the set, ``s`` the log-sum-exp of
its scores in **base 2** (``torch.logsumexp(q.k * sm_scale) / ln 2``), as in the reference
library and as ``return_lse=True`` gives it in :mod:`flashinfer.decode`, so states from
either library merge. Merging is exact: ``s = log2(2**s_a + 2**s_b)``,
``v = 2**(s_a - s) * v_a + 2**(s_b - s) * v_b``. A state with ``s = -inf`` (no keys)
contributes nothing. ``s`` of another float dtype is cast to float32, as the reference does.
Math in float32.

:class:`MultiLevelCascadeAttentionWrapper` runs prefill attention over each level of a
shared-prefix page table and merges the levels' states with these functions.

The merges are torch custom ops (``torch.ops.flashinfer.merge_state``,
``merge_state_in_place``, ``merge_states``; see docs/compile.md).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

from . import checks, ragged
from .api_logging import flashinfer_api
from .attention_args import MAX_GRID_Y, check_workspace
from .custom_op import kernel_op
from .jit.decode import gen_cascade_module
from .prefill import BatchPrefillWithPagedKVCacheWrapper, _check_options, _host_indptr
from .trace.templates import cascade as _trace

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LSE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_HEAD_DIM = 512
MAX_LEVELS = 64  # shared-prefix levels of one wrapper; engines use 2 or 3


@functools.cache
def get_cascade_module(dtype: Any):  # noqa: ANN201 - a tvm_ffi.Module
    """The state-merging module for ``dtype``, compiled on first use."""
    return gen_cascade_module(dtype).build_and_load()


def _check_state(v_name: str, v: Any, s_name: str, s: Any, rank: int, layout: str) -> None:
    checks.check_tensor(v_name, v)
    checks.check_tensor(s_name, s)
    checks.check_ndim(v_name, v, rank, layout)
    checks.check_ndim(s_name, s, rank - 1, f"{layout} without head_dim")
    checks.check_dtype(v_name, v, DTYPES)
    checks.check_dtype(s_name, s, _LSE_DTYPES)
    if tuple(s.shape) != tuple(v.shape[:-1]):
        raise ValueError(
            f"{s_name} has shape {tuple(s.shape)}, expected {tuple(v.shape[:-1])} "
            f"(the shape of {v_name} without head_dim)"
        )
    if v.shape[-1] > _MAX_HEAD_DIM:
        raise ValueError(f"{v_name} has head_dim {v.shape[-1]} > {_MAX_HEAD_DIM}")
    # the merge's grid: positions along x (< 2^31), heads along y (<= 65535)
    if v.shape[0] > ragged.INT32_MAX:
        raise ValueError(f"{v_name} has {v.shape[0]} positions > {ragged.INT32_MAX}")
    if v.shape[-2] > MAX_GRID_Y:
        raise ValueError(f"{v_name} has {v.shape[-2]} heads > {MAX_GRID_Y}")


def _check_pair(names: tuple[str, str, str, str], v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> None:
    """Two states of the same shape; ``names`` are the caller's parameter names."""
    layout = "[seq_len, num_heads, head_dim]"
    _check_state(names[0], v_a, names[1], s_a, 3, layout)
    _check_state(names[2], v_b, names[3], s_b, 3, layout)
    if v_b.shape != v_a.shape:
        raise ValueError(
            f"{names[2]} has shape {tuple(v_b.shape)}, {names[0]} has {tuple(v_a.shape)}"
        )
    checks.check_same_dtype(names[2], v_b, names[0], v_a)


def _check_devices(names: tuple[str, ...], *tensors: torch.Tensor) -> None:
    """All on one CUDA device (after every shape check, so each mistake has its message)."""
    checks.check_cuda(names[0], tensors[0])
    for name, t in zip(names[1:], tensors[1:]):
        checks.check_cuda(name, t, like=tensors[0])


@flashinfer_api(trace=_trace.merge_state_trace)
def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two states: ``v`` ``[seq_len, num_heads, head_dim]`` (fp16/bf16/fp32) and
    ``s`` ``[seq_len, num_heads]`` (base-2 LSE). Returns the merged ``(v, s)``, ``s``
    float32."""
    names = ("v_a", "s_a", "v_b", "s_b")
    _check_pair(names, v_a, s_a, v_b, s_b)
    _check_devices(names, v_a, s_a, v_b, s_b)
    v_out = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    s_out = torch.empty(s_a.shape, dtype=torch.float32, device=v_a.device)
    _merge_state_op(v_a.contiguous(), _as_lse(s_a), v_b.contiguous(), _as_lse(s_b), v_out, s_out)
    return v_out, s_out


@kernel_op("merge_state", mutates_args=("v_out", "s_out"))
def _merge_state_op(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    v_out: torch.Tensor,
    s_out: torch.Tensor,
) -> None:
    """merge_state's launch: contiguous states, float32 LSEs."""
    get_cascade_module(v_a.dtype).merge_state(v_a, s_a, v_b, s_b, v_out, s_out, None, False)


@flashinfer_api(trace=_trace.merge_state_in_place_trace)
def merge_state_in_place(
    v: torch.Tensor,
    s: torch.Tensor,
    v_other: torch.Tensor,
    s_other: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> None:
    """``(v, s) <- merge((v, s), (v_other, s_other))`` in place, at the positions where
    ``mask`` (``[seq_len]`` bool) is true (everywhere without a mask). ``v`` and ``s``
    must be contiguous; an ``s`` that is not float32 is merged in float32 and written back
    in its own dtype."""
    names = ("v", "s", "v_other", "s_other")
    _check_pair(names, v, s, v_other, s_other)
    if not (v.is_contiguous() and s.is_contiguous()):
        raise ValueError("v and s are updated in place and must be contiguous")
    if mask is not None:
        checks.check_tensor("mask", mask)
        checks.check_ndim("mask", mask, 1, "[seq_len]")
        checks.check_dtype("mask", mask, (torch.bool, torch.uint8))
        if mask.shape[0] != v.shape[0]:
            raise ValueError(f"mask has {mask.shape[0]} elements, v has {v.shape[0]} positions")
    _check_devices(names, v, s, v_other, s_other)
    if mask is not None:
        checks.check_cuda("mask", mask, like=v)
        mask = mask.contiguous()
    s32 = _as_lse(s)
    _merge_state_in_place_op(v, s32, v_other.contiguous(), _as_lse(s_other), mask)
    if s32 is not s:
        s.copy_(s32)


@kernel_op("merge_state_in_place", mutates_args=("v", "s"))
def _merge_state_in_place_op(
    v: torch.Tensor,
    s: torch.Tensor,
    v_other: torch.Tensor,
    s_other: torch.Tensor,
    mask: torch.Tensor | None,
) -> None:
    """merge_state_in_place's launch: ``(v, s)`` updated where ``mask`` is true, ``s``
    float32."""
    get_cascade_module(v.dtype).merge_state(v, s, v_other, s_other, v, s, mask, True)


@flashinfer_api(trace=_trace.merge_states_trace)
def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``num_states`` states per position: ``v`` ``[seq_len, num_states, num_heads,
    head_dim]``, ``s`` ``[seq_len, num_states, num_heads]``. Returns ``(v, s)`` with the
    states dim merged away."""
    _check_state("v", v, "s", s, 4, "[seq_len, num_states, num_heads, head_dim]")
    _check_devices(("v", "s"), v, s)
    seq, _, heads, dim = v.shape
    v_out = torch.empty((seq, heads, dim), dtype=v.dtype, device=v.device)
    s_out = torch.empty((seq, heads), dtype=torch.float32, device=v.device)
    _merge_states_op(v.contiguous(), _as_lse(s), v_out, s_out)
    return v_out, s_out


@kernel_op("merge_states", mutates_args=("v_out", "s_out"))
def _merge_states_op(
    v: torch.Tensor, s: torch.Tensor, v_out: torch.Tensor, s_out: torch.Tensor
) -> None:
    """merge_states' launch: contiguous states, float32 LSEs."""
    get_cascade_module(v.dtype).merge_states(v, s, v_out, s_out)


def _as_lse(s: torch.Tensor) -> torch.Tensor:
    """``s`` as the kernels read it: contiguous float32 (itself when it already is)."""
    return s.to(torch.float32).contiguous()


def _per_level(name: str, value: Any, num_levels: int) -> list[Any]:
    """One entry per level, as a list."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list with one entry per level, got {type(value).__name__}"
        )
    if len(value) != num_levels:
        raise ValueError(f"{name} has {len(value)} entries; num_levels is {num_levels}")
    return list(value)


@contextlib.contextmanager
def _level(index: int) -> Iterator[None]:
    """An argument error of one level's wrapper names the level it came from."""
    try:
        yield
    except TypeError as err:
        raise TypeError(f"level {index}: {err}") from err
    except ValueError as err:
        raise ValueError(f"level {index}: {err}") from err


def _check_disjoint(name: str, buffers: list[torch.Tensor]) -> None:
    """Each level uploads its schedule to the start of its own int workspace; two levels
    sharing one would read each other's schedule."""
    spans = [(t.device, t.data_ptr(), t.data_ptr() + t.nbytes) for t in buffers]
    for j, (device_j, start_j, end_j) in enumerate(spans):
        for i, (device_i, start_i, end_i) in enumerate(spans[:j]):
            if device_i == device_j and start_i < end_j and start_j < end_i:
                raise ValueError(
                    f"{name}[{i}] and {name}[{j}] overlap: each level keeps its "
                    "schedule in its own int workspace"
                )


class MultiLevelCascadeAttentionWrapper:
    """Attention over KV caches shared at several levels (a prefix shared by the whole batch,
    prefixes shared by groups of requests, each request's own tokens), all pages of one
    paged cache. Level ``i`` is a batch of its own: ``qo_indptr_arr[i]`` groups the query
    rows of ``q`` (the same rows at every level, so ``qo_indptr_arr[i][-1]`` is the same),
    and each group attends to its pages at that level. Each level runs as a
    :class:`~flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper` and the states are
    merged with :func:`merge_state_in_place`, so the result is attention over each
    request's keys of all levels. ``causal`` applies to the last level only (its queries
    are the newest tokens; earlier levels are wholly visible); the other score options
    apply to every level, ``window_left`` counted within each level's keys, as in the
    reference.

    The level wrappers share ``float_workspace_buffer``, as in the reference: a level's
    partial states live there only inside its own ``run()`` (its kernel writes them and its
    merge consumes them before the next level is launched on the stream), so the levels,
    which run one after another, never see each other's. Each level keeps its schedule in
    its own int workspace. With ``use_cuda_graph=True`` level ``i`` uses entry ``i`` of
    each ``*_buf_arr`` as its fixed buffers (see the prefill wrapper); without it the
    buffer arrays are ignored, as in the reference.
    """

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_indptr_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_indices_buf_arr: list[torch.Tensor] | None = None,
        paged_kv_last_page_len_buf_arr: list[torch.Tensor] | None = None,
    ) -> None:
        # Each level is a prefill wrapper with its own int workspace (8 MiB, and pinned host
        # memory): a number meant as something else would allocate for minutes.
        checks.check_int("num_levels", num_levels, 1, MAX_LEVELS)
        check_workspace("float_workspace_buffer", float_workspace_buffer)
        checks.check_kv_layout(kv_layout)
        checks.check_bool("use_cuda_graph", use_cuda_graph)
        if use_cuda_graph:
            arrays = {
                "qo_indptr_buf_arr": qo_indptr_buf_arr,
                "paged_kv_indptr_buf_arr": paged_kv_indptr_buf_arr,
                "paged_kv_indices_buf_arr": paged_kv_indices_buf_arr,
                "paged_kv_last_page_len_buf_arr": paged_kv_last_page_len_buf_arr,
            }
            for name, value in arrays.items():
                if value is None:
                    raise ValueError(
                        f"use_cuda_graph=True needs {name} (each level's fixed-size buffer)"
                    )
            level_buffers = list(
                zip(*(_per_level(name, value, num_levels) for name, value in arrays.items()))
            )
        else:
            level_buffers = [(None, None, None, None)] * num_levels
        self._batch_prefill_wrappers: list[BatchPrefillWithPagedKVCacheWrapper] = []
        for i, (qo_buf, indptr_buf, indices_buf, last_buf) in enumerate(level_buffers):
            with _level(i):
                self._batch_prefill_wrappers.append(
                    BatchPrefillWithPagedKVCacheWrapper(
                        float_workspace_buffer,
                        kv_layout,
                        use_cuda_graph,
                        qo_indptr_buf=qo_buf,
                        paged_kv_indptr_buf=indptr_buf,
                        paged_kv_indices_buf=indices_buf,
                        paged_kv_last_page_len_buf=last_buf,
                    )
                )
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._planned = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def __repr__(self) -> str:
        """What API logs show for the wrapper: its levels and whether it is planned."""
        return (
            f"MultiLevelCascadeAttentionWrapper(num_levels={self._num_levels}, "
            f"kv_layout={self._kv_layout!r}, use_cuda_graph={self._use_cuda_graph}, "
            f"{'planned' if self._planned else 'not planned'})"
        )

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffers: list[torch.Tensor]
    ) -> None:
        """Use new workspaces: the float one shared by every level, one int workspace per
        level (not overlapping). The next ``run()`` needs a new ``plan()``."""
        buffers = _per_level("int_workspace_buffers", int_workspace_buffers, self._num_levels)
        check_workspace("float_workspace_buffer", float_workspace_buffer)
        for i, buffer in enumerate(buffers):
            check_workspace(f"int_workspace_buffers[{i}]", buffer)
        _check_disjoint("int_workspace_buffers", buffers)
        for wrapper, buffer in zip(self._batch_prefill_wrappers, buffers):
            wrapper.reset_workspace_buffer(float_workspace_buffer, buffer)
        self._planned = False

    @flashinfer_api
    def plan(
        self,
        qo_indptr_arr: list[torch.Tensor],
        paged_kv_indptr_arr: list[torch.Tensor],
        paged_kv_indices_arr: list[torch.Tensor],
        paged_kv_last_page_len: list[torch.Tensor],
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
    ) -> None:
        """Plan every level: entry ``i`` of each array is level ``i``'s page table (as the
        prefill wrapper's ``plan`` takes it). The options are checked once, before any level
        is planned; a level's error names the level. A ``plan()`` that raises after that
        leaves the wrapper unplanned (the earlier levels already hold the new batch)."""
        n = self._num_levels
        tables = [
            _per_level(name, value, n)
            for name, value in (
                ("qo_indptr_arr", qo_indptr_arr),
                ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                ("paged_kv_indices_arr", paged_kv_indices_arr),
                ("paged_kv_last_page_len", paged_kv_last_page_len),
            )
        ]
        _check_options(
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim,
            head_dim_vo=None,
            head_dim_name="head_dim",
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            o_data_type=None,
            non_blocking=True,
            prefix_len_ptr=None,
            token_pos_in_items_ptr=None,
            token_pos_in_items_len=0,
            max_item_len_ptr=None,
            fixed_split_size=None,
            disable_split_kv=False,
        )
        checks.check_int("page_size", page_size, 1, ragged.INT32_MAX)
        total_q = [
            _host_indptr(f"qo_indptr_arr[{i}]", t, None)[-1] for i, t in enumerate(qo_indptr_arr)
        ]
        for i, total in enumerate(total_q):
            if total != total_q[0]:
                raise ValueError(
                    f"qo_indptr_arr[{i}][-1] is {total}, qo_indptr_arr[0][-1] is "
                    f"{total_q[0]}: every level covers the same rows of q"
                )
        self._planned = False
        for i, (wrapper, *table) in enumerate(zip(self._batch_prefill_wrappers, *tables)):
            with _level(i):
                wrapper.plan(
                    *table,
                    num_qo_heads,
                    num_kv_heads,
                    head_dim,
                    page_size,
                    causal=causal and i == n - 1,
                    pos_encoding_mode=pos_encoding_mode,
                    use_fp16_qk_reduction=use_fp16_qk_reduction,
                    sm_scale=sm_scale,
                    window_left=window_left,
                    logits_soft_cap=logits_soft_cap,
                    rope_scale=rope_scale,
                    rope_theta=rope_theta,
                    q_data_type=q_data_type,
                    kv_data_type=kv_data_type,
                )
        self._planned = True

    begin_forward = plan

    @flashinfer_api
    def prewarm_paged_kv_stride_variant(self, variant: str = "independent") -> None:
        """The reference compiles a kernel variant for K and V caches with different strides
        ahead of CUDA-graph capture; ours takes the K and V strides separately in every
        launch, so after checking the call as the reference does there is nothing to do."""
        if variant != "independent":
            raise ValueError(
                f"variant must be 'independent' (K and V with different strides), got {variant!r}"
            )
        if not self._planned:
            raise RuntimeError("call plan() before prewarm_paged_kv_stride_variant()")

    @flashinfer_api(trace=_trace.cascade_run_trace)
    def run(
        self, q: torch.Tensor, paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """``q`` ``[qo_indptr_arr[i][-1], num_qo_heads, head_dim]``; ``paged_kv_cache`` in
        any form the prefill wrapper takes (a ``(k, v)`` pair of 4-D page tensors or one
        ``[num_pages, 2, ...]`` tensor). Returns the attention output, like q. The last level
        runs first and holds the running state; each other level's state is merged into it
        (through one scratch state reused by every level)."""
        if not self._planned:
            raise RuntimeError("call plan() before run()")
        *prefix_levels, last = self._batch_prefill_wrappers
        out, lse = last.run(q, paged_kv_cache, return_lse=True)
        if prefix_levels:
            level_out, level_lse = torch.empty_like(out), torch.empty_like(lse)
            for wrapper in prefix_levels:
                wrapper.run(q, paged_kv_cache, out=level_out, lse=level_lse)
                merge_state_in_place(out, lse, level_out, level_lse)
        return out

    forward = run
