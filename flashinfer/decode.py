"""Decode attention: one query token per request against its KV cache.

``score = q.k * sm_scale`` (``sm_scale`` defaults to ``1/sqrt(head_dim)``); with
``logits_soft_cap = c > 0`` the score becomes ``c * tanh(score / c)``. With
``window_left = w >= 0`` a request attends to its last ``w + 1`` keys only. ``lse`` is the
natural-log log-sum-exp of the scores (see :mod:`flashinfer.cascade`). q, KV and the output
share one dtype: float16 or bfloat16; head_dim 64, 128 or 256; ``num_qo_heads`` a multiple
of ``num_kv_heads`` (GQA). Long requests are split across the GPU and merged (see
:mod:`flashinfer.decode_schedule`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from . import checks
from .api_logging import flashinfer_api
from .decode_schedule import (
    DecodeSchedule,
    kv_lengths,
    pack_schedule,
    plan_decode_schedule,
    plan_length,
)
from .jit.decode import HEAD_DIMS, gen_decode_module
from .jit.dtypes import dtype_info

_DTYPES = (torch.float16, torch.bfloat16)
_INDEX = (torch.int32, torch.int64)
_LOG2E = 1.4426950408889634
_ALIGN = 256  # bytes: each workspace region starts at a multiple of this offset
# A bound on resident CTAs per SM (the hardware's), for CUDA-graph buffer capacities.
_MAX_CTAS_PER_SM = 32


@functools.cache
def get_decode_module(dtype: Any, head_dim: int):  # noqa: ANN201 - a tvm_ffi.Module
    """The decode module for ``dtype`` x ``head_dim``, compiled on first use."""
    return gen_decode_module(dtype, head_dim).build_and_load()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(_device_index(device)).multi_processor_count


@functools.cache
def _max_ctas(dtype: torch.dtype, head_dim: int, group: int, device: torch.device) -> int:
    """CTAs of the decode kernel the device holds at once for this group size."""
    with torch.cuda.device(_device_index(device)):
        per_sm = get_decode_module(dtype, head_dim).blocks_per_sm(group)
    return _sm_count(device) * max(1, int(per_sm))


def _check_dtype_name(name: str, value: Any) -> torch.dtype:
    if isinstance(value, str):
        try:
            value = getattr(torch, dtype_info(value).name)
        except TypeError:
            raise TypeError(f"{name} {value!r} is not a dtype; use float16 or bfloat16") from None
    if value not in _DTYPES:
        raise TypeError(f"{name} is {value}; supported: float16, bfloat16")
    return value


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def _check_heads(num_qo_heads: int, num_kv_heads: int, head_dim: int) -> int:
    _check_int("num_qo_heads", num_qo_heads, 1)
    _check_int("num_kv_heads", num_kv_heads, 1)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {', '.join(map(str, HEAD_DIMS))}, "
                         f"got {head_dim}")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}): the GQA group size must be integral")
    group = num_qo_heads // num_kv_heads
    if group * head_dim // 8 > 1024:
        raise ValueError(f"group size {group} is too large for head_dim {head_dim}")
    return group


def _score_params(head_dim: int, sm_scale: Any, logits_soft_cap: Any) -> tuple[float, float]:
    """(scale, cap) as the kernel applies them, in log2 units (see decode.cuh)."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not (
            math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale must be a finite float > 0, got {sm_scale!r}")
    cap = 0.0 if logits_soft_cap is None else logits_soft_cap
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (
            math.isfinite(cap) and cap >= 0):
        raise ValueError(f"logits_soft_cap must be None or a finite float >= 0, got {cap!r}")
    if cap > 0:
        return float(sm_scale) / cap, cap * _LOG2E
    return float(sm_scale) * _LOG2E, 0.0


def _check_window(window_left: Any) -> int:
    return _check_int("window_left", window_left, -1)


