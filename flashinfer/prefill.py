"""Prefill / append attention: many query tokens per request against its KV cache.

Scores as in :mod:`flashinfer.decode`: ``score = q.k * sm_scale`` (``sm_scale`` defaults to
``1/sqrt(head_dim)``, times ``q_scale``/``k_scale`` when given), ``c * tanh(score / c)``
with ``logits_soft_cap = c > 0``; the output is multiplied by ``v_scale``; ``lse`` is in
**base 2**, as in the reference library. Masks are the reference's: with ``causal``, query
``i`` of a request with ``qo_len`` queries and ``kv_len`` keys sees key ``j`` iff
``j <= i + kv_len - qo_len`` (aligned to the bottom right, so appended tokens see the whole
prefix); ``window_left = w >= 0`` also requires ``j >= i + kv_len - qo_len - w``; a custom
mask (per request ``[qo_len, kv_len]`` booleans, True = attend) replaces the causal mask.
A query that sees no key gets output 0 and LSE -inf. q and the output share one dtype
(float16 or bfloat16); the KV is q's dtype or fp8 (``float8_e4m3fn``, ``float8_e5m2``, as
``kv_data_type`` in plan(): the kernel widens each tile in shared memory, ``k_scale`` and
``v_scale`` dequantize as above); head_dim 64, 128 or 256, or q and k of 192 with v and the
output of 128 (``head_dim_vo``: DeepSeek's MLA prefill), ``num_qo_heads`` a multiple of
``num_kv_heads``. Query rows are tiled together with their GQA group and long KV is split
across the GPU and merged (see :mod:`flashinfer.prefill_schedule`).

Each launch is a torch custom op (``torch.ops.flashinfer.single_prefill_with_kv_cache``, and
``batch_prefill_with_kv_cache`` for both wrappers; see docs/compile.md), made once per call
after the checks, as in :mod:`flashinfer.decode`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from . import checks, ragged
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
from .jit.kv_dtype import check_rope_cache
from .jit.prefill import (
    HEAD_DIM_PAIRS,
    HEAD_DIMS,
    check_head_dims,
    check_rope_head_dims,
    gen_prefill_module,
)
from .paged_kv import Part, check_paged_kv_cache
from .pdl import resolve_enable_pdl
from .prefill_schedule import (
    DEFAULT_MIN_CHUNK,
    TILE_ROWS,
    PrefillSchedule,
    kv_lengths,
    pack_schedule,
    plan_prefill_schedule,
)
from .quantization import packbits, segment_packbits
from .trace.templates import attention as _trace
from .trtllm import (  # engines import it from here
    trtllm_batch_context_with_kv_cache as trtllm_batch_context_with_kv_cache,
)
from .utils import get_device_sm_count

_VEC = 8  # elements per 16-byte vector: the kernel's unit of every load and store
_MASK_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


@functools.cache
def get_prefill_module(  # noqa: ANN201
    dtype: Any,
    head_dim: int,
    pos_encoding: str = "NONE",
    kv_dtype: Any = None,
    head_dim_vo: int | None = None,
):
    """The prefill module (a tvm_ffi.Module) for ``dtype`` x ``head_dim`` (q and k; v and
    the output: ``head_dim_vo``, None for the same), built for ``pos_encoding`` (a
    pos_encoding_mode) and a KV cache of ``kv_dtype`` (None: ``dtype``; or an fp8 type),
    compiled on first use."""
    spec = gen_prefill_module(dtype, head_dim, None, pos_encoding, kv_dtype, head_dim_vo)
    return spec.build_and_load()


@functools.cache
def _max_ctas(
    dtype: torch.dtype,
    head_dim: int,
    device: torch.device,
    pos_encoding: str = "NONE",
    kv_dtype: torch.dtype | None = None,
    head_dim_vo: int | None = None,
) -> int:
    """CTAs of the prefill kernel the device holds at once (after checking that one fits)."""
    with torch.cuda.device(device):
        module = get_prefill_module(dtype, head_dim, pos_encoding, kv_dtype, head_dim_vo)
        limit = int(module.shared_bytes_limit())
        check_shared_memory(int(module.shared_bytes()), limit, head_dim, head_dim_vo)
        per_sm = module.blocks_per_sm()
    return get_device_sm_count(device) * max(1, int(per_sm))


def check_shared_memory(needed: int, limit: int, head_dim: int, head_dim_vo: int | None) -> None:
    """A CTA of the module's tiling fits the device's shared memory a block: the defaults
    are sized for an H100's 227 KiB; sm_86/89/120 allow 99 KiB and sm_80 163 KiB, where
    head_dim 192/128's default (128 KiB) does not fit (CUDA's refusal would only say
    "invalid argument")."""
    if needed > limit:
        dims = f"{head_dim}" if head_dim_vo in (None, head_dim) else f"{head_dim}/{head_dim_vo}"
        smaller = "m1kv16p" if head_dim == 256 else "m1kv32p"  # tiles of half the K/V tokens
        raise ValueError(
            f"the prefill kernel for head_dim {dims} needs {needed} bytes of shared memory a "
            f"block, this GPU allows {limit}: choose a smaller tiling with "
            f"FLASHINFER_PREFILL_TILING (e.g. {head_dim}:{smaller}; docs/attention.md lists "
            "each tiling's shared memory)"
        )


# -- argument checks ---------------------------------------------------------------------------

_HEAD_DIMS_QK = tuple(sorted({qk for qk, _ in HEAD_DIM_PAIRS}))


def _check_heads(
    num_qo_heads: Any,
    num_kv_heads: Any,
    head_dim_qk: Any,
    head_dim_vo: Any = None,
    **names: str,
) -> int:
    """The GQA group size, after the shared checks against prefill's head dims (q and k:
    ``head_dim_qk``; v and the output: ``head_dim_vo``, None for the same, as decode and
    cascade callers have them); ``names`` as :func:`check_heads` takes them."""
    if head_dim_vo is None:
        return check_heads(num_qo_heads, num_kv_heads, head_dim_qk, HEAD_DIMS, **names)
    group = check_heads(num_qo_heads, num_kv_heads, head_dim_qk, _HEAD_DIMS_QK, **names)
    check_head_dims(head_dim_qk, checks.check_int("head_dim_vo", head_dim_vo, 1))
    return group


def _refuse(name: str, value: Any, why: str) -> None:
    """A reference feature this library does not have: anything but None raises."""
    if value is not None:
        raise ValueError(f"{name} is not supported: {why}")


def _check_backend(backend: Any) -> None:
    if backend not in BACKENDS:
        raise ValueError(
            f"backend {backend!r} is not available; this library has "
            f"{', '.join(map(repr, BACKENDS))} (one tensor-core prefill kernel)"
        )


def _check_fp16_qk_reduction(value: Any) -> None:
    if checks.check_bool("use_fp16_qk_reduction", value):
        raise ValueError(
            "use_fp16_qk_reduction=True is not supported: q.k is always accumulated in float32"
        )


def _plan_dtypes(
    q_data_type: Any, kv_data_type: Any, o_data_type: Any
) -> tuple[torch.dtype, torch.dtype]:
    """(q's and the output's dtype, the KV cache's: q's or an fp8 type)."""
    dtype = check_dtype_name("q_data_type", q_data_type)
    kv_dtype = check_kv_dtype("kv_data_type", kv_data_type, dtype)
    check_out_dtype(o_data_type, dtype)
    return dtype, kv_dtype


def _check_rows(name: str, tokens: int, num_qo_heads: int) -> None:
    """The kernel packs query rows (tokens x query heads) and positions in 32 bits."""
    if tokens * num_qo_heads > ragged.INT32_MAX:
        raise ValueError(
            f"{name}: {tokens} query tokens x {num_qo_heads} query heads must be < 2^31"
        )


def _check_mask_values(mask: torch.Tensor) -> None:
    """What packbits reads: booleans, or numbers where nonzero means attend."""
    checks.check_tensor("custom_mask", mask)
    if mask.dtype not in _MASK_DTYPES and not mask.dtype.is_floating_point:
        raise TypeError(f"custom_mask has dtype {mask.dtype}; use bool (True = attend)")


def _check_packed_mask(packed: torch.Tensor, needed: int) -> None:
    checks.check_tensor("packed_custom_mask", packed)
    checks.check_ndim("packed_custom_mask", packed, 1, "uint8 bits (see packbits)")
    checks.check_dtype("packed_custom_mask", packed, (torch.uint8,))
    if not packed.is_contiguous():
        raise ValueError("packed_custom_mask must be contiguous")
    if packed.shape[0] < needed:
        raise ValueError(f"packed_custom_mask has {packed.shape[0]} bytes; the mask needs {needed}")


# -- single request ----------------------------------------------------------------------------


def _single_chunks(
    qo_len: int, kv_len: int, group: int, num_kv_heads: int, max_ctas: int
) -> tuple[int, int]:
    """(chunk_tokens, num_chunks): the KV of one request is split only when its q tiles
    leave the GPU partly idle and it is longer than the smallest worthwhile chunk."""
    ctas = math.ceil(qo_len * group / TILE_ROWS) * num_kv_heads
    if ctas >= max_ctas or kv_len <= DEFAULT_MIN_CHUNK:
        return max(kv_len, 1), 1
    chunks = min(math.ceil(kv_len / DEFAULT_MIN_CHUNK), max(1, max_ctas // ctas))
    chunk = math.ceil(kv_len / chunks)
    return chunk, math.ceil(kv_len / chunk)


@flashinfer_api(trace=_trace.single_prefill_with_kv_cache_trace)
def single_prefill_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale_q: torch.Tensor | None = None,
    scale_k: torch.Tensor | None = None,
    scale_v: torch.Tensor | None = None,
    o_dtype: torch.dtype | None = None,
    custom_mask: torch.Tensor | None = None,
    packed_custom_mask: torch.Tensor | None = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf: tuple[torch.Tensor, torch.Tensor] | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[qo_len, num_qo_heads, head_dim]`` over ``k``/``v``
    ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
    (HND); v may have head_dim 128 where q and k have 192. ``custom_mask`` is ``[qo_len,
    kv_len]`` (any shape of that many elements, read row-major); ``packed_custom_mask`` its
    little-order bits (:func:`flashinfer.packbits`) and wins when both are given. Returns
    ``out`` like q with v's head_dim, and ``lse`` ``[qo_len, num_qo_heads]`` (base 2) with
    ``return_lse``. The KV of a short query is split across the GPU and merged, so one long
    prompt still fills it."""
    hnd = checks.check_kv_layout(kv_layout)
    pos_encoding = check_pos_encoding(pos_encoding_mode)
    _check_fp16_qk_reduction(use_fp16_qk_reduction)
    _check_backend(backend)
    for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v)):
        _refuse(
            name,
            value,
            "per-head scale tensors are not supported (fp8 k and v take the k_scale and "
            "v_scale floats)",
        )
    _refuse("kv_cache_sf", kv_cache_sf, "this library has no NVFP4 KV caches")
    checks.check_bool("causal", causal)
    checks.check_bool("return_lse", return_lse)
    checks.check_tensor("q", q)
    checks.check_ndim("q", q, 3, "[qo_len, num_qo_heads, head_dim]")
    checks.check_dtype("q", q, DTYPES)
    if o_dtype is not None and o_dtype != q.dtype:
        raise TypeError(
            f"o_dtype {o_dtype} differs from q's {q.dtype}; the output has q's dtype here"
        )
    layout = "[num_kv_heads, kv_len, head_dim]" if hnd else "[kv_len, num_kv_heads, head_dim]"
    for name, t in (("k", k), ("v", v)):
        checks.check_tensor(name, t)
        checks.check_ndim(name, t, 3, f"{layout} ({kv_layout})")
    check_kv_tensor_dtypes(k, v, q)
    check_rope_cache(k.dtype, pos_encoding)
    qo_len, num_qo_heads, head_dim = q.shape
    head_dim_vo = v.shape[2]
    if k.shape[2] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[2]}, q has {head_dim}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v has shape {tuple(v.shape)}, k has {tuple(k.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_vectors(name, t)
    num_kv_heads, kv_len = (k.shape[0], k.shape[1]) if hnd else (k.shape[1], k.shape[0])
    _check_heads(
        num_qo_heads,
        num_kv_heads,
        head_dim,
        None if head_dim_vo == head_dim else head_dim_vo,
        kv_heads_from=f"k.shape[{0 if hnd else 1}] with kv_layout={kv_layout!r}",
    )
    check_rope_head_dims(pos_encoding, head_dim, head_dim_vo)
    _check_rows("q", qo_len, num_qo_heads)
    if kv_len > ragged.INT32_MAX:
        raise ValueError(f"k holds {kv_len} tokens; at most 2^31 - 1")
    scale, cap = score_params(head_dim, sm_scale, logits_soft_cap, None, k_scale)
    check_alibi_cap(pos_encoding, cap)
    v_scale = check_optional_number("v_scale", v_scale)
    rope_rcp_scale, rope_rcp_theta = rope_params(rope_scale, rope_theta)
    window_left = check_window(window_left)
    if packed_custom_mask is not None:
        _check_packed_mask(packed_custom_mask, (qo_len * kv_len + 7) // 8)
    elif custom_mask is not None:
        _check_mask_values(custom_mask)
        if custom_mask.numel() != qo_len * kv_len:
            raise ValueError(
                f"custom_mask has {custom_mask.numel()} elements; [qo_len, "
                f"kv_len] is [{qo_len}, {kv_len}]"
            )
    checks.check_cuda("q", q)
    checks.check_cuda("k", k, like=q)
    checks.check_cuda("v", v, like=q)
    if packed_custom_mask is not None:
        checks.check_cuda("packed_custom_mask", packed_custom_mask, like=q)
    elif custom_mask is not None:
        checks.check_cuda("custom_mask", custom_mask, like=q)

    out = torch.empty((qo_len, num_qo_heads, head_dim_vo), dtype=q.dtype, device=q.device)
    lse = (
        torch.empty((qo_len, num_qo_heads), dtype=torch.float32, device=q.device)
        if return_lse
        else None
    )
    if qo_len:
        if packed_custom_mask is None and custom_mask is not None:
            packed_custom_mask = packbits(custom_mask.reshape(-1), bitorder="little")
        _single_prefill_op(
            q,
            k,
            v,
            packed_custom_mask,
            out,
            lse,
            hnd,
            causal,
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


@kernel_op("single_prefill_with_kv_cache", mutates_args=("out", "lse"))
def _single_prefill_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed_custom_mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    hnd: bool,
    causal: bool,
    window_left: int,
    score_scale: float,
    score_cap: float,
    pos_encoding: str,
    rope_rcp_scale: float,
    rope_rcp_theta: float,
    alibi_slopes: torch.Tensor | None,
) -> None:
    """single_prefill_with_kv_cache's launch. The split of the KV across the device and the
    scratch for its partial states are decided here, where the device is known."""
    qo_len, num_qo_heads, head_dim = q.shape
    head_dim_vo = v.shape[2]
    num_kv_heads, kv_len = (k.shape[0], k.shape[1]) if hnd else (k.shape[1], k.shape[0])
    chunk, chunks = _single_chunks(
        qo_len,
        kv_len,
        num_qo_heads // num_kv_heads,
        num_kv_heads,
        _max_ctas(q.dtype, head_dim, q.device, pos_encoding, k.dtype, head_dim_vo),
    )
    rows = qo_len * chunks if chunks > 1 else 0
    tmp_v = torch.empty(
        max(rows * num_qo_heads * head_dim_vo, 1), dtype=torch.float32, device=q.device
    )
    tmp_lse = torch.empty(max(rows * num_qo_heads, 1), dtype=torch.float32, device=q.device)
    get_prefill_module(q.dtype, head_dim, pos_encoding, k.dtype, head_dim_vo).single_prefill(
        q,
        k,
        v,
        packed_custom_mask,
        tmp_v,
        tmp_lse,
        out,
        lse,
        hnd,
        causal,
        window_left,
        chunk,
        chunks,
        score_scale,
        score_cap,
        rope_rcp_scale,
        rope_rcp_theta,
        alibi_slopes,
        resolve_enable_pdl(None, q.device),
    )


@kernel_op("batch_prefill_with_kv_cache", mutates_args=("tmp_v", "tmp_lse", "out", "lse"))
def _batch_prefill_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
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
    causal: bool,
    window_left: int,
    score_scale: float,
    score_cap: float,
    pos_encoding: str,
    rope_rcp_scale: float,
    rope_rcp_theta: float,
    alibi_slopes: torch.Tensor | None,
    enable_pdl: bool | None,
) -> None:
    """The batch prefill wrappers' run() launch (paged: ``kv_indices`` and
    ``kv_last_page_len`` given; ragged: None), on the planned schedule (``plan``, in the int
    workspace) and scratch (``tmp_v``/``tmp_lse``, in the float workspace)."""
    module = get_prefill_module(q.dtype, q.shape[-1], pos_encoding, k.dtype, v.shape[-1])
    module.batch_prefill(
        q,
        k,
        v,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        custom_mask,
        mask_indptr,
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
        causal,
        window_left,
        score_scale,
        score_cap,
        rope_rcp_scale,
        rope_rcp_theta,
        alibi_slopes,
        resolve_enable_pdl(enable_pdl, q.device),
    )


single_prefill_with_kv_cache_return_lse = functools.partial(
    single_prefill_with_kv_cache, return_lse=True
)


# -- batch wrappers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What plan() fixed and run() checks against and launches with."""

    batch: int
    total_q: int
    total_kv: int  # ragged: kv_indptr[-1] (k/v hold at least this many tokens); paged: 0
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int  # q's and k's
    head_dim_vo: int  # v's and the output's
    page_size: int  # 1 for ragged KV
    dtype: torch.dtype  # q's and the output's
    kv_dtype: torch.dtype  # the KV cache's: dtype, or an fp8 type
    has_mask: bool
    schedule: PrefillSchedule
    work_capacity: int
    merge_capacity: int
    tmp_capacity: int
    grid_work: int
    grid_merge: int
    # views: the schedule in the int workspace; partial outputs and their LSEs (float32) in
    # the float workspace
    plan_words: torch.Tensor
    tmp_v: torch.Tensor
    tmp_lse: torch.Tensor


@dataclass(frozen=True)
class _Options:
    """plan()'s scalar arguments, validated."""

    dtype: torch.dtype  # q's and the output's
    kv_dtype: torch.dtype  # the KV cache's
    group: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int  # q's and k's
    head_dim_vo: int  # v's and the output's
    causal: bool
    pos_encoding_mode: str
    window_left: int
    logits_soft_cap: float
    sm_scale: float | None
    rope_scale: float | None
    rope_theta: float | None
    non_blocking: bool
    fixed_split_size: int | None
    allow_split: bool


def _check_options(
    num_qo_heads: Any,
    num_kv_heads: Any,
    head_dim_qk: Any,
    head_dim_vo: Any,
    causal: Any,
    pos_encoding_mode: Any,
    use_fp16_qk_reduction: Any,
    sm_scale: Any,
    window_left: Any,
    logits_soft_cap: Any,
    rope_scale: Any,
    rope_theta: Any,
    q_data_type: Any,
    kv_data_type: Any,
    o_data_type: Any,
    non_blocking: Any,
    prefix_len_ptr: Any,
    token_pos_in_items_ptr: Any,
    token_pos_in_items_len: Any,
    max_item_len_ptr: Any,
    fixed_split_size: Any,
    disable_split_kv: Any,
    *,
    head_dim_name: str = "head_dim_qk",
) -> _Options:
    """The options both wrappers' plan() share, checked in one place (``head_dim_name``:
    what the caller's plan() calls head_dim_qk; the cascade wrapper's says head_dim)."""
    group = _check_heads(
        num_qo_heads,
        num_kv_heads,
        checks.check_int(head_dim_name, head_dim_qk, 1),
        head_dim_vo,
        head_dim_name=head_dim_name,
    )
    head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
    checks.check_bool("causal", causal)
    check_pos_encoding(pos_encoding_mode)
    check_rope_head_dims(pos_encoding_mode, head_dim_qk, head_dim_vo)
    _check_fp16_qk_reduction(use_fp16_qk_reduction)
    sm_scale, cap = check_score_args(sm_scale, logits_soft_cap)
    check_alibi_cap(pos_encoding_mode, cap)
    window_left = check_window(window_left)
    check_rope(rope_scale, rope_theta)
    dtype, kv_dtype = _plan_dtypes(q_data_type, kv_data_type, o_data_type)
    check_rope_cache(kv_dtype, pos_encoding_mode)
    checks.check_bool("non_blocking", non_blocking)
    multi_item = "this library has no multi-item scoring"
    _refuse("prefix_len_ptr", prefix_len_ptr, multi_item)
    _refuse("token_pos_in_items_ptr", token_pos_in_items_ptr, multi_item)
    _refuse("max_item_len_ptr", max_item_len_ptr, multi_item)
    if checks.check_int("token_pos_in_items_len", token_pos_in_items_len, 0):
        raise ValueError(
            f"token_pos_in_items_len must be 0 ({multi_item}), got {token_pos_in_items_len}"
        )
    if fixed_split_size is not None and fixed_split_size != -1:
        checks.check_int("fixed_split_size", fixed_split_size, 1)
    else:
        fixed_split_size = None
    checks.check_bool("disable_split_kv", disable_split_kv)
    return _Options(
        dtype,
        kv_dtype,
        group,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo,
        causal,
        pos_encoding_mode,
        window_left,
        cap,
        sm_scale,
        rope_scale,
        rope_theta,
        non_blocking,
        fixed_split_size,
        not disable_split_kv,
    )


def _host_indptr(
    name: str, indptr: Any, length: int | None, total_name: str = "", total: int | None = None
) -> list[int]:
    """An indptr read on the host (as the reference does in plan()), validated."""
    checks.check_index_tensor(name, indptr, length, INDEX)
    if indptr.shape[0] < 1:
        raise ValueError(f"{name} needs batch_size + 1 elements")
    host = indptr.to("cpu")
    ragged.check_indptr(name, host, total_name, total)
    values = host.tolist()
    if values[-1] > ragged.INT32_MAX:
        raise ValueError(f"{name}[-1] must be < 2^31, got {values[-1]}")
    return values


@dataclass(frozen=True)
class _MaskInput:
    """A custom mask checked in plan(), packed only once nothing else can fail."""

    custom: torch.Tensor | None  # to pack with segment_packbits
    packed: torch.Tensor | None  # given packed, used as is
    bit_indptr: list[int]  # running sum of qo_len * kv_len, the reference's mask_indptr
    num_bytes: int  # of the packed mask the kernel reads

    def pack(self, like: torch.Tensor, non_blocking: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed uint8, int32 byte offsets of each request's mask), on ``like``'s device."""
        if self.custom is not None:
            # host offsets: segment_packbits reads them on the host anyway
            packed, byte_indptr = segment_packbits(
                self.custom.reshape(-1), torch.tensor(self.bit_indptr), bitorder="little"
            )
        else:
            # The reference takes a packed mask with its bit-count offsets as byte offsets.
            packed, byte_indptr = self.packed, torch.tensor(self.bit_indptr, dtype=torch.int32)
        return (
            to_device(packed, like, non_blocking, torch.uint8),
            to_device(byte_indptr, like, non_blocking),
        )


def _check_mask(
    custom_mask: Any, packed_custom_mask: Any, qo_lens: list[int], kv_lens: list[int]
) -> _MaskInput | None:
    """Each request's mask covers its ``qo_len * kv_len`` (query, key) pairs."""
    if custom_mask is None and packed_custom_mask is None:
        return None
    sizes = [q * k for q, k in zip(qo_lens, kv_lens)]
    bit_indptr = [0]
    for size in sizes:
        bit_indptr.append(bit_indptr[-1] + size)
    if packed_custom_mask is not None:
        needed = max(
            (start + (size + 7) // 8 for start, size in zip(bit_indptr, sizes) if size), default=0
        )
        _check_packed_mask(packed_custom_mask, needed)
        if bit_indptr[-1] > ragged.INT32_MAX:
            raise ValueError(
                "packed_custom_mask's offsets (the running sum of qo_len * kv_len) "
                "do not fit in int32"
            )
        return _MaskInput(None, packed_custom_mask, bit_indptr, packed_custom_mask.shape[0])
    _check_mask_values(custom_mask)
    if custom_mask.numel() != bit_indptr[-1]:
        raise ValueError(
            f"custom_mask has {custom_mask.numel()} elements; the requests' "
            f"qo_len * kv_len add up to {bit_indptr[-1]}"
        )
    num_bytes = sum((size + 7) // 8 for size in sizes)
    if num_bytes > ragged.INT32_MAX:
        raise ValueError("the packed custom mask does not fit in int32 offsets")
    return _MaskInput(custom_mask, None, bit_indptr, num_bytes)


class _BatchPrefillWrapper(WorkspaceOwner):
    """What the ragged and the paged wrapper share: workspaces, CUDA-graph buffers, the
    schedule upload and the launch. ``plan()`` runs on the host once per batch composition
    and uploads the split schedule into this wrapper's own int workspace with one async
    copy; the float workspace (shareable between wrappers, as in the reference) holds only
    the partial states of one ``run()``. ``run()`` only launches; the kernel reads the
    requests' lengths from the indptr arrays on the device when it runs."""

    def _setup(
        self,
        float_workspace_buffer: Any,
        kv_layout: Any,
        use_cuda_graph: Any,
        qo_indptr_buf: Any,
        kv_buffers: dict[str, Any],
        custom_mask_buf: Any,
        mask_indptr_buf: Any,
        backend: Any,
        jit_args: Any,
        jit_kwargs: Any,
    ) -> None:
        workspace = check_workspace("float_workspace_buffer", float_workspace_buffer)
        checks.check_kv_layout(kv_layout)
        checks.check_bool("use_cuda_graph", use_cuda_graph)
        _check_backend(backend)
        for name, value in (("jit_args", jit_args), ("jit_kwargs", jit_kwargs)):
            _refuse(name, value, "custom attention variants need their own kernels")
        self._fixed_batch_size = 0
        if use_cuda_graph:
            required = {"qo_indptr_buf": qo_indptr_buf, **kv_buffers}
            for name, t in required.items():
                if t is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (fixed-size buffers)")
                checks.check_index_tensor(name, t, None, (torch.int32,))
                checks.check_cuda(name, t, like=float_workspace_buffer)
            if qo_indptr_buf.shape[0] < 1:
                raise ValueError("qo_indptr_buf needs batch_size + 1 elements")
            self._fixed_batch_size = qo_indptr_buf.shape[0] - 1
            if custom_mask_buf is not None:
                checks.check_index_tensor("custom_mask_buf", custom_mask_buf, None, (torch.uint8,))
                checks.check_cuda("custom_mask_buf", custom_mask_buf, like=float_workspace_buffer)
            if mask_indptr_buf is not None:
                checks.check_index_tensor(
                    "mask_indptr_buf", mask_indptr_buf, self._fixed_batch_size + 1, (torch.int32,)
                )
                checks.check_cuda("mask_indptr_buf", mask_indptr_buf, like=float_workspace_buffer)
        self._kv_layout = kv_layout
        self._float_workspace_buffer = float_workspace_buffer
        self._workspace = workspace
        self.device = float_workspace_buffer.device
        self._int_workspace_buffer = float_workspace_buffer.new_empty(
            INT_WORKSPACE_BYTES, dtype=torch.uint8
        )
        self._pin_memory_int_workspace_buffer = pinned_like(self._int_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        self._backend = backend
        self._jit_module = None
        self._qo_indptr_buf = qo_indptr_buf
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf
        self._max_total_num_rows: int | None = None
        self._graph_capacity: tuple[int, int, int] | None = None
        self._plan_info: _Plan | None = None
        self._cached_module = None
        self._copy_done: torch.cuda.Event | None = None
        self._set_score_params(False, "NONE", False, -1, 0.0, None, None, None)

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
                f"batch={plan.batch}, tokens={plan.total_q}, heads={plan.num_qo_heads}/"
                f"{plan.num_kv_heads}, head_dim={plan.head_dim}"
                + (f"/{plan.head_dim_vo}" if plan.head_dim_vo != plan.head_dim else "")
                + ", "
                f"dtype={str(plan.dtype).removeprefix('torch.')}, "
                f"work_items={plan.schedule.num_work}"
            )
        )
        return (
            f"{type(self).__name__}(kv_layout={self._kv_layout!r}, "
            f"use_cuda_graph={self._use_cuda_graph}, {planned})"
        )

    # The decode wrapper's: the same attributes, the same semantics (a reset drops the plan).

    def _check_graph_batch(self, batch: int, total_q: int) -> None:
        """A captured run() reads q and out at the captured sizes."""
        if not self._use_cuda_graph:
            return
        if batch != self._fixed_batch_size:
            raise ValueError(
                f"in CUDA-graph mode the batch size is fixed to the buffers' "
                f"{self._fixed_batch_size}; plan() got {batch}"
            )
        if self._max_total_num_rows is not None and total_q > self._max_total_num_rows:
            raise ValueError(
                f"in CUDA-graph mode qo_indptr[-1] ({total_q}) cannot exceed the "
                f"first plan()'s {self._max_total_num_rows}"
            )

    def _schedule(
        self,
        opts: _Options,
        qo_indptr: list[int],
        kv_lens: list[int],
        page_size: int,
        has_mask: bool,
    ) -> tuple[PrefillSchedule, tuple[int, int, int]]:
        """The split schedule and the (work, merge, tmp row) capacities it is packed with.
        In CUDA-graph mode the first plan fixes the capacities (the captured grid): work
        items for twice its schedule, the whole GPU and any unsplit schedule of as many
        tokens; a merge row per token (later plans have no more); the tmp rows the float
        workspace holds. A later schedule that does not fit is replaced by the unsplit one,
        unless the split was fixed."""
        # fake buffers (tracing without a GPU) have no device to fill: no split
        fake = is_symbolic(self._workspace)
        max_ctas = (
            1
            if fake
            else _max_ctas(
                opts.dtype,
                opts.head_dim,
                self.device,
                opts.pos_encoding_mode,
                opts.kv_dtype,
                opts.head_dim_vo,
            )
        )
        fixed = None if opts.fixed_split_size is None else opts.fixed_split_size * page_size

        def schedule(allow_split: bool) -> PrefillSchedule:
            return plan_prefill_schedule(
                qo_indptr,
                kv_lens,
                opts.group,
                opts.num_kv_heads,
                max_ctas,
                causal=opts.causal and not has_mask,
                fixed_chunk=fixed,
                allow_split=allow_split,
            )

        result = schedule(opts.allow_split)
        sizes = (result.num_work, result.num_merge, result.num_tmp_rows)
        if not self._use_cuda_graph:
            return result, sizes
        capacity = self._graph_capacity
        if capacity is None:
            unsplit = math.ceil(qo_indptr[-1] * opts.group / TILE_ROWS) + len(kv_lens)
            fit = self._tmp_rows_fit(opts.num_qo_heads, opts.head_dim_vo)
            capacity = (max(2 * sizes[0], max_ctas, unsplit), qo_indptr[-1], max(sizes[2], fit))
        if any(n > cap for n, cap in zip(sizes, capacity)) and fixed is None:
            result = schedule(False)
            sizes = (result.num_work, result.num_merge, result.num_tmp_rows)
        if any(n > cap for n, cap in zip(sizes, capacity)):
            raise ValueError(
                f"this plan needs {sizes[0]} work items, {sizes[1]} merge rows and "
                f"{sizes[2]} tmp rows; the CUDA graph holds {capacity} (work items "
                "fixed by the first plan(), tmp rows by float_workspace_buffer): "
                "use a larger fixed_split_size"
            )
        return result, capacity

    def _build(
        self,
        opts: _Options,
        qo_indptr: list[int],
        kv_lens: list[int],
        page_size: int,
        total_kv: int,
        has_mask: bool,
    ) -> tuple[_Plan, list[int]]:
        """The plan record and the schedule's words; raises (changing nothing) when a
        workspace is too small."""
        checks.check_cuda("float_workspace_buffer", self._float_workspace_buffer)
        _check_rows("qo_indptr[-1]", qo_indptr[-1], opts.num_qo_heads)
        schedule, (work_cap, merge_cap, tmp_cap) = self._schedule(
            opts, qo_indptr, kv_lens, page_size, has_mask
        )
        words = pack_schedule(schedule, work_cap, merge_cap)
        plan_words, tmp_v, tmp_lse = self._split_buffers(
            len(words), tmp_cap, opts.num_qo_heads, opts.head_dim_vo
        )
        graph = self._use_cuda_graph
        plan = _Plan(
            batch=len(kv_lens),
            total_q=qo_indptr[-1],
            total_kv=total_kv,
            num_qo_heads=opts.num_qo_heads,
            num_kv_heads=opts.num_kv_heads,
            head_dim=opts.head_dim,
            head_dim_vo=opts.head_dim_vo,
            page_size=page_size,
            dtype=opts.dtype,
            kv_dtype=opts.kv_dtype,
            has_mask=has_mask,
            schedule=schedule,
            work_capacity=work_cap,
            merge_capacity=merge_cap,
            tmp_capacity=tmp_cap,
            grid_work=work_cap if graph else schedule.num_work,
            grid_merge=merge_cap if graph else schedule.num_merge,
            plan_words=plan_words,
            tmp_v=tmp_v,
            tmp_lse=tmp_lse,
        )
        return plan, words

    def _check_graph_mask(self, mask: _MaskInput | None) -> None:
        if not self._use_cuda_graph or mask is None:
            return
        for name in ("custom_mask_buf", "mask_indptr_buf"):
            if getattr(self, f"_{name}") is None:
                raise ValueError(f"a custom mask in CUDA-graph mode needs the constructor's {name}")
        if mask.num_bytes > self._custom_mask_buf.shape[0]:
            raise ValueError(
                f"the packed custom mask has {mask.num_bytes} bytes; "
                f"custom_mask_buf holds {self._custom_mask_buf.shape[0]}"
            )

    def _commit(
        self,
        opts: _Options,
        plan: _Plan,
        words: list[int],
        mask: _MaskInput | None,
        tables: dict[str, torch.Tensor],
    ) -> None:
        """Everything checked: pack the mask, write the index arrays where run()'s kernel
        reads them (into the CUDA-graph buffers, or int32 copies on the device), upload the
        schedule and take the new plan."""
        non_blocking = opts.non_blocking
        workspace = self._float_workspace_buffer
        mask_arrays = None if mask is None else mask.pack(workspace, non_blocking)
        if self._use_cuda_graph:
            for name, t in tables.items():
                copy_prefix(getattr(self, name), t, non_blocking)
            if mask_arrays is not None:
                copy_prefix(self._custom_mask_buf, mask_arrays[0], non_blocking)
                copy_prefix(self._mask_indptr_buf, mask_arrays[1], non_blocking)
            if self._graph_capacity is None:
                self._graph_capacity = (plan.work_capacity, plan.merge_capacity, plan.tmp_capacity)
                self._max_total_num_rows = plan.total_q
        else:
            for name, t in tables.items():
                setattr(self, name, to_device(t, workspace, non_blocking))
            self._custom_mask_buf, self._mask_indptr_buf = mask_arrays or (None, None)
        self._upload(words, plan.plan_words)
        # the module compiled and ALiBi's slopes made here, not in a run() a CUDA graph may
        # be capturing; a fake workspace (tracing without a GPU) needs neither
        if is_symbolic(workspace):
            self._cached_module = None
        else:
            self._cached_module = get_prefill_module(
                opts.dtype, opts.head_dim, opts.pos_encoding_mode, opts.kv_dtype, opts.head_dim_vo
            )
            alibi_slopes_for(opts.pos_encoding_mode, opts.num_qo_heads, workspace)
        self._plan_info = plan
        if self._backend == "auto":
            self._backend = "fa2"  # the reference resolves it in plan() too
        self._set_score_params(
            opts.causal,
            opts.pos_encoding_mode,
            False,
            opts.window_left,
            opts.logits_soft_cap,
            opts.sm_scale,
            opts.rope_scale,
            opts.rope_theta,
        )
        self._batch_size = plan.batch
        self._qo_indptr_last = plan.total_q
        self._num_qo_heads = opts.num_qo_heads
        self._num_kv_heads = opts.num_kv_heads
        self._cached_q_data_type = self._cached_o_data_type = opts.dtype
        self._cached_kv_data_type = opts.kv_dtype

    def _set_score_params(
        self,
        causal: bool,
        pos_encoding_mode: str,
        use_fp16_qk_reduction: bool,
        window_left: int,
        logits_soft_cap: float | None,
        sm_scale: float | None,
        rope_scale: float | None,
        rope_theta: float | None,
    ) -> None:
        """The attributes run() reads each time (engines read and set them too)."""
        self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta

    def _override(
        self,
        causal: Any,
        pos_encoding_mode: Any,
        use_fp16_qk_reduction: Any,
        window_left: Any,
        logits_soft_cap: Any,
        sm_scale: Any,
        rope_scale: Any,
        rope_theta: Any,
    ) -> None:
        """forward()'s parameters replace the planned ones, as in the reference."""
        checks.check_bool("causal", causal)
        _check_fp16_qk_reduction(use_fp16_qk_reduction)
        check_window(window_left)
        cap = check_score_args(sm_scale, logits_soft_cap)[1]
        check_alibi_cap(check_pos_encoding(pos_encoding_mode), cap)
        check_rope(rope_scale, rope_theta)
        self._set_score_params(
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )

    def end_forward(self) -> None:
        """Deprecated; does nothing (as in the reference)."""

    def _check_q(self, q: Any, plan: _Plan) -> None:
        checks.check_tensor("q", q)
        shape = (plan.total_q, plan.num_qo_heads, plan.head_dim)
        if tuple(q.shape) != shape:
            raise ValueError(
                f"q has shape {tuple(q.shape)}; plan() was for {shape} "
                "([qo_indptr[-1], num_qo_heads, head_dim])"
            )
        if q.dtype != plan.dtype:
            raise TypeError(f"q has dtype {q.dtype}; plan() was for {plan.dtype}")
        check_vectors("q", q)

    def _launch(
        self,
        plan: _Plan,
        q: torch.Tensor,
        kv: tuple[tuple[str, torch.Tensor], ...],
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor | None,
        last_page_len: torch.Tensor | None,
        causal: Any,
        window_left: Any,
        sm_scale: Any,
        logits_soft_cap: Any,
        pos_encoding_mode: Any,
        rope_scale: Any,
        rope_theta: Any,
        q_scale: Any,
        k_scale: Any,
        v_scale: Any,
        out: Any,
        lse: Any,
        return_lse: Any,
        enable_pdl: Any,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """run()'s shared tail: the score parameters (the planned ones, or as engines set
        them since) checked, the outputs checked or allocated, one launch."""
        checks.check_bool("return_lse", return_lse)
        checks.check_optional_bool("enable_pdl", enable_pdl)
        scale, cap = score_params(plan.head_dim, sm_scale, logits_soft_cap, q_scale, k_scale)
        v_scale = check_optional_number("v_scale", v_scale)
        window = check_window(window_left)
        causal = checks.check_bool("causal", causal)
        pos_encoding = check_pos_encoding(pos_encoding_mode)
        check_alibi_cap(pos_encoding, cap)
        # (forward() may have set RoPE since)
        check_rope_cache(plan.kv_dtype, pos_encoding)
        check_rope_head_dims(pos_encoding, plan.head_dim, plan.head_dim_vo)
        rope_rcp_scale, rope_rcp_theta = rope_params(rope_scale, rope_theta)
        checks.check_cuda("q", q, like=self._workspace)
        for name, t in kv:
            checks.check_cuda(name, t, like=q)
        shape = (plan.total_q, plan.num_qo_heads, plan.head_dim_vo)
        if out is None:
            out = torch.empty(shape, dtype=q.dtype, device=q.device)
        else:
            checks.check_tensor("out", out)
            if tuple(out.shape) != shape:
                raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
            if out.dtype != q.dtype:
                raise TypeError(f"out has dtype {out.dtype}, expected {q.dtype}")
            check_vectors("out", out)
            checks.check_writable("out", out)
            checks.check_cuda("out", out, like=q)
            checks.check_distinct("out", out, "q", q)  # not a layout the kernels are made for
        if lse is None and return_lse:
            lse = torch.empty(shape[:2], dtype=torch.float32, device=q.device)
        elif lse is not None:
            check_output("lse", lse, shape[:2], torch.float32, q)
            checks.check_distinct("lse", lse, "out", out)
        if plan.grid_work:  # zero only for a batch without query tokens
            mask, mask_indptr = (
                (self._custom_mask_buf, self._mask_indptr_buf) if plan.has_mask else (None, None)
            )
            (_, k), (_, v) = kv
            _batch_prefill_op(
                q,
                k,
                v,
                self._qo_indptr_buf,
                kv_indptr,
                kv_indices,
                last_page_len,
                mask,
                mask_indptr,
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
                causal,
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


class BatchPrefillWithRaggedKVCacheWrapper(_BatchPrefillWrapper):
    """Prefill attention for a batch of requests whose KV is one ragged tensor: request
    ``b`` owns queries ``qo_indptr[b]:qo_indptr[b+1]`` of ``q`` and keys/values
    ``kv_indptr[b]:kv_indptr[b+1]`` of ``k``/``v``.

    With ``use_cuda_graph=True``, ``qo_indptr_buf`` and ``kv_indptr_buf`` (and, for custom
    masks, ``custom_mask_buf`` and ``mask_indptr_buf``) are the buffers run() reads:
    ``plan()`` copies into them, the batch size is theirs and the first plan fixes the
    largest token count and the schedule's capacity, so a captured ``run()`` replays
    correctly after any later ``plan()``.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        kv_indptr_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        jit_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._setup(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            qo_indptr_buf,
            {"kv_indptr_buf": kv_indptr_buf},
            custom_mask_buf,
            mask_indptr_buf,
            backend,
            jit_args,
            jit_kwargs,
        )
        if use_cuda_graph and kv_indptr_buf.shape[0] != self._fixed_batch_size + 1:
            raise ValueError(
                f"kv_indptr_buf has {kv_indptr_buf.shape[0]} elements; "
                f"qo_indptr_buf has {self._fixed_batch_size + 1}"
            )
        self._kv_indptr_buf = kv_indptr_buf

    @flashinfer_api
    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        seq_lens: torch.Tensor | None = None,
        seq_lens_q: torch.Tensor | None = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        v_indptr: torch.Tensor | None = None,
        o_indptr: torch.Tensor | None = None,
    ) -> None:
        """Fix the batch (see the class). ``custom_mask`` holds each request's ``[qo_len,
        kv_len]`` mask flattened and concatenated; ``packed_custom_mask`` is taken as is
        with the reference's offsets (the running sum of ``qo_len * kv_len``).
        ``fixed_split_size`` is in tokens here (pages of one token). ``seq_lens``,
        ``seq_lens_q``, ``max_token_per_sequence`` and ``max_sequence_kv`` (the reference's
        cuDNN inputs) are checked and stored, not used."""
        opts = _check_options(
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo,
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            sm_scale,
            window_left,
            logits_soft_cap,
            rope_scale,
            rope_theta,
            q_data_type,
            kv_data_type,
            o_data_type,
            non_blocking,
            prefix_len_ptr,
            token_pos_in_items_ptr,
            token_pos_in_items_len,
            max_item_len_ptr,
            fixed_split_size,
            disable_split_kv,
        )
        cudnn_only = "separate value/output offsets exist only in the reference's cuDNN backend"
        _refuse("v_indptr", v_indptr, cudnn_only)
        _refuse("o_indptr", o_indptr, cudnn_only)
        qo_ptr = _host_indptr("qo_indptr", qo_indptr, None)
        batch = len(qo_ptr) - 1
        kv_ptr = _host_indptr("kv_indptr", kv_indptr, batch + 1)
        _check_length_hints(batch, seq_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv)
        self._check_graph_batch(batch, qo_ptr[-1])
        qo_lens = [e - s for s, e in zip(qo_ptr, qo_ptr[1:])]
        kv_lens = [e - s for s, e in zip(kv_ptr, kv_ptr[1:])]
        mask = _check_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens)
        self._check_graph_mask(mask)
        plan, words = self._build(opts, qo_ptr, kv_lens, 1, kv_ptr[-1], mask is not None)
        self._commit(
            opts, plan, words, mask, {"_qo_indptr_buf": qo_indptr, "_kv_indptr_buf": kv_indptr}
        )
        self._seq_lens_kv = seq_lens
        self._seq_lens_q = seq_lens_q
        self._max_token_per_sequence = max_token_per_sequence
        self._max_sequence_kv = max_sequence_kv

    begin_forward = plan

    @flashinfer_api(trace=_trace.batch_prefill_ragged_run_trace)
    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *args: Any,
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        o_scale: float | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        kv_cache_sf: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``[qo_indptr[-1], num_qo_heads, head_dim_qk]``; ``k``/``v``
        ``[kv_indptr[-1], num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_indptr[-1],
        head_dim]`` (HND), head_dim_qk for k and head_dim_vo for v. Returns ``out``
        ``[qo_indptr[-1], num_qo_heads, head_dim_vo]`` (and ``lse`` ``[qo_indptr[-1],
        num_qo_heads]``, base 2, with ``return_lse``)."""
        plan: _Plan = self._planned(args)
        _refuse("kv_cache_sf", kv_cache_sf, "this library has no NVFP4 KV caches")
        if check_optional_number("o_scale", o_scale) not in (None, 1.0):
            raise ValueError(
                f"o_scale must be None or 1.0 (outputs are float16/bfloat16, "
                f"not fp8), got {o_scale}"
            )
        self._check_q(q, plan)
        hnd = self._kv_layout == "HND"
        layout = (
            "[num_kv_heads, kv_indptr[-1], head_dim]"
            if hnd
            else "[kv_indptr[-1], num_kv_heads, head_dim]"
        )
        for name, t, head_dim in (("k", k, plan.head_dim), ("v", v, plan.head_dim_vo)):
            checks.check_tensor(name, t)
            checks.check_ndim(name, t, 3, f"{layout} ({self._kv_layout})")
            if t.dtype != plan.kv_dtype:
                raise TypeError(f"{name} has dtype {t.dtype}; plan() was for {plan.kv_dtype}")
            heads, tokens = (t.shape[0], t.shape[1]) if hnd else (t.shape[1], t.shape[0])
            if (heads, t.shape[2]) != (plan.num_kv_heads, head_dim):
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}; plan() was for "
                    f"{plan.num_kv_heads} kv heads of head_dim {head_dim} "
                    f"({self._kv_layout})"
                )
            if tokens < plan.total_kv:
                raise ValueError(f"{name} has {tokens} tokens; kv_indptr[-1] is {plan.total_kv}")
            check_vectors(name, t)
        if v.shape[:2] != k.shape[:2]:
            raise ValueError(f"v has shape {tuple(v.shape)}, k has {tuple(k.shape)}")
        return self._launch(
            plan,
            q,
            (("k", k), ("v", v)),
            self._kv_indptr_buf,
            None,
            None,
            self._causal,
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

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated: sets the score parameters given here (over the planned ones, as the
        reference does) and calls :meth:`run`."""
        self._override(
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, k, v)

    def forward_return_lse(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated: :meth:`forward` returning ``(out, lse)``."""
        self._override(
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, k, v, return_lse=True)


def _check_length_hints(
    batch: int, seq_lens: Any, seq_lens_q: Any, max_token_per_sequence: Any, max_sequence_kv: Any
) -> None:
    """Per-request length hints (inputs of the reference's other backends; the paged
    schedule reads ``seq_lens``): accepted when well-formed."""
    for name, lens in (("seq_lens", seq_lens), ("seq_lens_q", seq_lens_q)):
        if lens is not None:
            checks.check_tensor(name, lens)
            if lens.numel() != batch:
                raise ValueError(f"{name} has {lens.numel()} elements, expected {batch}")
            checks.check_dtype(name, lens, INDEX + (torch.uint32,))
    for name, value in (
        ("max_token_per_sequence", max_token_per_sequence),
        ("max_sequence_kv", max_sequence_kv),
    ):
        if value is not None:
            checks.check_int(name, value, 0)


class BatchPrefillWithPagedKVCacheWrapper(_BatchPrefillWrapper):
    """Prefill attention for a batch of requests over a paged KV cache: request ``b`` owns
    queries ``qo_indptr[b]:qo_indptr[b+1]`` of ``q`` and pages
    ``paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b+1]]``, the last filled to
    ``paged_kv_last_page_len[b]``.

    With ``use_cuda_graph=True`` the constructor's buffers are the ones run() reads:
    ``plan()`` copies into them, the batch size is theirs and the first plan fixes the
    largest token count and the schedule's capacity, so a captured ``run()`` replays
    correctly after any later ``plan()``. The score parameters (``_causal``,
    ``_sm_scale``, ``_logits_soft_cap``, ``_window_left``) are read at each ``run()``.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        jit_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._setup(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            qo_indptr_buf,
            {
                "paged_kv_indptr_buf": paged_kv_indptr_buf,
                "paged_kv_indices_buf": paged_kv_indices_buf,
                "paged_kv_last_page_len_buf": paged_kv_last_page_len_buf,
            },
            custom_mask_buf,
            mask_indptr_buf,
            backend,
            jit_args,
            jit_kwargs,
        )
        if use_cuda_graph:
            batch = self._fixed_batch_size
            for name, t, length in (
                ("paged_kv_indptr_buf", paged_kv_indptr_buf, batch + 1),
                ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, batch),
            ):
                if t.shape[0] != length:
                    raise ValueError(
                        f"{name} has {t.shape[0]} elements; qo_indptr_buf's "
                        f"batch size {batch} needs {length}"
                    )
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf

    @flashinfer_api
    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
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
        o_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
    ) -> None:
        """Fix the batch (see the class); ``paged_kv_last_page_len[b]`` is in ``[1,
        page_size]`` for a request with pages. ``custom_mask`` holds each request's
        ``[qo_len, kv_len]`` mask flattened and concatenated; ``packed_custom_mask`` is taken
        as is with the reference's offsets (the running sum of ``qo_len * kv_len``).
        ``seq_lens`` steers the split schedule (the kernel reads the lengths from the page
        table); ``fixed_split_size`` is in pages. ``block_tables``, ``seq_lens_q``,
        ``max_token_per_sequence`` and ``max_sequence_kv`` (the reference's other backends'
        inputs) are checked and stored, not used."""
        opts = _check_options(
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo,
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            sm_scale,
            window_left,
            logits_soft_cap,
            rope_scale,
            rope_theta,
            q_data_type,
            kv_data_type,
            o_data_type,
            non_blocking,
            prefix_len_ptr,
            token_pos_in_items_ptr,
            token_pos_in_items_len,
            max_item_len_ptr,
            fixed_split_size,
            disable_split_kv,
        )
        checks.check_int("page_size", page_size, 1, ragged.INT32_MAX)
        qo_ptr = _host_indptr("qo_indptr", qo_indptr, None)
        batch = len(qo_ptr) - 1
        checks.check_index_tensor("paged_kv_indices", paged_kv_indices, None, INDEX)
        kv_ptr = _host_indptr(
            "paged_kv_indptr",
            paged_kv_indptr,
            batch + 1,
            "len(paged_kv_indices)",
            paged_kv_indices.shape[0],
        )
        checks.check_index_tensor("paged_kv_last_page_len", paged_kv_last_page_len, batch, INDEX)
        _check_length_hints(batch, seq_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv)
        if block_tables is not None:
            checks.check_tensor("block_tables", block_tables)
        self._check_graph_batch(batch, qo_ptr[-1])
        if self._use_cuda_graph and paged_kv_indices.shape[0] > self._paged_kv_indices_buf.shape[0]:
            raise ValueError(
                f"{paged_kv_indices.shape[0]} page indices exceed the CUDA-graph "
                f"buffer's {self._paged_kv_indices_buf.shape[0]}"
            )
        last = paged_kv_last_page_len.to("cpu").tolist()
        for b in range(batch):
            if kv_ptr[b + 1] > kv_ptr[b] and not 1 <= last[b] <= page_size:
                raise ValueError(
                    f"paged_kv_last_page_len[{b}] is {last[b]}, must be in "
                    f"[1, page_size={page_size}]"
                )
        kv_lens = kv_lengths(kv_ptr, last, page_size)
        if max(kv_lens, default=0) > ragged.INT32_MAX:
            raise ValueError("KV lengths must be < 2^31")
        qo_lens = [e - s for s, e in zip(qo_ptr, qo_ptr[1:])]
        mask = _check_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens)
        self._check_graph_mask(mask)
        schedule_lens = kv_lens
        if seq_lens is not None:
            schedule_lens = [int(n) for n in seq_lens.to("cpu").reshape(-1).tolist()]
            if min(schedule_lens, default=0) < 0:
                raise ValueError("seq_lens must be >= 0")
        plan, words = self._build(opts, qo_ptr, schedule_lens, page_size, 0, mask is not None)
        self._commit(
            opts,
            plan,
            words,
            mask,
            {
                "_qo_indptr_buf": qo_indptr,
                "_paged_kv_indptr_buf": paged_kv_indptr,
                "_paged_kv_indices_buf": paged_kv_indices,
                "_paged_kv_last_page_len_buf": paged_kv_last_page_len,
            },
        )
        self._seq_lens_kv = seq_lens
        self._seq_lens_q = seq_lens_q if seq_lens_q is not None else seq_lens
        self._block_tables = block_tables
        self._max_q_len = (
            max_token_per_sequence
            if max_token_per_sequence is not None
            else max(qo_lens, default=0)
        )
        self._max_kv_len = (
            max_sequence_kv if max_sequence_kv is not None else max(kv_lens, default=0)
        )

    begin_forward = plan

    @flashinfer_api(trace=_trace.batch_prefill_paged_run_trace)
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
        kv_cache_sf: Any = None,
        skip_softmax_threshold_scale_factor: float | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``[qo_indptr[-1], num_qo_heads, head_dim]``; ``paged_kv_cache`` a ``(k, v)``
        pair of ``[num_pages, page_size, num_kv_heads, head_dim]`` (NHD) or ``[num_pages,
        num_kv_heads, page_size, head_dim]`` (HND), or one ``[num_pages, 2, ...]`` tensor
        (see :mod:`flashinfer.paged_kv`). ``window_left`` overrides the planned window for
        this call. Returns ``out`` (and ``lse`` ``[qo_indptr[-1], num_qo_heads]``, base 2,
        with ``return_lse``)."""
        plan: _Plan = self._planned(args)
        for name, value in (
            ("sinks", sinks),
            ("kv_cache_sf", kv_cache_sf),
            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
        ):
            _refuse(name, value, "this library's prefill kernel does not have it")
        self._check_q(q, plan)
        return self._launch(
            plan,
            q,
            self._check_cache(paged_kv_cache, plan),
            self._paged_kv_indptr_buf,
            self._paged_kv_indices_buf,
            self._paged_kv_last_page_len_buf,
            self._causal,
            self._window_left if window_left is None else window_left,
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

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
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
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
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
            causal,
            pos_encoding_mode,
            use_fp16_qk_reduction,
            window_left,
            logits_soft_cap,
            sm_scale,
            rope_scale,
            rope_theta,
        )
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def _check_cache(self, cache: Any, plan: _Plan) -> tuple[Part, Part]:
        """The key and the value cache as (name, 4-D view) pairs, checked against the plan."""
        parts = check_paged_kv_cache(
            cache,
            self._kv_layout,
            plan.num_kv_heads,
            plan.page_size,
            plan.head_dim,
            plan.kv_dtype,
            plan.head_dim_vo,
        )
        for name, t in parts:
            check_vectors(name, t)
        return parts
