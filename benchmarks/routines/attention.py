"""Attention routines, by the API names the reference's CLI uses: the batch decode and
prefill wrappers, single decode / prefill, and a two-level cascade wrapper.

Every request has ``--s_qo`` query and ``--s_kv`` KV tokens (the cascade adds a prefix of
``--shared_kv_len`` tokens shared by all requests); causal masks are bottom-right aligned,
as the library's. Backends: ``fa2`` (this library; ``auto`` resolves to it, ``fa2_tc`` is
decode on the prefill kernel), ``torch`` (``scaled_dot_product_attention``, torch's own
kernel choice), ``flash`` and ``cudnn`` (SDPA pinned to that kernel). The torch backends
start from the inputs the API gets and do what they must: a paged cache is gathered page
by page (inside the timed call; ``--torch_gather untimed`` gathers once before timing, to
time the kernel alone), and ``cudnn``, which has no GQA, repeats the KV heads (timed).
"""

from __future__ import annotations

import argparse
import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from . import (
    FP8_DTYPES,
    HALF_DTYPES,
    OURS,
    Backend,
    BackendUnavailable,
    Case,
    Family,
    Routine,
    build,
    dtype_arg,
    dtype_name,
    flag,
    half_tolerance,
    register,
)

HEAD_DIMS = (64, 128, 192, 256)  # 192: with --head_dim_vo 128 only (DeepSeek's MLA prefill)
# the routines whose APIs take a v of another head_dim than q and k (the paged and cascade
# routines keep one 5-D cache, decode has one head_dim)
_HEAD_DIM_VO = ("BatchPrefillWithRaggedKVCacheWrapper", "single_prefill_with_kv_cache")
_WORKSPACE_BYTES = 256 << 20
_SDPA_KERNELS = {
    "torch": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
_SINGLE = ("single_decode_with_kv_cache", "single_prefill_with_kv_cache")
_DECODE = ("BatchDecodeWithPagedKVCacheWrapper", "single_decode_with_kv_cache")


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    flag(
        group,
        "batch_size",
        type=int,
        default=None,
        help="requests (default 16; single_* routines: 1)",
    )
    flag(group, "s_qo", "--qo-len", type=int, default=1, help="query tokens per request")
    flag(group, "s_kv", "--kv-len", type=int, default=2048, help="KV tokens per request")
    flag(group, "num_qo_heads", type=int, default=32)
    flag(group, "num_kv_heads", type=int, default=8)
    flag(group, "head_dim_qk", "--head-dim", type=int, default=128, choices=HEAD_DIMS)
    flag(
        group,
        "head_dim_vo",
        type=int,
        default=None,
        help="v's and the output's head_dim: --head_dim_qk's, or 128 with --head_dim_qk 192 "
        "(ragged and single prefill)",
    )
    flag(group, "page_size", type=int, default=16, help="tokens per page of paged caches")
    flag(group, "causal", action="store_true", help="causal mask (bottom-right aligned)")
    flag(group, "q_dtype", "--dtype", type=dtype_arg(*HALF_DTYPES), default=torch.bfloat16)
    flag(
        group,
        "kv_dtype",
        type=dtype_arg(*HALF_DTYPES, *FP8_DTYPES),
        default=None,
        help="--q_dtype's, or an fp8 type (float8_e4m3fn, float8_e5m2): our kernels read "
        "it, the torch backends dequantize it in the timed call",
    )
    flag(group, "kv_layout", choices=("NHD", "HND"), default="NHD")
    flag(
        group,
        "shared_kv_len",
        type=int,
        default=1024,
        help="MultiLevelCascadeAttentionWrapper: the prefix every request shares (level 0)",
    )
    flag(
        group,
        "torch_gather",
        choices=("timed", "untimed"),
        default="timed",
        help="paged caches: the torch backends gather the pages in each timed call (as a "
        "torch serving loop must), or once before timing (their kernel alone)",
    )


def _validate(args: argparse.Namespace) -> str | None:
    single = args.routine in _SINGLE
    if args.batch_size is None:
        args.batch_size = 1 if single else 16
    args.head_dim_vo = args.head_dim_qk if args.head_dim_vo is None else args.head_dim_vo
    args.kv_dtype = args.q_dtype if args.kv_dtype is None else args.kv_dtype
    counts = ("batch_size", "s_qo", "num_qo_heads", "num_kv_heads", "page_size", "shared_kv_len")
    small = [f"--{name}" for name in counts if getattr(args, name) < 1]
    if small:
        return f"{', '.join(small)} must be >= 1"
    if single and args.batch_size != 1:
        return f"{args.routine} takes one request: --batch_size 1"
    if args.routine in _DECODE and args.s_qo != 1:
        return "decode takes one query token per request: --s_qo 1"
    if args.s_qo > args.s_kv:
        return "--s_qo must be <= --s_kv"
    if args.num_qo_heads % args.num_kv_heads:
        return "--num_qo_heads must be a multiple of --num_kv_heads"
    if (args.head_dim_qk, args.head_dim_vo) == (192, 128):
        if args.routine not in _HEAD_DIM_VO:
            return f"--head_dim_vo 128 with --head_dim_qk 192: only {', '.join(_HEAD_DIM_VO)}"
    elif args.head_dim_vo != args.head_dim_qk or args.head_dim_qk == 192:
        return (
            "--head_dim_vo must equal --head_dim_qk (64, 128, 256), or be 128 with "
            "--head_dim_qk 192 (this library's kernels)"
        )
    if args.kv_dtype != args.q_dtype and args.kv_dtype not in FP8_DTYPES:
        return "--kv_dtype must equal --q_dtype, or be fp8 (this library's kernels)"
    return None


FAMILY = Family(
    "attention",
    _add_arguments,
    (
        "batch_size",
        "s_qo",
        "s_kv",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "head_dim_vo",
        "page_size",
        "causal",
        "q_dtype",
        "kv_dtype",
        "kv_layout",
        "shared_kv_len",
        "torch_gather",
    ),
    _validate,
)


# -- the data ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PagedKV:
    """A ``[num_pages, 2, ...]`` cache (NHD: ``[page, heads, dim]`` pages, HND: ``[heads,
    page, dim]``) with the gathers the references and torch backends read it through."""

    cache: torch.Tensor
    hnd: bool

    def gather(self, page_ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[batch, heads, length, dim]`` of the pages ``page_ids`` ``[batch,
        pages]`` (the first ``length`` tokens of each row's pages)."""
        batch, pages = page_ids.shape
        flat = page_ids.reshape(-1)

        def side(index: int) -> torch.Tensor:
            t = self.cache[flat, index]
            if self.hnd:  # [batch * pages, heads, page, dim]
                heads, page, dim = t.shape[1:]
                t = t.view(batch, pages, heads, page, dim).transpose(1, 2)
                return t.reshape(batch, heads, pages * page, dim)[:, :, :length]
            page, heads, dim = t.shape[1:]
            return t.view(batch, pages * page, heads, dim)[:, :length].transpose(1, 2)

        return side(0), side(1)

    def tokens(self, page_ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[length, heads, dim]`` of one request's pages ``page_ids`` ``[pages]``."""
        k, v = self.gather(page_ids[None], length)
        return k[0].transpose(0, 1), v[0].transpose(0, 1)


def _page_table(
    batch: int, pages: int, page_size: int, length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr, last_page_len) of ``batch`` requests of ``length`` tokens in ``pages`` pages
    each (their page ids: the rows of a ``[batch, pages]`` table, flattened)."""
    indptr = torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32, device=device)
    last = torch.full((batch,), length - (pages - 1) * page_size, dtype=torch.int32, device=device)
    return indptr, last


def _random_cache(args: argparse.Namespace, num_pages: int, device: torch.device) -> _PagedKV:
    hnd = args.kv_layout == "HND"
    page = (args.num_kv_heads, args.page_size) if hnd else (args.page_size, args.num_kv_heads)
    # drawn in the 16-bit query dtype, never float32: 256 x 32k tokens of cache is 32 GiB
    # in bf16, and a float32 draw beside it would not fit in an 80 GB GPU
    shape = (num_pages, 2, *page, args.head_dim_qk)
    cache = torch.randn(shape, dtype=args.q_dtype, device=device).to(args.kv_dtype)
    return _PagedKV(cache, hnd)


def _torch_kv(
    args: argparse.Namespace, gather: Callable[[], tuple[torch.Tensor, torch.Tensor]]
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """``gather`` as the torch backends call it: each time, or (--torch_gather untimed) on
    the first, untimed call only."""
    if args.torch_gather == "timed":
        return gather
    gathered: list[tuple[torch.Tensor, torch.Tensor]] = []

    def once() -> tuple[torch.Tensor, torch.Tensor]:
        gathered[:] = gathered or [gather()]
        return gathered[0]

    return once


def _pages(length: int, page_size: int) -> int:
    return -(-length // page_size)


def _reference(
    q: torch.Tensor,
    kv_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    batch: int,
    causal: bool,
) -> torch.Tensor:
    """float64 attention of q ``[batch * qo, Hq, D]``, request ``b`` over ``kv_of(b)``
    (K ``[kv, Hk, D]``, V ``[kv, Hk, Dv]``), one request and a bounded block of query rows at
    a time so the scores stay near 1 GB whatever the shape."""
    rows_total, num_qo_heads, dim = q.shape
    qo = rows_total // batch
    out: torch.Tensor | None = None
    for b in range(batch):
        k, v = (t.double() for t in kv_of(b))
        if out is None:
            out = q.new_empty((rows_total, num_qo_heads, v.shape[-1]), dtype=torch.float64)
        kv, num_kv_heads, _ = k.shape
        group = num_qo_heads // num_kv_heads
        rows = q[b * qo : (b + 1) * qo].double().view(qo, num_kv_heads, group, dim)
        step = max(1, (1 << 27) // (num_qo_heads * max(kv, 1)))
        for start in range(0, qo, step):
            block = rows[start : start + step]
            scores = torch.einsum("qhgd,khd->hgqk", block, k) / math.sqrt(dim)
            if causal:
                i = torch.arange(start, start + block.shape[0], device=q.device)[:, None]
                j = torch.arange(kv, device=q.device)[None, :]
                scores.masked_fill_(j > i + (kv - qo), float("-inf"))
            probs = scores.softmax(dim=-1)
            out[b * qo + start : b * qo + start + block.shape[0]] = torch.einsum(
                "hgqk,khd->qhgd", probs, v
            ).reshape(block.shape[0], num_qo_heads, v.shape[-1])
    assert out is not None  # batch >= 1
    return out


def _bottom_right_mask(backend: str, qo: int, kv: int, device: torch.device) -> Any:
    """SDPA's mask for a bottom-right aligned causal mask (None: ``is_causal``, which is
    top-left aligned, serves when qo == kv). CausalBias may dispatch to the flash kernel by
    itself, so the pinned cuDNN kernel gets an explicit boolean mask instead."""
    if qo == kv:
        return None
    if backend == "cudnn":
        return torch.ones(qo, kv, dtype=torch.bool, device=device).tril(kv - qo)
    return causal_lower_right(qo, kv)


def _sdpa(
    backend: str,
    q: torch.Tensor,
    kv_len: int,
    kv: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    causal: bool,
) -> Backend:
    """A torch backend: SDPA of q ``[batch * qo, Hq, D]`` over ``kv()`` (K, V ``[batch, Hk,
    kv_len, D or Dv]``, gathered inside the timed call when that is what it takes)."""
    rows, num_qo_heads, dim = q.shape
    kernel = _SDPA_KERNELS[backend]
    mask: dict[str, Any] = {}

    def call() -> torch.Tensor:
        k, v = kv()
        if k.dtype != q.dtype:  # an fp8 cache: torch attends to it dequantized
            k, v = k.to(q.dtype), v.to(q.dtype)
        batch, num_kv_heads = k.shape[:2]
        qo = rows // batch
        q_t = q.view(batch, qo, num_qo_heads, dim).transpose(1, 2)
        if backend == "cudnn" and num_kv_heads != num_qo_heads:  # no GQA in cuDNN's SDPA
            group = num_qo_heads // num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if "mask" not in mask:  # built by the first (untimed) call
            mask["mask"] = _bottom_right_mask(backend, qo, kv_len, q.device) if causal else None
        context = sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext()
        try:
            with context:
                return F.scaled_dot_product_attention(
                    q_t,
                    k,
                    v,
                    attn_mask=mask["mask"],
                    is_causal=causal and mask["mask"] is None,
                    enable_gqa=k.shape[1] != num_qo_heads,
                )
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as err:
            if kernel is None:
                raise
            raise BackendUnavailable(
                f"torch SDPA has no {backend} kernel for this case ({str(err).splitlines()[0]})"
            ) from err

    return Backend(call, lambda out: out.transpose(1, 2).reshape(rows, num_qo_heads, -1))


def _visible_pairs(qo: int, kv: int, causal: bool) -> int:
    """(query, key) pairs one request scores: all, or below the bottom-right diagonal."""
    return qo * (kv - qo) + qo * (qo + 1) // 2 if causal else qo * kv


def _case(
    args: argparse.Namespace,
    q: torch.Tensor,
    ours: Callable[[str], Backend],
    kv_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    dense_kv: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    kv_len: int,
    kv_tokens: int,
    label: str,
    causal: bool,
) -> Case:
    """The Case of q ``[batch * qo, Hq, D]`` (each request over ``kv_len`` keys, read by
    the references through ``kv_of`` and by the torch backends through ``dense_kv``);
    ``kv_tokens``: KV tokens held in memory (read once), for TB/s."""
    batch, qo, heads, dim = args.batch_size, args.s_qo, args.num_qo_heads, args.head_dim_qk
    dim_vo = args.head_dim_vo
    factories: dict[str, Callable[[], Backend]] = {
        name: (lambda name=name: _sdpa(name, q, kv_len, dense_kv, causal)) for name in _SDPA_KERNELS
    }
    factories.update({name: (lambda name=name: ours(name)) for name in ("fa2", "fa2_tc", "auto")})
    kv_bytes = kv_tokens * args.num_kv_heads * (dim + dim_vo) * args.kv_dtype.itemsize
    kv_name = "" if args.kv_dtype == args.q_dtype else f" kv {dtype_name(args.kv_dtype)}"
    dims = f"d{dim}" if dim_vo == dim else f"d{dim}/{dim_vo}"
    return Case(
        label=f"{label} {qo}/{kv_len} {heads}/{args.num_kv_heads}h {dims} "
        f"{'causal ' if causal else ''}{args.kv_layout} {dtype_name(args.q_dtype)}{kv_name}",
        backends=build(args.backends, factories),
        bytes=q.numel() // dim * (dim + dim_vo) * q.element_size() + kv_bytes,
        flops=2 * batch * _visible_pairs(qo, kv_len, causal) * heads * (dim + dim_vo),
        reference=lambda: _reference(q, kv_of, batch, causal),
        atol=half_tolerance(args.q_dtype),
        rtol=half_tolerance(args.q_dtype),
    )


def _query(args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    return torch.randn(
        args.batch_size * args.s_qo,
        args.num_qo_heads,
        args.head_dim_qk,
        dtype=args.q_dtype,
        device=device,
    )


def _workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def _wrapper_backend(name: str) -> str:
    """The wrappers' ``backend=`` argument for a CLI backend name."""
    return "auto" if name == "auto" else OURS


# -- paged: batch decode, batch prefill, cascade --------------------------------------------------


def _paged_case(args: argparse.Namespace, device: torch.device, decode: bool) -> Case:
    batch, kv_len, page_size = args.batch_size, args.s_kv, args.page_size
    pages = _pages(kv_len, page_size)
    paged = _random_cache(args, batch * pages, device)
    page_ids = torch.randperm(batch * pages, device=device).view(batch, pages)
    indptr, last = _page_table(batch, pages, page_size, kv_len, device)
    indices = page_ids.reshape(-1).to(torch.int32)
    q = _query(args, device)
    dims = (args.num_qo_heads, args.num_kv_heads, args.head_dim_qk)
    workspace: list[torch.Tensor] = []

    def ours(name: str) -> Backend:
        from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
        from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper

        workspace[:] = workspace or [_workspace(device)]
        if decode:
            wrapper: Any = BatchDecodeWithPagedKVCacheWrapper(
                workspace[0],
                kv_layout=args.kv_layout,
                use_tensor_cores=name == "fa2_tc",
                backend=_wrapper_backend(name),
            )
            wrapper.plan(
                indptr,
                indices,
                last,
                *dims,
                page_size,
                q_data_type=args.q_dtype,
                kv_data_type=args.kv_dtype,
            )
        else:
            wrapper = BatchPrefillWithPagedKVCacheWrapper(
                workspace[0], kv_layout=args.kv_layout, backend=_wrapper_backend(name)
            )
            qo_indptr = torch.arange(
                0, (batch + 1) * args.s_qo, args.s_qo, dtype=torch.int32, device=device
            )
            wrapper.plan(
                qo_indptr,
                indptr,
                indices,
                last,
                *dims,
                page_size,
                causal=args.causal,
                q_data_type=args.q_dtype,
                kv_data_type=args.kv_dtype,
            )
        out = torch.empty_like(q)
        return Backend(
            lambda: wrapper.run(q, paged.cache, out=out, enable_pdl=args.enable_pdl),
            resolved="fa2_tc" if name == "fa2_tc" else OURS,
        )

    return _case(
        args,
        q,
        ours,
        lambda b: paged.tokens(page_ids[b], kv_len),
        _torch_kv(args, lambda: paged.gather(page_ids, kv_len)),
        kv_len,
        batch * kv_len,
        f"{batch}x page {page_size}",
        causal=args.causal and not decode,
    )


def _cascade_case(args: argparse.Namespace, device: torch.device) -> Case:
    """Level 0: a prefix of ``--shared_kv_len`` tokens every request attends to; level 1:
    each request's own ``--s_kv`` tokens (causal applies there, as the wrapper does)."""
    batch, qo, kv_len, shared = args.batch_size, args.s_qo, args.s_kv, args.shared_kv_len
    page_size = args.page_size
    shared_pages, own_pages = _pages(shared, page_size), _pages(kv_len, page_size)
    total = shared_pages + batch * own_pages
    paged = _random_cache(args, total, device)
    ids = torch.randperm(total, device=device)
    shared_ids, own_ids = ids[:shared_pages], ids[shared_pages:].view(batch, own_pages)
    q = _query(args, device)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        (sk, sv), (ok, ov) = paged.tokens(shared_ids, shared), paged.tokens(own_ids[b], kv_len)
        return torch.cat([sk, ok]), torch.cat([sv, ov])

    def dense_kv() -> tuple[torch.Tensor, torch.Tensor]:
        (sk, sv), (ok, ov) = paged.gather(shared_ids[None], shared), paged.gather(own_ids, kv_len)
        return (
            torch.cat([sk.expand(batch, -1, -1, -1), ok], dim=2),
            torch.cat([sv.expand(batch, -1, -1, -1), ov], dim=2),
        )

    def ours(name: str) -> Backend:
        from flashinfer.cascade import MultiLevelCascadeAttentionWrapper

        int32 = dict(dtype=torch.int32, device=device)
        shared_indptr, shared_last = _page_table(1, shared_pages, page_size, shared, device)
        own_indptr, own_last = _page_table(batch, own_pages, page_size, kv_len, device)
        wrapper = MultiLevelCascadeAttentionWrapper(2, _workspace(device), kv_layout=args.kv_layout)
        wrapper.plan(
            [
                torch.tensor([0, batch * qo], **int32),
                torch.arange(0, (batch + 1) * qo, qo, **int32),
            ],
            [shared_indptr, own_indptr],
            [shared_ids.to(torch.int32), own_ids.reshape(-1).to(torch.int32)],
            [shared_last, own_last],
            args.num_qo_heads,
            args.num_kv_heads,
            args.head_dim_qk,
            page_size,
            causal=args.causal,
            q_data_type=args.q_dtype,
            kv_data_type=args.kv_dtype,
        )
        return Backend(lambda: wrapper.run(q, paged.cache), resolved=OURS)

    return _case(
        args,
        q,
        ours,
        kv_of,
        _torch_kv(args, dense_kv),
        shared + kv_len,
        shared + batch * kv_len,
        f"{batch}x shared {shared} page {page_size}",
        causal=args.causal,
    )


# -- dense: ragged batch prefill, single decode / prefill ---------------------------------------


def _api_kv(
    args: argparse.Namespace, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """K and V of ``batch * s_kv`` tokens in the API's layout (NHD ``[tokens, Hk, D]``, HND
    ``[Hk, tokens, D]``; V's D is --head_dim_vo), and the ``[batch, Hk, s_kv, D]`` view of
    either (no copy)."""
    batch, kv_len, heads = args.batch_size, args.s_kv, args.num_kv_heads
    hnd = args.kv_layout == "HND"

    def tensor(dim: int) -> torch.Tensor:
        shape = (heads, batch * kv_len, dim) if hnd else (batch * kv_len, heads, dim)
        return torch.randn(shape, dtype=args.q_dtype, device=device).to(args.kv_dtype)

    k, v = tensor(args.head_dim_qk), tensor(args.head_dim_vo)

    def per_request(t: torch.Tensor) -> torch.Tensor:
        if hnd:
            return t.view(heads, batch, kv_len, -1).transpose(0, 1)
        return t.view(batch, kv_len, heads, -1).transpose(1, 2)

    return k, v, per_request


def _ragged_case(args: argparse.Namespace, device: torch.device) -> Case:
    batch = args.batch_size
    q = _query(args, device)
    k, v, per_request = _api_kv(args, device)
    k_b, v_b = per_request(k), per_request(v)

    def ours(name: str) -> Backend:
        from flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper

        int32 = dict(dtype=torch.int32, device=device)
        wrapper = BatchPrefillWithRaggedKVCacheWrapper(
            _workspace(device), kv_layout=args.kv_layout, backend=_wrapper_backend(name)
        )
        wrapper.plan(
            torch.arange(0, (batch + 1) * args.s_qo, args.s_qo, **int32),
            torch.arange(0, (batch + 1) * args.s_kv, args.s_kv, **int32),
            args.num_qo_heads,
            args.num_kv_heads,
            args.head_dim_qk,
            head_dim_vo=args.head_dim_vo,
            causal=args.causal,
            q_data_type=args.q_dtype,
            kv_data_type=args.kv_dtype,
        )
        out = q.new_empty((*q.shape[:2], args.head_dim_vo))
        return Backend(
            lambda: wrapper.run(q, k, v, out=out, enable_pdl=args.enable_pdl), resolved=OURS
        )

    return _case(
        args,
        q,
        ours,
        lambda b: (k_b[b].transpose(0, 1), v_b[b].transpose(0, 1)),
        lambda: (k_b, v_b),
        args.s_kv,
        batch * args.s_kv,
        f"{batch}x ragged",
        causal=args.causal,
    )


def _single_case(args: argparse.Namespace, device: torch.device, decode: bool) -> Case:
    q = _query(args, device)
    k, v, per_request = _api_kv(args, device)
    k_b, v_b = per_request(k), per_request(v)
    causal = args.causal and not decode  # one query token sees every key either way

    def ours(name: str) -> Backend:
        if decode:
            from flashinfer.decode import single_decode_with_kv_cache

            return Backend(
                lambda: single_decode_with_kv_cache(
                    q[0], k, v, kv_layout=args.kv_layout, use_tensor_cores=name == "fa2_tc"
                ),
                output=lambda out: out[None],
                resolved="fa2_tc" if name == "fa2_tc" else OURS,
            )
        from flashinfer.prefill import single_prefill_with_kv_cache

        return Backend(
            lambda: single_prefill_with_kv_cache(
                q, k, v, causal=causal, kv_layout=args.kv_layout, backend=_wrapper_backend(name)
            ),
            resolved=OURS,
        )

    return _case(
        args,
        q,
        ours,
        lambda b: (k_b[0].transpose(0, 1), v_b[0].transpose(0, 1)),
        lambda: (k_b, v_b),
        args.s_kv,
        args.s_kv,
        "single",
        causal=causal,
    )


_TORCH = tuple(_SDPA_KERNELS)


def _register(
    name: str,
    help: str,
    make_case: Callable[[argparse.Namespace, torch.device], Case],
    ours: tuple[str, ...],
    pdl: bool,
) -> None:
    register(Routine(name, FAMILY, help, ours + _TORCH, make_case, pdl=pdl))


_register(
    "BatchDecodeWithPagedKVCacheWrapper",
    "decode over a paged KV cache: plan() once, run() timed",
    lambda args, device: _paged_case(args, device, decode=True),
    ("fa2", "fa2_tc", "auto"),
    pdl=True,
)
_register(
    "BatchPrefillWithPagedKVCacheWrapper",
    "prefill over a paged KV cache: plan() once, run() timed",
    lambda args, device: _paged_case(args, device, decode=False),
    ("fa2", "auto"),
    pdl=True,
)
_register(
    "BatchPrefillWithRaggedKVCacheWrapper",
    "prefill over ragged (contiguous per request) K/V: plan() once, run() timed",
    _ragged_case,
    ("fa2", "auto"),
    pdl=True,
)
_register(
    "single_decode_with_kv_cache",
    "one query token over one request's K/V",
    lambda args, device: _single_case(args, device, decode=True),
    ("fa2", "fa2_tc"),
    pdl=False,
)
_register(
    "single_prefill_with_kv_cache",
    "one request's queries over its K/V",
    lambda args, device: _single_case(args, device, decode=False),
    ("fa2", "auto"),
    pdl=False,
)
_register(
    "MultiLevelCascadeAttentionWrapper",
    "two levels: a shared prefix (--shared_kv_len) and each request's own KV",
    _cascade_case,
    ("fa2",),
    pdl=False,
)