def _check_pos_encoding(mode: Any) -> None:
    if mode != "NONE":
        raise ValueError(f"pos_encoding_mode {mode!r} is not supported; apply flashinfer's RoPE "
                         "to q and k first and pass 'NONE'")


def _check_output(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                  like: torch.Tensor) -> None:
    checks.check_tensor(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    checks.check_cuda(name, t, like=like)


@flashinfer_api
def single_decode_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                sm_scale: float | None = None,
                                logits_soft_cap: float | None = None, window_left: int = -1,
                                return_lse: bool = False
                                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query ``q`` ``[num_qo_heads, head_dim]`` over ``k``/``v``
    ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
    (HND). Returns ``out`` like q, and ``lse`` ``[num_qo_heads]`` with ``return_lse``."""
    hnd = checks.check_kv_layout(kv_layout)
    _check_pos_encoding(pos_encoding_mode)
    checks.check_tensor("q", q)
    checks.check_ndim("q", q, 2, "[num_qo_heads, head_dim]")
    checks.check_dtype("q", q, _DTYPES)
    layout = "[num_kv_heads, kv_len, head_dim]" if hnd else "[kv_len, num_kv_heads, head_dim]"
    for name, t in (("k", k), ("v", v)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, f"{layout} ({kv_layout})")
        checks.check_same_dtype(name, t, "q", q)
        checks.check_last_dim_contiguous(name, t)
    if v.shape != k.shape:
        raise ValueError(f"v has shape {tuple(v.shape)}, k has {tuple(k.shape)}")
    kv_heads, kv_len = (k.shape[0], k.shape[1]) if hnd else (k.shape[1], k.shape[0])
    num_qo_heads, head_dim = q.shape
    if k.shape[2] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[2]}, q has {head_dim}")
    group = _check_heads(num_qo_heads, kv_heads, head_dim)
    scale, cap = _score_params(head_dim, sm_scale, logits_soft_cap)
    window_left = _check_window(window_left)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    checks.check_cuda("q", q)
    checks.check_cuda("k", k, like=q)
    checks.check_cuda("v", v, like=q)

    schedule = plan_decode_schedule([kv_len], kv_heads,
                                    _max_ctas(q.dtype, head_dim, group, q.device), window_left)
    chunks = schedule.num_work
    begin = schedule.work_start[0]
    chunk = schedule.chunk_size or max(kv_len - begin, 1)
    rows = chunks if chunks > 1 else 0
    tmp_v = torch.empty(max(rows * num_qo_heads * head_dim, 1), dtype=torch.float32,
                        device=q.device)
    tmp_lse = torch.empty(max(rows * num_qo_heads, 1), dtype=torch.float32, device=q.device)
    out = torch.empty((num_qo_heads, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty(num_qo_heads, dtype=torch.float32, device=q.device) if return_lse else None
    get_decode_module(q.dtype, head_dim).single_decode(
        q, k, v, tmp_v, tmp_lse, out, lse, hnd, begin, kv_len, chunk, chunks, scale, cap)
    return (out, lse) if return_lse else out


@dataclass(frozen=True)
class _Plan:
    """What plan() fixed and run() checks against."""
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    schedule: DecodeSchedule
    work_capacity: int
    merge_capacity: int
    tmp_capacity: int
    grid_work: int
    grid_merge: int
    scale: float
    cap: float
    indices: torch.Tensor  # on the device
    # workspace views: the schedule (int32), partial outputs and their LSEs (float32)
    plan_words: torch.Tensor
    tmp_v: torch.Tensor
    tmp_lse: torch.Tensor


class BatchDecodeWithPagedKVCacheWrapper:
    """Decode attention for a batch of requests over a paged KV cache.

    ``plan()`` runs on the host once per batch composition: it reads the page table's
    ``indptr`` and ``last_page_len`` (on the CPU, or copied there), computes the split-KV
    schedule and writes it into ``float_workspace_buffer`` with one async copy. ``run()``
    only launches (no sync, no host-side schedule work), for every layer of the step.
    With ``use_cuda_graph=True`` every buffer has a fixed address and size, given at
    construction, so ``run()`` can be captured once and replayed after later ``plan()``
    calls with up to ``len(paged_kv_last_page_len_buffer)`` requests.
    """

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer: torch.Tensor | None = None,
                 paged_kv_indices_buffer: torch.Tensor | None = None,
                 paged_kv_last_page_len_buffer: torch.Tensor | None = None) -> None:
        checks.check_tensor("float_workspace_buffer", float_workspace_buffer)
        if float_workspace_buffer.dim() != 1 or not float_workspace_buffer.is_contiguous():
            raise ValueError("float_workspace_buffer must be a contiguous 1-D tensor")
        if float_workspace_buffer.data_ptr() % 16:
            raise ValueError("float_workspace_buffer must be 16-byte aligned")
        self._hnd = checks.check_kv_layout(kv_layout)
        self._kv_layout = kv_layout
        if not isinstance(use_cuda_graph, bool):
            raise TypeError("use_cuda_graph must be a bool")
        del use_tensor_cores  # accepted for compatibility; decode uses CUDA cores
        self._workspace = float_workspace_buffer.view(torch.uint8)
        self._use_cuda_graph = use_cuda_graph
        self._max_batch: int | None = None
        self._indices_buffer = None
        if use_cuda_graph:
            for name, t in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                            ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                            ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if t is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (fixed-size buffers)")
                checks.check_index_tensor(name, t, None, (torch.int32,))
                checks.check_cuda(name, t, like=float_workspace_buffer)
            self._max_batch = paged_kv_last_page_len_buffer.shape[0]
            if paged_kv_indptr_buffer.shape[0] != self._max_batch + 1:
                raise ValueError("paged_kv_indptr_buffer must have one more element than "
                                 "paged_kv_last_page_len_buffer")
            self._indices_buffer = paged_kv_indices_buffer
        self._plan: _Plan | None = None
        self._host_words: torch.Tensor | None = None
        self._copy_done: torch.cuda.Event | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def __repr__(self) -> str:
        """What API logs show for the wrapper: its layout, mode and current plan."""
        plan = self._plan
        planned = "not planned" if plan is None else (
            f"batch={plan.batch}, heads={plan.num_qo_heads}/{plan.num_kv_heads}, "
            f"head_dim={plan.head_dim}, page_size={plan.page_size}, "
            f"dtype={str(plan.dtype).removeprefix('torch.')}, work_items={plan.schedule.num_work}")
        return (f"BatchDecodeWithPagedKVCacheWrapper(kv_layout={self._kv_layout!r}, "
                f"use_cuda_graph={self._use_cuda_graph}, {planned})")

    @flashinfer_api
    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, sm_scale: float | None = None) -> None:
        """Fix the batch: request ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]``, the
        last filled to ``last_page_len[b]`` (in ``[1, page_size]``)."""
        checks.check_index_tensor("indptr", indptr, None, _INDEX)
        if indptr.shape[0] < 1:
            raise ValueError("indptr needs batch_size + 1 elements")
        batch = indptr.shape[0] - 1
        checks.check_index_tensor("indices", indices, None, _INDEX)
        checks.check_index_tensor("last_page_len", last_page_len, batch, _INDEX)
        group = _check_heads(num_qo_heads, num_kv_heads, _check_int("head_dim", head_dim, 1))
        _check_int("page_size", page_size, 1)
        _check_pos_encoding(pos_encoding_mode)
        window_left = _check_window(window_left)
        scale, cap = _score_params(head_dim, sm_scale, logits_soft_cap)
        dtype = _check_dtype_name("q_data_type", q_data_type)
        kv_dtype = dtype if kv_data_type is None else _check_dtype_name("kv_data_type",
                                                                        kv_data_type)
        if kv_dtype != dtype:
            raise TypeError(f"kv_data_type {kv_dtype} differs from q_data_type {dtype}; "
                            "q and the KV cache must share a dtype")
        if self._max_batch is not None and batch > self._max_batch:
            raise ValueError(f"batch of {batch} exceeds the CUDA-graph buffers' {self._max_batch}")
        ptr = indptr.tolist()  # the host needs these to schedule
        last = last_page_len.tolist()
        if ptr[0] != 0 or any(b < a for a, b in zip(ptr, ptr[1:])):
            raise ValueError("indptr must start at 0 and be non-decreasing")
        if ptr[-1] > indices.shape[0]:
            raise ValueError(f"indptr ends at {ptr[-1]} but indices has {indices.shape[0]} "
                             "elements")
        for b, n in enumerate(last):
            if ptr[b + 1] > ptr[b] and not 1 <= n <= page_size:
                raise ValueError(f"last_page_len[{b}] is {n}, must be in [1, page_size="
                                 f"{page_size}]")
        device = self._workspace.device
        checks.check_cuda("float_workspace_buffer", self._workspace)
        max_ctas = _max_ctas(dtype, head_dim, group, device)
        schedule = plan_decode_schedule(kv_lengths(ptr, last, page_size), num_kv_heads,
                                        max_ctas, window_left)
        if self._use_cuda_graph:
            bound = _sm_count(device) * _MAX_CTAS_PER_SM // num_kv_heads
            work_cap = self._max_batch + bound
            merge_cap = min(self._max_batch, bound)
            tmp_cap, batch_cap = bound, self._max_batch
        else:
            work_cap, merge_cap = schedule.num_work, schedule.num_merge
            tmp_cap, batch_cap = schedule.num_tmp_rows, batch
        words = pack_schedule(schedule, work_cap, merge_cap, ptr)
        words += [ptr[-1]] * (batch_cap - batch)  # unused requests: empty page ranges
        int_bytes = _round_up(4 * plan_length(work_cap, merge_cap, batch_cap))
        # tmp_cap: a split needs at most max_ctas / num_kv_heads <= bound chunks
        tmp_v_bytes = _round_up(4 * tmp_cap * num_qo_heads * head_dim)
        tmp_lse_bytes = _round_up(4 * tmp_cap * num_qo_heads)
        needed = int_bytes + tmp_v_bytes + tmp_lse_bytes
        if needed > self._workspace.numel():
            raise ValueError(f"float_workspace_buffer has {self._workspace.numel()} bytes; this "
                             f"plan needs {needed}")
        plan_words = self._workspace[:int_bytes].view(torch.int32)
        self._upload(words, plan_words)
        if self._indices_buffer is not None:
            if indices.shape[0] > self._indices_buffer.shape[0]:
                raise ValueError(f"{indices.shape[0]} page indices exceed the CUDA-graph buffer's "
                                 f"{self._indices_buffer.shape[0]}")
            self._indices_buffer[: indices.shape[0]].copy_(indices, non_blocking=True)
            device_indices = self._indices_buffer
        else:
            device_indices = indices.to(device=device, dtype=torch.int32, non_blocking=True)
        self._plan = _Plan(
            batch=batch, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, page_size=page_size, dtype=dtype, schedule=schedule,
            work_capacity=work_cap, merge_capacity=merge_cap, tmp_capacity=tmp_cap,
            grid_work=work_cap if self._use_cuda_graph else schedule.num_work,
            grid_merge=merge_cap if self._use_cuda_graph else schedule.num_merge,
            scale=scale, cap=cap, indices=device_indices,
            plan_words=plan_words,
            tmp_v=self._workspace[int_bytes:int_bytes + tmp_v_bytes].view(torch.float32),
            tmp_lse=self._workspace[int_bytes + tmp_v_bytes:needed].view(torch.float32))

    def _upload(self, words: list[int], target: torch.Tensor) -> None:
        """One async host-to-device copy of the schedule into ``target`` (the workspace's
        int32 region). The pinned staging buffer is reused once the previous plan's copy has
        finished."""
        if self._copy_done is not None:
            self._copy_done.synchronize()
        if self._host_words is None or self._host_words.numel() < len(words):
            self._host_words = torch.empty(len(words), dtype=torch.int32, pin_memory=True)
        self._host_words[: len(words)] = torch.tensor(words, dtype=torch.int32)
        target[: len(words)].copy_(self._host_words[: len(words)], non_blocking=True)
        self._copy_done = torch.cuda.Event()
        self._copy_done.record()

    @flashinfer_api
    def run(self, q: torch.Tensor, paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
            out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``[batch, num_qo_heads, head_dim]``; ``paged_kv_cache`` a ``(k, v)`` pair of
        ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD) or ``[num_pages,
        num_kv_heads, page_size, head_dim]`` (HND), or one ``[num_pages, 2, ...]`` tensor.
        Returns ``out`` (and ``lse`` ``[batch, num_qo_heads]`` with ``return_lse``)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("call plan() before run()")
        checks.check_tensor("q", q)
        shape = (plan.batch, plan.num_qo_heads, plan.head_dim)
        if tuple(q.shape) != shape:
            raise ValueError(f"q has shape {tuple(q.shape)}; plan() was for {shape}")
        if q.dtype != plan.dtype:
            raise TypeError(f"q has dtype {q.dtype}; plan() was for {plan.dtype}")
        k_cache, v_cache = self._split_cache(paged_kv_cache, plan)
        checks.check_cuda("q", q, like=self._workspace)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            checks.check_cuda(name, t, like=q)
        if out is None:
            out = torch.empty(shape, dtype=q.dtype, device=q.device)
        else:
            _check_output("out", out, shape, q.dtype, q)
        if lse is None and return_lse:
            lse = torch.empty(shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None:
            _check_output("lse", lse, shape[:2], torch.float32, q)
        get_decode_module(plan.dtype, plan.head_dim).batch_decode(
            q, k_cache, v_cache, plan.indices, plan.plan_words, plan.tmp_v, plan.tmp_lse, out,
            lse, self._hnd, plan.work_capacity, plan.merge_capacity, plan.tmp_capacity,
            plan.grid_work, plan.grid_merge, plan.scale, plan.cap)
        return (out, lse) if return_lse else out

    forward = run

    def _split_cache(self, cache: Any, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(cache, (tuple, list)):
            if len(cache) != 2:
                raise ValueError("paged_kv_cache must be a (k_cache, v_cache) pair")
            k_cache, v_cache = cache
        else:
            checks.check_tensor("paged_kv_cache", cache)
            checks.check_ndim("paged_kv_cache", cache, 5, "[num_pages, 2, ...]")
            if cache.shape[1] != 2:
                raise ValueError(f"paged_kv_cache's dim 1 must be 2 (k, v), got {cache.shape[1]}")
            k_cache, v_cache = cache[:, 0], cache[:, 1]
        expected = ((plan.num_kv_heads, plan.page_size) if self._hnd
                    else (plan.page_size, plan.num_kv_heads)) + (plan.head_dim,)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            checks.check_tensor(name, t)
            checks.check_ndim(name, t, 4, f"[num_pages, ...] ({self._kv_layout})")
            if tuple(t.shape[1:]) != expected:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; plan() was for pages of "
                                 f"{expected} ({self._kv_layout})")
            if t.dtype != plan.dtype:
                raise TypeError(f"{name} has dtype {t.dtype}; plan() was for {plan.dtype}")
            checks.check_last_dim_contiguous(name, t)
        if k_cache.shape[0] != v_cache.shape[0]:
            raise ValueError("k_cache and v_cache differ in num_pages")
        return k_cache, v_cache


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
