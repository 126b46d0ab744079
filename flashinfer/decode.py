"""Decode attention: one query token per request against its KV cache.

``score = q.k * sm_scale`` (``sm_scale`` defaults to ``1/sqrt(head_dim)``, times ``q_scale``
and ``k_scale`` when given); with ``logits_soft_cap = c > 0`` the score becomes
``c * tanh(score / c)``. With ``window_left = w >= 0`` a request attends to its last
``w + 1`` keys only. ``pos_encoding_mode="ROPE_LLAMA"`` rotates q (at the request's last
position) and each key (at its index in the request) inside the kernel, as the reference
does (``rope_scale``/``rope_theta``, defaults 1 and 1e4); ``"ALIBI"`` adds the query head's
ALiBi slope times the key's index (:mod:`flashinfer.alibi`) to its score. The output is
multiplied by ``v_scale`` when given. ``lse`` is the log-sum-exp of the scores in **base 2**
(``log2(sum(exp(score)))``), as in the reference library, so states merge with theirs (see
:mod:`flashinfer.cascade`). q and the output share one dtype, float16 or bfloat16; the KV
cache is q's dtype or fp8 (``float8_e4m3fn``, ``float8_e5m2``: either kernel widens it,
``k_scale``/``v_scale`` dequantize as above); head_dim 64, 128 or 256;
``num_qo_heads`` a multiple of ``num_kv_heads`` (GQA). Long requests are split across the
GPU and merged (see :mod:`flashinfer.decode_schedule`). With ``use_tensor_cores=True`` decode
runs on the prefill kernel instead (see :mod:`flashinfer.prefill`): each request is one query
token, and the tile's rows hold its GQA group, which pays off for large groups.

Each launch is a torch custom op (``torch.ops.flashinfer.single_decode_with_kv_cache``,
``batch_decode_with_paged_kv_cache``; see docs/compile.md): the APIs check and allocate in
traceable torch code and make one op call. ``plan()`` stays on the host; ``run()`` passes
the planned buffers (schedule words, scratch, page table) and scalars to the op, so a
compiled model traces it without a graph break.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from . import checks, prefill, ragged
from .api_logging import flashinfer_api
from .attention_args import (
    BACKENDS,
    DTYPES,
    INDEX,
    INT_WORKSPACE_BYTES,
    WorkspaceOwner,
    alibi_slopes_for,
    apply_v_scale,
    check_alibi_cap,
    check_dtype_name,
    check_heads,
    check_kv_dtype,
    check_kv_tensor_dtypes,
    check_optional_number,
    check_out_dtype,
    check_output,
    check_pos_encoding,
    check_rope,
    check_score_args,
    check_vectors,
    check_window,
    check_workspace,
    copy_prefix,
    pinned_like,
    rope_params,
    score_params,
    to_device,
)
from .custom_op import is_symbolic, kernel_op
from .decode_schedule import (
    DecodeSchedule,
    kv_lengths,
    pack_schedule,
    plan_decode_schedule,
)
from .jit.decode import HEAD_DIMS, gen_decode_module
from .jit.kv_dtype import check_rope_cache
from .module_plan import (
    DecodePlanArgs,
    ModulePlan,
    PlanArgs,
    cuda_core_plan_args,
    tensor_core_plan_args,
)
from .page import get_seq_lens as get_seq_lens  # engines import it from here
from .paged_kv import check_paged_kv_cache
from .pdl import resolve_enable_pdl
from .trace.templates import attention as _trace
from .trtllm import (  # engines import it from here
    trtllm_batch_decode_with_kv_cache as trtllm_batch_decode_with_kv_cache,
)
from .utils import _get_range_buf as _get_range_buf  # engines import it from here
from .utils import get_device_sm_count

# A bound on resident CTAs per SM (the hardware's), for CUDA-graph buffer capacities.
_MAX_CTAS_PER_SM = 32
# plan()'s optional arguments after page_size, in the order the reference's deprecated
# positional form takes them.
_LEGACY_PLAN_ARGS = (
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "q_data_type",
    "kv_data_type",
    "o_data_type",
    "data_type",
    "sm_scale",
    "rope_scale",
    "rope_theta",
    "non_blocking",
    "block_tables",
    "seq_lens",
    "fixed_split_size",
    "disable_split_kv",
    "q_len_per_req",
)
# The same before the reference added o_data_type, as engines pinned to those releases pass
# it (vLLM's fast_plan_decode: 10 or 14 of them).
_LEGACY_PLAN_ARGS_BEFORE_O_DTYPE = tuple(n for n in _LEGACY_PLAN_ARGS if n != "o_data_type")


def _legacy_plan_names(args: tuple[Any, ...]) -> tuple[str, ...]:
    """The positional order ``args`` follow. The older one shows where today's takes no such
    value: a number where today's has data_type (sm_scale then), or a bool where today's
    has rope_theta (non_blocking then); either way today's order could not bind them."""
    older = (len(args) > 6 and checks.is_real_number(args[6])) or (
        len(args) > 9 and isinstance(args[9], bool)
    )
    return _LEGACY_PLAN_ARGS_BEFORE_O_DTYPE if older else _LEGACY_PLAN_ARGS


@functools.cache
def get_decode_module(  # noqa: ANN201
    dtype: Any, head_dim: int, pos_encoding: str = "NONE", kv_dtype: Any = None
):
    """The decode module (a tvm_ffi.Module) for ``dtype`` x ``head_dim``, built for
    ``pos_encoding`` (a pos_encoding_mode) and a KV cache of ``kv_dtype`` (None: ``dtype``),
    compiled on first use."""
    return gen_decode_module(dtype, head_dim, pos_encoding, kv_dtype).build_and_load()


@functools.cache
def _max_ctas(
    dtype: torch.dtype,
    head_dim: int,
    group: int,
    device: torch.device,
    pos_encoding: str,
    kv_dtype: torch.dtype,
) -> int:
    """CTAs of the decode kernel the device holds at once for this group size."""
    with torch.cuda.device(device):
        per_sm = get_decode_module(dtype, head_dim, pos_encoding, kv_dtype).blocks_per_sm(group)
    return get_device_sm_count(device) * max(1, int(per_sm))


