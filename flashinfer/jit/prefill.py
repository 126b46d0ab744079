"""JIT specs of the prefill module: one per dtype, head dims (q/K and V/output), tiling,
position encoding and KV cache dtype, the tensor-core kernel of single, ragged and paged
prefill (include/flashinfer/prefill.cuh)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..config import TILING_NAME, config
from .core import JitSpec, gen_jit_spec
from .dtypes import dtype_info
from .kv_dtype import KV_FP8_DTYPES, check_rope_cache, kv_dtype_info
from .pos_encoding import SCORE_ARGS, pos_encoding_suffix
from .registry import register_op
from .render import PendingRender

HEAD_DIMS = (64, 128, 256)
# (head_dim_qk, head_dim_vo) the kernel is built for: the equal ones, and DeepSeek's MLA prefill
# (q and K rows of 128 dims plus 64 RoPE dims, V and output rows of 128), which serving
# engines run through the ragged wrapper
HEAD_DIM_PAIRS = tuple((d, d) for d in HEAD_DIMS) + ((192, 128),)
DTYPES = ("float16", "bfloat16")
# float32 O and score accumulators a lane may hold (kMTiles * (head_dim + tile_kv) / 2): past
# this the kernel's other state no longer fits in 255 registers without spilling (head_dim 128
# m2kv64's 192 fit exactly)
MAX_ACCUMULATORS = 192
# ... and in 128 registers, for two 256-thread CTAs per SM (ctas=2; head_dim 128 m1kv32's 80
# fit exactly, m1kv64's 96 spill; with overlap, head_dim 64 m1kv32c2p's 64 fit, 128
# m1kv16c2p's 80 spill 16 bytes)
MAX_ACCUMULATORS_TWO_CTAS = 80
MAX_ACCUMULATORS_TWO_CTAS_OVERLAP = 64
# ... and with two tiles' scores (overlap), whose loop holds more besides (the next tiles' rows
# and page-table entry): head_dim 256 m1kv32p's 160 fit, m1kv64p's 192 spill; with m_tiles 2
# and K/V tiles of at most 32 tokens, 192 fit (head_dim 128 m2kv32p), not with 64 (head_dim 64
# m2kv64p spills 112 bytes), nor with q/K rows longer than V's (192/128 m2kv32p spills 56)
MAX_ACCUMULATORS_OVERLAP = 160
MAX_ACCUMULATORS_OVERLAP_M2 = 192
MAX_TILE_KV_OVERLAP_M2 = 32
# ... and with an fp8 KV cache, whose loop widens the landed tiles besides: head_dim 128 m2kv64
# and m2kv32p (192) spill 8 and 64 bytes, 256 m1kv32p (160) fits
MAX_ACCUMULATORS_FP8 = 160


@dataclass(frozen=True)
class PrefillTiling:
    """The prefill kernel's CTA shape (include/flashinfer/prefill.cuh, ``Tiling``): 16-row
    mma tiles per warp (1: eight warps; 2: four warps, each K/V fragment feeding two mma),
    tokens per K/V tile, the CTAs per SM the compiler must fit in registers (2: at most
    128 registers a thread, for m1's 256-thread CTAs), and whether the next tile's scores
    are computed while this tile's softmax runs (``overlap``, a ``p`` in the name: a lane
    holds two tiles' scores). A CTA has 128 query rows."""

    m_tiles: int
    tile_kv: int
    ctas: int = 1
    overlap: bool = False

    @classmethod
    def from_name(cls, name: str) -> PrefillTiling | None:
        """The tiling named ``m<tiles>kv<tokens>[c<ctas>][p]`` (None for another text);
        unchecked."""
        match = TILING_NAME.fullmatch(name)
        if match is None:
            return None
        return cls(int(match[1]), int(match[2]), int(match[3] or 1), match[4] == "p")

    @property
    def name(self) -> str:
        ctas = f"c{self.ctas}" if self.ctas != 1 else ""
        return f"m{self.m_tiles}kv{self.tile_kv}{ctas}{'p' if self.overlap else ''}"

    def accumulators(self, head_dim_vo: int) -> int:
        """float32 accumulators a lane holds with output rows of ``head_dim_vo``: O's and one
        tile's scores, or two tiles' (overlap)."""
        score_tiles = 2 if self.overlap else 1
        return self.m_tiles * (head_dim_vo + score_tiles * self.tile_kv) // 2

    @property
    def threads(self) -> int:
        """Threads per CTA: 128 rows in warps of 16 * m_tiles."""
        return 32 * 128 // (16 * self.m_tiles)

    def check(self, head_dim: int, fp8: bool = False, head_dim_vo: int | None = None) -> None:
        """Raise ValueError when the kernel cannot take this shape at ``head_dim`` (q and K;
        V and the output: ``head_dim_vo``, None for the same; ``fp8``: over an fp8 KV
        cache)."""
        head_dim_vo = head_dim if head_dim_vo is None else head_dim_vo
        dims = f"head_dim {head_dim}" + (f"/{head_dim_vo}" if head_dim_vo != head_dim else "")
        accumulators = self.accumulators(head_dim_vo)
        if self.m_tiles not in (1, 2) or self.tile_kv not in (16, 32, 64):
            raise ValueError(f"{self.name}: m_tiles must be 1 or 2 and tile_kv 16, 32 or 64")
        if self.ctas not in (1, 2) or (self.ctas == 2 and self.m_tiles != 1):
            raise ValueError(
                f"{self.name}: ctas must be 1, or 2 with m_tiles 1 (m2's 128-thread CTAs fit "
                "two per SM already)"
            )
        if self.ctas == 2:
            limit = MAX_ACCUMULATORS_TWO_CTAS_OVERLAP if self.overlap else MAX_ACCUMULATORS_TWO_CTAS
        elif self.overlap:
            roomy = (
                self.m_tiles == 2
                and self.tile_kv <= MAX_TILE_KV_OVERLAP_M2
                and head_dim == head_dim_vo
            )
            limit = MAX_ACCUMULATORS_OVERLAP_M2 if roomy else MAX_ACCUMULATORS_OVERLAP
        else:
            limit = MAX_ACCUMULATORS
        if fp8:
            limit = min(limit, MAX_ACCUMULATORS_FP8)
        if accumulators > limit:
            raise ValueError(
                f"{self.name} at {dims} needs {accumulators} accumulators a "
                f"lane; at most {limit} fit{' with an fp8 KV cache' if fp8 else ''}"
            )
        for dim in {head_dim, head_dim_vo}:
            chunks = self.tile_kv * dim // 8  # 16-byte chunks a K (or V) tile loads
            if chunks % self.threads:
                raise ValueError(
                    f"{self.name} at {dims}: {chunks} 16-byte chunks per tile of "
                    f"{dim}-dim rows do not split evenly over {self.threads} threads"
                )


def accepted_tilings(
    head_dim: int, fp8: bool = False, head_dim_vo: int | None = None
) -> list[PrefillTiling]:
    """Every tiling :meth:`PrefillTiling.check` accepts at ``head_dim`` and ``head_dim_vo``
    (``fp8``: over an fp8 KV cache)."""
    accepted = []
    shapes = itertools.product((1, 2), (16, 32, 64), (1, 2), (False, True))
    for m_tiles, tile_kv, ctas, overlap in shapes:
        tiling = PrefillTiling(m_tiles, tile_kv, ctas, overlap)
        try:
            tiling.check(head_dim, fp8, head_dim_vo)
        except ValueError:
            continue
        accepted.append(tiling)
    return accepted


# The kernel's shapes before other tilings existed (head_dim 128's measured on an H100, against
# 64-row tiles: docs/attention.md), with the softmax overlapping the next tile's scores (not yet
# measured: the registers it adds leave each the same CTAs per SM), by head_dim_qk (192/128
# holds head_dim 128's accumulators); FLASHINFER_PREFILL_TILING overrides them.
DEFAULT_TILINGS = {
    64: PrefillTiling(1, 64, overlap=True),
    128: PrefillTiling(1, 64, overlap=True),
    192: PrefillTiling(1, 64, overlap=True),
    256: PrefillTiling(1, 16, overlap=True),
}


def check_head_dims(head_dim_qk: int, head_dim_vo: int) -> None:
    """Raise ValueError unless the kernel is built for this (head_dim_qk, head_dim_vo)."""
    if (head_dim_qk, head_dim_vo) not in HEAD_DIM_PAIRS:
        raise ValueError(
            f"head_dim_qk {head_dim_qk} with head_dim_vo {head_dim_vo} is not supported: "
            f"equal head dims of {HEAD_DIMS}, or 192 with 128"
        )


def check_rope_head_dims(pos_encoding: str, head_dim_qk: int, head_dim_vo: int) -> None:
    """Raise ValueError for RoPE with different q/K and V head dims: the kernel rotates rows
    with its CTA's threads each keeping one chunk of a half row, and 192's half rows have 12
    (MLA prefill callers rotate q and k themselves)."""
    if pos_encoding == "ROPE_LLAMA" and head_dim_qk != head_dim_vo:
        raise ValueError(
            "pos_encoding_mode='ROPE_LLAMA' needs head_dim_vo equal to head_dim_qk, got "
            f"{head_dim_qk}/{head_dim_vo} (rotate q and k before the call)"
        )


def prefill_tiling(
    head_dim: int, fp8: bool = False, head_dim_vo: int | None = None
) -> PrefillTiling:
    """The tiling of ``head_dim`` (head_dim_qk; ``head_dim_vo`` None for the same):
    FLASHINFER_PREFILL_TILING's entry for it, else the default (``fp8``: over an fp8 KV
    cache)."""
    tiling = DEFAULT_TILINGS[head_dim]
    for entry_dim, *shape in config.prefill_tiling:
        if entry_dim not in DEFAULT_TILINGS:
            raise ValueError(
                f"FLASHINFER_PREFILL_TILING: head_dim {entry_dim} is not one of "
                f"{tuple(DEFAULT_TILINGS)}"
            )
        if entry_dim == head_dim:
            tiling = PrefillTiling(*shape)
    try:
        tiling.check(head_dim, fp8, head_dim_vo)
    except ValueError as err:
        raise ValueError(f"FLASHINFER_PREFILL_TILING: {err}") from None
    return tiling


def prefill_uri(
    dtype: Any,
    head_dim: int,
    tiling: PrefillTiling | None = None,
    pos_encoding: str = "NONE",
    kv_dtype: Any = None,
    head_dim_vo: int | None = None,
) -> str:
    """The module's name; a head_dim_vo other than head_dim, a tiling other than the default,
    a position encoding and an fp8 KV cache are part of it."""
    q, kv = dtype_info(dtype), kv_dtype_info(dtype, kv_dtype)
    base = f"prefill_{q.short}_hd{head_dim}"
    if head_dim_vo is not None and head_dim_vo != head_dim:
        base = f"{base}_vo{head_dim_vo}"
    if kv != q:
        base = f"{base}_kv{kv.short}"
    if tiling is not None and tiling != DEFAULT_TILINGS[head_dim]:
        base = f"{base}_{tiling.name}"
    return base + pos_encoding_suffix(pos_encoding)


# The binding functions' parameters, in order (the debug printer names arguments by them;
# CPU tests bind recorded launches with them).
BATCH_PREFILL_ARGS = (
    "q",
    "k",
    "v",
    "qo_indptr",
    "kv_indptr",
    "kv_indices",
    "kv_last_page_len",
    "custom_mask",
    "mask_indptr",
    "plan",
    "tmp_v",
    "tmp_lse",
    "out",
    "lse",
    "hnd",
    "work_capacity",
    "merge_capacity",
    "tmp_capacity",
    "grid_work",
    "grid_merge",
    "causal",
    "window_left",
    *SCORE_ARGS,
)
SINGLE_PREFILL_ARGS = (
    "q",
    "k",
    "v",
    "custom_mask",
    "tmp_v",
    "tmp_lse",
    "out",
    "lse",
    "hnd",
    "causal",
    "window_left",
    "chunk_tokens",
    "num_chunks",
    *SCORE_ARGS,
)


def gen_prefill_module(
    dtype: Any,
    head_dim: int,
    tiling: PrefillTiling | None = None,
    pos_encoding: str = "NONE",
    kv_dtype: Any = None,
    head_dim_vo: int | None = None,
) -> JitSpec:
    """The spec of the prefill module for ``dtype`` (q and the output) x ``head_dim`` (q and
    K; ``head_dim_vo``: V and the output, None for the same; its attention config rendered
    when planned), with ``tiling`` or :func:`prefill_tiling`'s, built for ``pos_encoding``
    (a ``pos_encoding_mode``: "NONE", "ROPE_LLAMA", which rotates queries and keys in the
    kernel, or "ALIBI") and a KV cache of ``kv_dtype`` (None: ``dtype``; or float8_e4m3fn,
    float8_e5m2, widened to ``dtype`` in shared memory)."""
    info = dtype_info(dtype)
    if info.bits != 16:
        raise TypeError(f"prefill supports float16 and bfloat16, not {info.name}")
    vo = head_dim if head_dim_vo is None else head_dim_vo
    if vo == head_dim and head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    check_head_dims(head_dim, vo)
    check_rope_head_dims(pos_encoding, head_dim, vo)
    kv = kv_dtype_info(dtype, kv_dtype)
    check_rope_cache(kv.name, pos_encoding)
    fp8 = kv.name in KV_FP8_DTYPES
    if tiling is None:
        tiling = prefill_tiling(head_dim, fp8, vo)
    else:
        tiling.check(head_dim, fp8, vo)
    uri = prefill_uri(dtype, head_dim, tiling, pos_encoding, kv_dtype, vo)
    config = PendingRender.of(
        "attention_config.jinja",
        uri,
        "attention_config.h",
        uri=uri,
        dtype_name=info.name,
        cuda_type=info.cuda_type,
        dlpack_code=info.dlpack_code,
        bits=info.bits,
        kv_dtype_name=kv.name,
        kv_cuda_type=kv.cuda_type,
        kv_dlpack_code=kv.dlpack_code,
        kv_bits=kv.bits,
        head_dim=head_dim,
        head_dim_vo=vo,
        prefill_m_tiles=tiling.m_tiles,
        prefill_tile_kv=tiling.tile_kv,
        prefill_ctas=tiling.ctas,
        prefill_overlap=tiling.overlap,
        pos_encoding=pos_encoding,
    )
    return gen_jit_spec(
        uri,
        ["prefill_kernel.cu", "prefill.cc"],
        generated_sources=[config],
        supported_major_versions=[8, 9, 10, 11, 12],  # mma.sync m16n8k16, ldmatrix, cp.async
        function_args={
            "batch_prefill": BATCH_PREFILL_ARGS,
            "single_prefill": SINGLE_PREFILL_ARGS,
            "blocks_per_sm": (),
            "tile_rows": (),
            "pos_encoding": (),
            "kv_dtype": (),
            "head_dim_vo": (),
        },
    )


def tiling_specs(dtype: Any = "bfloat16") -> list[JitSpec]:
    """The module of every accepted tiling at every head_dim pair, for ``dtype``: what the
    per-tiling GPU tests and ``bench_prefill.py --tilings all`` load (the defaults among them)."""
    return [
        gen_prefill_module(dtype, qk, tiling, head_dim_vo=vo)
        for qk, vo in HEAD_DIM_PAIRS
        for tiling in accepted_tilings(qk, False, vo)
    ]


def prefill_variants() -> dict[str, list[dict[str, Any]]]:
    """Each prefill op's builds, as :func:`gen_prefill_module`'s keyword arguments besides
    the tiling (each at its default tiling is what the op registers)."""
    return {
        "prefill": [
            {"dtype": d, "head_dim": qk, "head_dim_vo": vo}
            for d in DTYPES
            for qk, vo in HEAD_DIM_PAIRS
        ],
        "prefill_fp8": [
            {"dtype": d, "head_dim": qk, "kv_dtype": kv, "head_dim_vo": vo}
            for d in DTYPES
            for qk, vo in HEAD_DIM_PAIRS
            for kv in KV_FP8_DTYPES
        ],
        "prefill_pos_encoding": [
            {"dtype": d, "head_dim": h, "pos_encoding": pos}
            for d in DTYPES
            for h in HEAD_DIMS
            for pos in ("ROPE_LLAMA", "ALIBI")
        ],
    }


def _registered_specs(op: str) -> list[JitSpec]:
    return [gen_prefill_module(**kw) for kw in prefill_variants()[op]]


register_op("prefill", lambda: _registered_specs("prefill"))
register_op("prefill_fp8", lambda: _registered_specs("prefill_fp8"))
register_op("prefill_pos_encoding", lambda: _registered_specs("prefill_pos_encoding"))