def _check_heads(num_qo_heads: Any, num_kv_heads: Any, head_dim: Any, **names: str) -> int:
    """The GQA group size, after the shared checks (``names`` as :func:`check_heads` takes
    them) and the decode block's limit."""
    group = check_heads(num_qo_heads, num_kv_heads, head_dim, HEAD_DIMS, **names)
    if group * head_dim // 8 > 1024:
        raise ValueError(
            f"GQA group size {group} is too large for head_dim {head_dim}: a "
            f"block would need {group * head_dim // 8} > 1024 threads"
        )
    return group


@flashinfer_api(trace=_trace.single_decode_with_kv_cache_trace)
def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query ``q`` ``[num_qo_heads, head_dim]`` over ``k``/``v``
    ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
    (HND). Returns ``out`` like q, and ``lse`` ``[num_qo_heads]`` (base 2) with
    ``return_lse``. ``use_tensor_cores=True`` runs a single prefill of one query token, as
    the reference does."""
    hnd = checks.check_kv_layout(kv_layout)
    pos_encoding = check_pos_encoding(pos_encoding_mode)
    checks.check_bool("use_tensor_cores", use_tensor_cores)
    checks.check_tensor("q", q)
    checks.check_ndim("q", q, 2, "[num_qo_heads, head_dim]")
    checks.check_dtype("q", q, DTYPES)
    layout = "[num_kv_heads, kv_len, head_dim]" if hnd else "[kv_len, num_kv_heads, head_dim]"
    for name, t in (("k", k), ("v", v)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, f"{layout} ({kv_layout})")
        checks.check_last_dim_contiguous(name, t)
    check_kv_tensor_dtypes(k, v, q)
    check_rope_cache(k.dtype, pos_encoding)
    if v.shape != k.shape:
        raise ValueError(f"v has shape {tuple(v.shape)}, k has {tuple(k.shape)}")
    kv_heads, kv_len = (k.shape[0], k.shape[1]) if hnd else (k.shape[1], k.shape[0])
    num_qo_heads, head_dim = q.shape
    if k.shape[2] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[2]}, q has {head_dim}")
    (prefill._check_heads if use_tensor_cores else _check_heads)(
        num_qo_heads,
        kv_heads,
        head_dim,
        kv_heads_from=f"k.shape[{0 if hnd else 1}] with kv_layout={kv_layout!r}",
    )
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_vectors(name, t)
    scale, cap = score_params(head_dim, sm_scale, logits_soft_cap, q_scale, k_scale)
    check_alibi_cap(pos_encoding, cap)
    v_scale = check_optional_number("v_scale", v_scale)
    rope_rcp_scale, rope_rcp_theta = rope_params(rope_scale, rope_theta)
    window_left = check_window(window_left)
    checks.check_bool("return_lse", return_lse)
    checks.check_cuda("q", q)
    checks.check_cuda("k", k, like=q)
    checks.check_cuda("v", v, like=q)

    if use_tensor_cores:
        # q_scale folds into sm_scale: single prefill takes no q_scale
        prefill_scale = (1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale) * (
            1.0 if q_scale is None else q_scale
        )
        result = prefill.single_prefill_with_kv_cache(
            q.unsqueeze(0),
            k,
            v,
            kv_layout=kv_layout,
            sm_scale=prefill_scale,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            pos_encoding_mode=pos_encoding_mode,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            return_lse=return_lse,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        if return_lse:
            return result[0].squeeze(0), result[1].squeeze(0)
        return result.squeeze(0)
    out = torch.empty((num_qo_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty(num_qo_heads, dtype=torch.float32, device=q.device) if return_lse else None
    _single_decode_op(
        q,
        k,
        v,
        out,
        lse,
        hnd,
        window_left,
        scale,
        cap,
        pos_encoding,
        rope_rcp_scale,
        rope_rcp_theta,
        alibi_slopes_for(pos_encoding, num_qo_heads, q),
    )
    apply_v_scale(out, v_scale)
    return (out, lse) if return_lse else out


@kernel_op("single_decode_with_kv_cache", mutates_args=("out", "lse"))
def _single_decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    hnd: bool,
    window_left: int,
    score_scale: float,
    score_cap: float,
    pos_encoding: str,
    rope_rcp_scale: float,
    rope_rcp_theta: float,
    alibi_slopes: torch.Tensor | None,
) -> None:
    """single_decode_with_kv_cache's launch. The split of the KV across the device and the
    scratch for its partial states are decided here, where the device is known."""
    num_qo_heads, head_dim = q.shape
    kv_heads, kv_len = (k.shape[0], k.shape[1]) if hnd else (k.shape[1], k.shape[0])
    group = num_qo_heads // kv_heads
    schedule = plan_decode_schedule(
        [kv_len],
        kv_heads,
        _max_ctas(q.dtype, head_dim, group, q.device, pos_encoding, k.dtype),
        window_left,
    )
    chunks = schedule.num_work
    rows = chunks if chunks > 1 else 0
    tmp_v = torch.empty(
        max(rows * num_qo_heads * head_dim, 1), dtype=torch.float32, device=q.device
    )
    tmp_lse = torch.empty(max(rows * num_qo_heads, 1), dtype=torch.float32, device=q.device)
    get_decode_module(q.dtype, head_dim, pos_encoding, k.dtype).single_decode(
        q,
        k,
        v,
        tmp_v,
        tmp_lse,
        out,
        lse,
        hnd,
        window_left,
        schedule.chunk_size or 1,
        chunks,
        score_scale,
        score_cap,
        rope_rcp_scale,
        rope_rcp_theta,
        alibi_slopes,
        resolve_enable_pdl(None, q.device),
    )


@kernel_op("batch_decode_with_paged_kv_cache", mutates_args=("tmp_v", "tmp_lse", "out", "lse"))
def _batch_decode_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    plan: torch.Tensor,
    tmp_v: torch.Tensor,
    tmp_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    hnd: bool,
    work_capacity: int,
    merge_capacity: int,
    tmp_capacity: int,
    grid_work: int,
    grid_merge: int,
    window_left: int,
    score_scale: float,
    score_cap: float,
    pos_encoding: str,
    rope_rcp_scale: float,
    rope_rcp_theta: float,
    alibi_slopes: torch.Tensor | None,
    enable_pdl: bool | None,
) -> None:
    """BatchDecodeWithPagedKVCacheWrapper.run()'s launch, on the planned schedule (``plan``,
    in the int workspace) and scratch (``tmp_v``/``tmp_lse``, in the float workspace)."""
    get_decode_module(q.dtype, q.shape[-1], pos_encoding, k_cache.dtype).batch_decode(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        plan,
        tmp_v,
        tmp_lse,
        out,
        lse,
        hnd,
        work_capacity,
        merge_capacity,
        tmp_capacity,
        grid_work,
        grid_merge,
        window_left,
        score_scale,
        score_cap,
        rope_rcp_scale,
        rope_rcp_theta,
        alibi_slopes,
        resolve_enable_pdl(enable_pdl, q.device),
    )


@dataclass(frozen=True)
class _Plan:
    """What plan() fixed and run() checks against and launches with."""

    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    kv_dtype: torch.dtype
    schedule: DecodeSchedule
    work_capacity: int
    merge_capacity: int
    tmp_capacity: int
    grid_work: int
    grid_merge: int
    # views: the schedule in the int workspace; partial outputs and their LSEs (float32)
    # in the float workspace
    plan_words: torch.Tensor
    tmp_v: torch.Tensor
    tmp_lse: torch.Tensor


class BatchDecodeWithPagedKVCacheWrapper(WorkspaceOwner):
    """Decode attention for a batch of requests over a paged KV cache.

    ``plan()`` runs on the host once per batch composition: it reads the page table's
    ``indptr`` and ``last_page_len`` (copied to the host, as the reference does), computes
    the split-KV schedule and uploads it into this wrapper's own int workspace with one
    async copy; the float workspace (shareable between wrappers, as in the reference) holds
    only the partial states of one ``run()``. ``run()`` only launches, for every layer of the
    step, and reads the page table from ``_paged_kv_indptr_buf``, ``_paged_kv_indices_buf``
    and ``_paged_kv_last_page_len_buf`` on the device when the kernel runs.

    With ``use_cuda_graph=True`` those are the buffers given to the constructor and the
    batch size is fixed to theirs: ``plan()`` copies into them, and a captured ``run()``
    replays correctly after ``plan()``, or after new values were written into the buffers
    directly (the kernel takes each request's length from them; only the split-KV schedule
    stays the planned one). The score parameters (``_sm_scale``, ``_logits_soft_cap``,
    ``_window_left``) are read at each ``run()``, as in the reference.

    With ``use_tensor_cores=True``, ``plan()`` builds a prefill schedule of ``q_len_per_req``
    query tokens per request (``qo_indptr = arange(batch + 1) * q_len_per_req``; causal,
    bottom-right aligned, when more than one: speculative decoding's draft tokens, already
    appended to the cache) and ``run()`` launches the prefill kernel, as the reference does; a
    :class:`flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper` over this wrapper's
    buffers does both, and everything above holds the same. In CUDA-graph mode the first
    ``plan()`` fixes ``q_len_per_req``.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
    ) -> None:
        workspace = check_workspace("float_workspace_buffer", float_workspace_buffer)
        checks.check_kv_layout(kv_layout)
        checks.check_bool("use_cuda_graph", use_cuda_graph)
        checks.check_bool("use_tensor_cores", use_tensor_cores)
        if backend not in BACKENDS:
            raise ValueError(
                f"backend {backend!r} is not available; this library has "
                f"{', '.join(map(repr, BACKENDS))} (the CUDA-core decode kernel, "
                "or the prefill kernel with use_tensor_cores=True)"
            )
        if jit_args is not None:
            raise ValueError("jit_args (custom attention variants) are not supported")
        self._kv_layout = kv_layout
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._workspace = workspace
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = use_tensor_cores
        self._backend = backend
        self._jit_module = None
        self._fixed_batch_size = 0
        if use_cuda_graph:
            for name, t in (
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            ):
                if t is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (fixed-size buffers)")
                checks.check_index_tensor(name, t, None, (torch.int32,))
                checks.check_cuda(name, t, like=float_workspace_buffer)
            self._fixed_batch_size = paged_kv_last_page_len_buffer.shape[0]
            if paged_kv_indptr_buffer.shape[0] != self._fixed_batch_size + 1:
                raise ValueError(
                    "paged_kv_indptr_buffer must have one more element than "
                    "paged_kv_last_page_len_buffer (batch_size + 1)"
                )
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._prefill: prefill.BatchPrefillWithPagedKVCacheWrapper | None = None
        if use_tensor_cores:
            # Its query indptr is fixed (one token per request); the page-table buffers and
            # the int workspace are this wrapper's own.
            qo_indptr = (
                to_device(
                    torch.arange(self._fixed_batch_size + 1, dtype=torch.int32),
                    float_workspace_buffer,
                    False,
                )
                if use_cuda_graph
                else None
            )
            self._prefill = prefill.BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer,
                kv_layout,
                use_cuda_graph,
                qo_indptr,
                paged_kv_indptr_buffer,
                paged_kv_indices_buffer,
                paged_kv_last_page_len_buffer,
                backend=backend,
            )
            self._int_workspace_buffer = self._prefill._int_workspace_buffer
            self._pin_memory_int_workspace_buffer = self._prefill._pin_memory_int_workspace_buffer
        else:
            self._int_workspace_buffer = float_workspace_buffer.new_empty(
                INT_WORKSPACE_BYTES, dtype=torch.uint8
            )
            self._pin_memory_int_workspace_buffer = pinned_like(self._int_workspace_buffer)
        self._plan_info: _Plan | prefill._Plan | None = None
        self._cached_module = None
        self._pos_encoding_mode = "NONE"
        self._window_left = -1
        self._logits_soft_cap: float | None = None
        self._sm_scale: float | None = None
        self._rope_scale: float | None = None
        self._rope_theta: float | None = None
        self._copy_done: torch.cuda.Event | None = None
        self._q_len_per_req = 1
        self._graph_q_len: int | None = None  # CUDA-graph mode: fixed by the first plan()

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def __repr__(self) -> str:
        """What API logs show for the wrapper: its layout, mode and current plan."""
        plan = self._plan_info
        planned = (
            "not planned"
            if plan is None
            else (
                f"batch={plan.batch}, heads={plan.num_qo_heads}/{plan.num_kv_heads}, "
                f"head_dim={plan.head_dim}, page_size={plan.page_size}, "
                f"dtype={str(plan.dtype).removeprefix('torch.')}, "
                f"kv_dtype={str(self._cached_kv_data_type).removeprefix('torch.')}, "
                f"work_items={plan.schedule.num_work}"
            )
        )
        return (
            f"BatchDecodeWithPagedKVCacheWrapper(kv_layout={self._kv_layout!r}, "
            f"use_cuda_graph={self._use_cuda_graph}, {planned})"
        )

    @flashinfer_api
    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *deprecated_positional_args: Any,
        **kwargs: Any,
    ) -> None:
        """Fix the batch: request ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]``, the
        last filled to ``last_page_len[b]`` (in ``[1, page_size]``). Optional arguments are
        keyword-only (see :meth:`_plan_impl`); passing them positionally, in the reference's
        order (or its order before ``o_data_type``), still works with a DeprecationWarning."""
        if deprecated_positional_args:
            names = _legacy_plan_names(deprecated_positional_args)
            if len(deprecated_positional_args) > len(names):
                raise TypeError(
                    f"plan() takes at most {len(names)} optional "
                    f"positional arguments after page_size, got "
                    f"{len(deprecated_positional_args)}"
                )
            for name, value in zip(names, deprecated_positional_args):
                if name in kwargs:
                    raise TypeError(f"plan() got multiple values for argument {name!r}")
                kwargs[name] = value
            warnings.warn(
                "passing plan()'s optional arguments positionally is deprecated; "
                "pass them by keyword",
                DeprecationWarning,
                stacklevel=3,
            )
        self._plan_impl(
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            **kwargs,
        )

    begin_forward = plan

    def _plan_impl(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        window_right: int = 0,
        logits_soft_cap: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        data_type: Any = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        q_len_per_req: int = 1,
    ) -> None:
        """plan()'s keyword arguments, as the reference names them. ``block_tables`` is
        accepted and unused (the reference uses it only in backends we do not have)."""
        del block_tables
        if window_right != 0:
            raise ValueError(
                f"window_right must be 0 (only a left window is supported), got {window_right!r}"
            )
        self._configure(
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode=pos_encoding_mode,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            o_data_type=o_data_type,
            data_type=data_type,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            non_blocking=non_blocking,
            seq_lens=seq_lens,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
            q_len_per_req=q_len_per_req,
            host_indptr=None,
            read_last_page_len=True,
            copy_buffers=True,
        )

    def _configure(
        self,
        indptr: Any,
        indices: Any,
        last_page_len: Any,
        num_qo_heads: Any,
        num_kv_heads: Any,
        head_dim: Any,
        page_size: Any,
        *,
        pos_encoding_mode: Any,
        window_left: Any,
        logits_soft_cap: Any,
        q_data_type: Any,
        kv_data_type: Any,
        o_data_type: Any,
        data_type: Any,
        sm_scale: Any,
        rope_scale: Any,
        rope_theta: Any,
        non_blocking: Any,
        seq_lens: Any,
        fixed_split_size: Any,
        disable_split_kv: Any,
        q_len_per_req: Any,
        host_indptr: Any,
        read_last_page_len: bool,
        copy_buffers: bool,
    ) -> None:
        """What plan() and fast_decode_plan() share. ``read_last_page_len`` False: schedule
        by whole pages (no device-to-host copy; the kernel reads the real lengths)."""
        checks.check_index_tensor("indptr", indptr, None, INDEX)
        if indptr.shape[0] < 1:
            raise ValueError("indptr needs batch_size + 1 elements")
        batch = indptr.shape[0] - 1
        checks.check_index_tensor("indices", indices, None, INDEX)
        checks.check_index_tensor("last_page_len", last_page_len, batch, INDEX)
        check_heads = _check_heads if self._prefill is None else prefill._check_heads
        group = check_heads(num_qo_heads, num_kv_heads, checks.check_int("head_dim", head_dim, 1))
        checks.check_int("page_size", page_size, 1, ragged.INT32_MAX)
        pos_encoding = check_pos_encoding(pos_encoding_mode)
        window_left = check_window(window_left)
        cap = check_score_args(sm_scale, logits_soft_cap)[1]
        check_alibi_cap(pos_encoding, cap)
        check_rope(rope_scale, rope_theta)
        checks.check_bool("non_blocking", non_blocking)
        checks.check_bool("disable_split_kv", disable_split_kv)
        q_len = checks.check_int("q_len_per_req", q_len_per_req, 1)
        if q_len > 1 and self._prefill is None:
            raise ValueError(
                f"q_len_per_req={q_len} needs use_tensor_cores=True (the CUDA-core decode "
                "kernel takes one query token per request)"
            )
        if self._use_cuda_graph and self._graph_q_len not in (None, q_len):
            raise ValueError(
                f"in CUDA-graph mode q_len_per_req is fixed by the first plan() "
                f"({self._graph_q_len}); got {q_len}: use a wrapper per q_len_per_req"
            )
        if fixed_split_size is not None and fixed_split_size != -1:
            checks.check_int("fixed_split_size", fixed_split_size, 1)
        else:
            fixed_split_size = None
        if data_type is not None:  # the deprecated alias for both (q's default yields)
            q_data_type = data_type if q_data_type in (None, "float16") else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        dtype = check_dtype_name("q_data_type", "float16" if q_data_type is None else q_data_type)
        kv_dtype = check_kv_dtype("kv_data_type", kv_data_type, dtype)
        check_out_dtype(o_data_type, dtype)
        check_rope_cache(kv_dtype, pos_encoding)
        cuda_cores = self._prefill is None
        if self._use_cuda_graph:
            if batch != self._fixed_batch_size:
                raise ValueError(
                    f"in CUDA-graph mode the batch size is fixed to the buffers' "
                    f"{self._fixed_batch_size}; plan() got {batch}"
                )
            if indices.shape[0] > self._paged_kv_indices_buf.shape[0]:
                raise ValueError(
                    f"{indices.shape[0]} page indices exceed the CUDA-graph "
                    f"buffer's {self._paged_kv_indices_buf.shape[0]}"
                )
        host = (indptr if host_indptr is None else host_indptr).to("cpu")
        ragged.check_indptr(
            "indptr" if host_indptr is None else "global_override_indptr_cpu",
            host,
            "len(indices)",
            indices.shape[0],
        )
        ptr = host.tolist()
        if read_last_page_len:
            last = last_page_len.to("cpu").tolist()
            for b, n in enumerate(last):
                if ptr[b + 1] > ptr[b] and not 1 <= n <= page_size:
                    raise ValueError(
                        f"last_page_len[{b}] is {n}, must be in [1, page_size={page_size}]"
                    )
        else:
            last = [page_size] * batch
        if seq_lens is not None:
            checks.check_index_tensor("seq_lens", seq_lens, batch, INDEX + (torch.uint32,))
            lengths = [int(n) for n in seq_lens.to("cpu").tolist()]
        else:
            lengths = kv_lengths(ptr, last, page_size)
        if max(lengths, default=0) >= 1 << 31:
            raise ValueError("KV lengths must be < 2^31")
        if q_len > 1 and min(lengths, default=q_len) < q_len:
            b = min(range(batch), key=lengths.__getitem__)
            raise ValueError(
                f"q_len_per_req={q_len} needs every request's KV length >= q_len_per_req "
                f"(its query tokens are appended to the cache first); request {b} has "
                f"{lengths[b]}"
            )

        checks.check_cuda("float_workspace_buffer", self._float_workspace_buffer)
        if cuda_cores:
            plan, words = self._build(
                lengths,
                dtype,
                kv_dtype,
                group,
                num_qo_heads,
                num_kv_heads,
                head_dim,
                page_size,
                window_left,
                fixed_split_size,
                disable_split_kv,
                pos_encoding,
            )
            self._set_page_table(indptr, indices, last_page_len, non_blocking, copy_buffers)
            self._upload(words, plan.plan_words)
            # the module compiled and ALiBi's slopes made here, not in a run() a CUDA graph
            # may be capturing; a fake workspace (tracing without a GPU) needs neither
            if is_symbolic(self._workspace):
                self._cached_module = None
            else:
                self._cached_module = ModulePlan(
                    get_decode_module(dtype, head_dim, pos_encoding, kv_dtype),
                    self._replan_cuda_cores,
                    cuda_core_plan_args,
                )
                alibi_slopes_for(pos_encoding, num_qo_heads, self._workspace)
        else:
            wrapper = self._prefill_on_workspaces()
            opts = prefill._Options(
                dtype=dtype,
                kv_dtype=kv_dtype,
                group=group,
                num_qo_heads=num_qo_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                head_dim_vo=head_dim,
                causal=q_len > 1,  # a request's tokens see the cache up to their own
                pos_encoding_mode=pos_encoding_mode,
                window_left=window_left,
                logits_soft_cap=cap,
                sm_scale=sm_scale,
                rope_scale=rope_scale,
                rope_theta=rope_theta,
                non_blocking=non_blocking,
                fixed_split_size=fixed_split_size,
                allow_split=not disable_split_kv,
            )
            qo_indptr = torch.arange(batch + 1, dtype=torch.int32) * q_len
            plan, words = wrapper._build(opts, qo_indptr.tolist(), lengths, page_size, 0, False)
            self._set_page_table(indptr, indices, last_page_len, non_blocking, copy_buffers)
            # CUDA-graph mode: the constructor's arange is right for one token per request
            tables = {} if self._use_cuda_graph and q_len == 1 else {"_qo_indptr_buf": qo_indptr}
            wrapper._commit(opts, plan, words, None, tables)
            module = wrapper._cached_module
            self._cached_module = (
                None
                if module is None
                else ModulePlan(module, self._replan_tensor_cores, tensor_core_plan_args)
            )
            if self._backend == "auto":
                self._backend = "fa2"  # the reference resolves it in a tensor-core plan()
        self._plan_info = plan
        # (the soft cap as the reference stores it: 0.0 for None; vLLM asserts it equals its
        # layers' `logits_soft_cap or 0.0` before each decode)
        self._set_score_params(
            pos_encoding_mode, window_left, cap, sm_scale, rope_scale, rope_theta
        )
        self._batch_size = batch
        self._num_qo_heads = num_qo_heads
        self._num_kv_heads = num_kv_heads
        self._cached_q_data_type = self._cached_o_data_type = dtype
        self._cached_kv_data_type = kv_dtype
        self._q_len_per_req = q_len
        if self._use_cuda_graph:
            self._graph_q_len = q_len

    def _build(
        self,
        lengths: list[int],
        dtype: torch.dtype,
        kv_dtype: torch.dtype,
        group: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        window_left: int,
        fixed_split_size: int | None,
        disable_split_kv: bool,
        pos_encoding: str,
    ) -> tuple[_Plan, list[int]]:
        """The CUDA-core plan record and the schedule's words; raises (changing nothing) when
        a workspace is too small."""
        batch = len(lengths)
        # fake buffers (tracing without a GPU) have no device to fill: no split
        fake = is_symbolic(self._workspace)

        def schedule_of(allow_split: bool) -> DecodeSchedule:
            return plan_decode_schedule(
                lengths,
                num_kv_heads,
                1
                if fake
                else _max_ctas(dtype, head_dim, group, self.device, pos_encoding, kv_dtype),
                window_left,
                fixed_chunk=None if fixed_split_size is None else fixed_split_size * page_size,
                allow_split=allow_split,
            )

        schedule = schedule_of(not disable_split_kv)
        if self._use_cuda_graph:
            sms = 0 if fake else get_device_sm_count(self.device)
            bound = sms * _MAX_CTAS_PER_SM // num_kv_heads
            # tmp rows: as many as the float workspace holds, up to the bound (the same for
            # every plan of this wrapper, so a captured graph's buffers stay where they are)
            tmp_cap = min(bound, self._tmp_rows_fit(num_qo_heads, head_dim))
            work_cap, merge_cap = batch + bound, min(batch, bound)
            if schedule.num_tmp_rows > tmp_cap and fixed_split_size is None:
                schedule = schedule_of(False)  # the planner's split does not fit: none
            if schedule.num_work > work_cap or schedule.num_tmp_rows > tmp_cap:
                raise ValueError(
                    f"this split (fixed_split_size={fixed_split_size}) needs "
                    f"{schedule.num_work} work items and {schedule.num_tmp_rows} tmp rows; "
                    f"a CUDA graph holds {work_cap} and {tmp_cap} (tmp rows: as many as "
                    "float_workspace_buffer holds): use a larger fixed_split_size"
                )
        else:
            work_cap, merge_cap = schedule.num_work, schedule.num_merge
            tmp_cap = schedule.num_tmp_rows
        words = pack_schedule(schedule, work_cap, merge_cap)
        plan_words, tmp_v, tmp_lse = self._split_buffers(
            len(words), tmp_cap, num_qo_heads, head_dim
        )
        plan = _Plan(
            batch=batch,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            dtype=dtype,
            kv_dtype=kv_dtype,
            schedule=schedule,
            work_capacity=work_cap,
            merge_capacity=merge_cap,
            tmp_capacity=tmp_cap,
            grid_work=work_cap if self._use_cuda_graph else schedule.num_work,
            grid_merge=merge_cap if self._use_cuda_graph else schedule.num_merge,
            plan_words=plan_words,
            tmp_v=tmp_v,
            tmp_lse=tmp_lse,
        )
        return plan, words

    def _prefill_on_workspaces(self) -> prefill.BatchPrefillWithPagedKVCacheWrapper:
        """The tensor-core path's prefill wrapper, on this wrapper's workspaces (which
        reset_workspace_buffer may have replaced since the last plan)."""
        wrapper = self._prefill
        wrapper._float_workspace_buffer = self._float_workspace_buffer
        wrapper._workspace = self._workspace
        wrapper._int_workspace_buffer = self._int_workspace_buffer
        wrapper._pin_memory_int_workspace_buffer = self._pin_memory_int_workspace_buffer
        return wrapper

    def _set_page_table(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        non_blocking: bool,
        copy_buffers: bool,
    ) -> None:
        """Where run()'s kernels read the page table: the CUDA-graph buffers (written here
        unless the caller already did, as fast_decode_plan's callers do) or int32 copies on
        the device."""
        if self._use_cuda_graph:
            if copy_buffers:
                copy_prefix(self._paged_kv_indptr_buf, indptr, non_blocking)
                copy_prefix(self._paged_kv_last_page_len_buf, last_page_len, non_blocking)
                copy_prefix(self._paged_kv_indices_buf, indices, non_blocking)
            return
        workspace = self._float_workspace_buffer
        self._paged_kv_indptr_buf = to_device(indptr, workspace, non_blocking)
        self._paged_kv_indices_buf = to_device(indices, workspace, non_blocking)
        self._paged_kv_last_page_len_buf = to_device(last_page_len, workspace, non_blocking)

    @flashinfer_api(trace=_trace.batch_decode_run_trace)
    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``[batch * q_len_per_req, num_qo_heads, head_dim]`` (request b's tokens in
        rows ``b * q_len_per_req ...``); ``paged_kv_cache`` a ``(k, v)`` pair of ``[num_pages,
        page_size, num_kv_heads, head_dim]`` (NHD) or ``[num_pages, num_kv_heads, page_size,
        head_dim]`` (HND), or one ``[num_pages, 2, ...]`` tensor (see
        :mod:`flashinfer.paged_kv`). Returns ``out`` shaped like ``q`` (and ``lse`` ``[rows,
        num_qo_heads]``, base 2, with ``return_lse``). ``q_len_per_req`` here is deprecated:
        it must agree with ``q`` and the plan."""
        # the plan's record says its kernel: _Plan (CUDA cores) or prefill's (tensor cores)
        plan: _Plan | prefill._Plan = self._planned(args)
        for name, value in (
            ("sinks", sinks),
            ("kv_cache_sf", kv_cache_sf),
            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
        ):
            if value is not None:
                raise ValueError(f"{name} is not supported by this library's decode kernel")
        if q_len_per_req is not None:
            warnings.warn(
                "run(q_len_per_req=...) is deprecated; pass it to plan()",
                DeprecationWarning,
                stacklevel=3,
            )
            checks.check_int("q_len_per_req", q_len_per_req, 1)
        if window_left is not None and window_left != self._window_left:
            raise ValueError(
                f"window_left={window_left!r} differs from the planned "
                f"{self._window_left}; re-plan to change it"
            )
        checks.check_bool("return_lse", return_lse)
        checks.check_optional_bool("enable_pdl", enable_pdl)
        checks.check_tensor("q", q)
        self._check_q_rows(q, plan.batch, q_len_per_req)
        shape = (plan.batch * self._q_len_per_req, plan.num_qo_heads, plan.head_dim)
        if tuple(q.shape) != shape:
            raise ValueError(f"q has shape {tuple(q.shape)}; plan() was for {shape}")
        if q.dtype != plan.dtype:
            raise TypeError(f"q has dtype {q.dtype}; plan() was for {plan.dtype}")
        if not isinstance(plan, _Plan):
            return self._run_tensor_cores(
                plan, q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse, enable_pdl
            )
        (k_name, k_cache), (v_name, v_cache) = check_paged_kv_cache(
            paged_kv_cache,
            self._kv_layout,
            plan.num_kv_heads,
            plan.page_size,
            plan.head_dim,
            plan.kv_dtype,
        )
        scale, cap = score_params(
            plan.head_dim, self._sm_scale, self._logits_soft_cap, q_scale, k_scale
        )
        v_scale = check_optional_number("v_scale", v_scale)
        window = check_window(self._window_left)
        pos_encoding = check_pos_encoding(self._pos_encoding_mode)
        check_alibi_cap(pos_encoding, cap)
        rope_rcp_scale, rope_rcp_theta = rope_params(self._rope_scale, self._rope_theta)
        check_vectors("q", q)
        for name, t in ((k_name, k_cache), (v_name, v_cache)):
            check_vectors(name, t)
        checks.check_cuda("q", q, like=self._workspace)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            checks.check_cuda(name, t, like=q)
        if out is None:
            out = torch.empty(shape, dtype=q.dtype, device=q.device)
        else:
            check_output("out", out, shape, q.dtype, q)
            check_vectors("out", out)
            checks.check_distinct("out", out, "q", q)  # not a layout the kernels are made for
        if lse is None and return_lse:
            lse = torch.empty(shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None:
            check_output("lse", lse, shape[:2], torch.float32, q)
            checks.check_distinct("lse", lse, "out", out)
        _batch_decode_op(
            q,
            k_cache,
            v_cache,
            self._paged_kv_indptr_buf,
            self._paged_kv_indices_buf,
            self._paged_kv_last_page_len_buf,
            plan.plan_words,
            plan.tmp_v,
            plan.tmp_lse,
            out,
            lse,
            self._kv_layout == "HND",
            plan.work_capacity,
            plan.merge_capacity,
            plan.tmp_capacity,
            plan.grid_work,
            plan.grid_merge,
            window,
            scale,
            cap,
            pos_encoding,
            rope_rcp_scale,
            rope_rcp_theta,
            alibi_slopes_for(pos_encoding, plan.num_qo_heads, q),
            enable_pdl,
        )
        apply_v_scale(out, v_scale)
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def _check_q_rows(self, q: torch.Tensor, batch: int, q_len_per_req: int | None) -> None:
        """q holds ``batch * q_len_per_req`` rows for the planned q_len_per_req; the q_len
        it implies (or the deprecated run() argument) must be the planned one, which the
        tensor-core schedule and its causal mask are built for."""
        planned = self._q_len_per_req
        rows = q.shape[0] if q.dim() else 0
        if q_len_per_req is not None and rows != batch * q_len_per_req:
            raise ValueError(
                f"q.shape[0] ({rows}) is not batch_size * q_len_per_req ({batch} * {q_len_per_req})"
            )
        implied = q_len_per_req
        if implied is None and batch and rows % batch == 0:
            implied = rows // batch
        if implied not in (None, planned) and implied >= 1:
            fix = (
                "re-plan with the matching q_len_per_req"
                if self._prefill is not None or implied == 1
                else "the CUDA-core decode kernel takes one query token per request "
                "(use_tensor_cores=True takes more)"
            )
            raise ValueError(f"q implies q_len_per_req={implied}, but plan() used {planned}; {fix}")

    def _run_tensor_cores(
        self,
        plan: prefill._Plan,
        q: torch.Tensor,
        paged_kv_cache: Any,
        q_scale: Any,
        k_scale: Any,
        v_scale: Any,
        out: Any,
        lse: Any,
        return_lse: bool,
        enable_pdl: Any,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """run() on the prefill kernel, with this wrapper's page table and score parameters
        (engines set them on this wrapper)."""
        wrapper = self._prefill
        check_vectors("q", q)
        kv = wrapper._check_cache(paged_kv_cache, plan)
        return wrapper._launch(
            plan,
            q,
            kv,
            self._paged_kv_indptr_buf,
            self._paged_kv_indices_buf,
            self._paged_kv_last_page_len_buf,
            self._q_len_per_req > 1,
            self._window_left,
            self._sm_scale,
            self._logits_soft_cap,
            self._pos_encoding_mode,
            self._rope_scale,
            self._rope_theta,
            q_scale,
            k_scale,
            v_scale,
            out,
            lse,
            return_lse,
            enable_pdl,
        )

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        pos_encoding_mode: str = "NONE",
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated: sets the score parameters given here (over the planned ones, as the
        reference does) and calls :meth:`run`."""
        self._override(
            pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta
        )
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        pos_encoding_mode: str = "NONE",
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated: :meth:`forward` returning ``(out, lse)``."""
        self._override(
            pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta
        )
        return self.run(
            q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True
        )

    def _override(
        self,
        pos_encoding_mode: Any,
        window_left: Any,
        logits_soft_cap: Any,
        sm_scale: Any,
        rope_scale: Any,
        rope_theta: Any,
    ) -> None:
        check_window(window_left)
        cap = check_score_args(sm_scale, logits_soft_cap)[1]
        check_alibi_cap(check_pos_encoding(pos_encoding_mode), cap)
        check_rope(rope_scale, rope_theta)
        self._set_score_params(
            pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta
        )

    def _check_module_plan(self, args: PlanArgs | DecodePlanArgs) -> int:
        """What both ``_cached_module.plan`` forms need: one head_dim, and the batch of the
        page-table buffers it re-plans as they stand. Returns that batch size."""
        if args.head_dim_qk != args.head_dim_vo:
            raise ValueError(
                f"head_dim_qk ({args.head_dim_qk}) and head_dim_vo ({args.head_dim_vo}) differ; "
                "decode takes one head_dim"
            )
        batch = self._paged_kv_last_page_len_buf.shape[0]
        if checks.check_int("batch_size", args.batch_size, 1) != batch:
            raise ValueError(
                f"batch_size is {args.batch_size}, the page-table buffers hold {batch} requests"
            )
        checks.check_index_tensor("kv_indptr", args.kv_indptr, batch + 1, INDEX)
        return batch

    def _replan_tensor_cores(self, args: PlanArgs) -> Any:
        """``_cached_module.plan(...)`` as engines call the reference's (module_plan.py):
        the schedule of ``args``' requests, on the page-table buffers as they stand (in
        CUDA-graph mode the engine has written them), with the score parameters and dtypes of
        the last plan(); returns the new plan record (engines store it as ``_plan_info``)."""
        batch = self._check_module_plan(args)
        if args.total_num_rows % batch:
            raise ValueError(
                f"total_num_rows ({args.total_num_rows}) is not a multiple of batch_size ({batch})"
            )
        q_len = args.total_num_rows // batch
        if bool(args.causal) != (q_len > 1):
            raise ValueError(
                f"causal={args.causal!r} with {q_len} query tokens a request: decode is causal "
                "exactly when a request has more than one"
            )
        if args.uniform_q_len not in (0, q_len):
            raise ValueError(
                f"uniform_q_len={args.uniform_q_len!r} with {q_len} query tokens a request: "
                "it must be 0 or that number"
            )
        window_left = self._window_left if args.window_left is None else args.window_left
        self._replan_buffers(
            args.num_qo_heads,
            args.num_kv_heads,
            args.head_dim_qk,
            args.page_size,
            window_left=window_left,
            logits_soft_cap=self._logits_soft_cap,
            q_data_type=self._cached_q_data_type,
            kv_data_type=self._cached_kv_data_type,
            seq_lens=args.kv_lens,
            fixed_split_size=args.fixed_split_size,
            disable_split_kv=args.disable_split_kv,
            q_len_per_req=q_len,
            host_indptr=args.kv_indptr,
        )
        return self._plan_info

    def _replan_cuda_cores(self, args: DecodePlanArgs) -> Any:
        """``_cached_module.plan(...)`` with the reference's CUDA-core decode plan arguments,
        as engines call it (SGLang's earlier ``fast_decode_plan``, vLLM's before it used
        tensor cores): the host ``indptr``'s requests on the buffers as they stand, scheduled
        by whole pages (the kernel reads the real lengths), with the dtypes of the empty
        tensors given and the last plan()'s other score parameters."""
        self._check_module_plan(args)
        self._replan_buffers(
            args.num_qo_heads,
            args.num_kv_heads,
            args.head_dim_qk,
            args.page_size,
            window_left=args.window_left,
            logits_soft_cap=args.logits_soft_cap,
            q_data_type=args.q_data.dtype,
            kv_data_type=args.kv_data.dtype,
            seq_lens=None,
            fixed_split_size=None,
            disable_split_kv=False,
            q_len_per_req=1,
            host_indptr=args.kv_indptr,
        )
        return self._plan_info

    def _replan_buffers(
        self,
        num_qo_heads: Any,
        num_kv_heads: Any,
        head_dim: Any,
        page_size: Any,
        **options: Any,
    ) -> None:
        """_configure() on the page-table buffers as they stand (no copies into them, no
        device-to-host copy of last_page_len), keeping the last plan()'s position encoding
        and scales."""
        self._configure(
            self._paged_kv_indptr_buf,
            self._paged_kv_indices_buf,
            self._paged_kv_last_page_len_buf,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            pos_encoding_mode=self._pos_encoding_mode,
            o_data_type=None,
            data_type=None,
            sm_scale=self._sm_scale,
            rope_scale=self._rope_scale,
            rope_theta=self._rope_theta,
            non_blocking=True,
            read_last_page_len=False,
            copy_buffers=False,
            **options,
        )

    def _set_score_params(
        self,
        pos_encoding_mode: str,
        window_left: int,
        logits_soft_cap: float | None,
        sm_scale: float | None,
        rope_scale: float | None,
        rope_theta: float | None,
    ) -> None:
        """The attributes run() reads each time (engines read and set them too)."""
        self._pos_encoding_mode = pos_encoding_mode
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta

    def end_forward(self) -> None:
        """Deprecated; does nothing (as in the reference)."""


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """:class:`BatchDecodeWithPagedKVCacheWrapper` with ``use_cuda_graph=True``, constructed
    from its fixed buffers (the reference's older spelling)."""

    def __init__(
        self,
        workspace_buffer: torch.Tensor,
        indptr_buffer: torch.Tensor,
        indices_buffer: torch.Tensor,
        last_page_len_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None:
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


def fast_decode_plan(
    self: BatchDecodeWithPagedKVCacheWrapper,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    q_data_type: Any = None,
    kv_data_type: Any = None,
    data_type: Any = None,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    non_blocking: bool = True,
    fixed_split_size: int | None = None,
    disable_split_kv: bool = False,
    q_len_per_req: int = 1,
    global_override_indptr_cpu: torch.Tensor | None = None,
) -> None:
    """plan() for engines that fill the page-table buffers themselves (they assign it to a
    wrapper's ``begin_forward``): in CUDA-graph mode nothing is copied into the buffers,
    otherwise the given tensors become them; ``indptr`` is read on the host
    (``global_override_indptr_cpu`` when given, saving its device-to-host copy) and
    ``last_page_len`` is never copied: the schedule assumes full last pages and the kernel
    reads the real lengths."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise TypeError(
            f"fast_decode_plan needs a BatchDecodeWithPagedKVCacheWrapper, got "
            f"{type(self).__name__}"
        )
    if global_override_indptr_cpu is not None:
        checks.check_tensor("indptr", indptr)
        checks.check_index_tensor(
            "global_override_indptr_cpu",
            global_override_indptr_cpu,
            indptr.shape[0] if indptr.dim() == 1 else None,
            INDEX,
        )
    self._configure(
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode=pos_encoding_mode,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        q_data_type=q_data_type,
        kv_data_type=kv_data_type,
        o_data_type=None,
        data_type=data_type,
        sm_scale=sm_scale,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
        non_blocking=non_blocking,
        seq_lens=None,
        fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv,
        q_len_per_req=q_len_per_req,
        host_indptr=global_override_indptr_cpu,
        read_last_page_len=False,
        copy_buffers=False,
    )
