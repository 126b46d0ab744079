"""The prefill module, emulated: csrc/prefill_kernel.cu (the kernel TU as nvcc compiles it,
include/flashinfer/prefill.cuh and the cascade merge behind it) built for the CPU, with the
functions the wrappers call (``batch_prefill``, ``single_prefill``, ...) taking the binding's
arguments. It fills the launcher's ``PrefillLaunch`` as csrc/prefill.cc does; it does not
repeat that binding's argument checks (tests/ops/test_prefill.py covers them)."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from flashinfer.jit.prefill import (
    BATCH_PREFILL_ARGS,
    SINGLE_PREFILL_ARGS,
    PrefillTiling,
    gen_prefill_module,
)

from .binding import cache_strides, pointer
from .engine import EMU_DIR, REPO_ROOT, EmulatedLaunch, build_library

_P, _I64, _F32, _BOOL = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_bool


class PrefillLaunch(ctypes.Structure):
    """csrc/prefill_launcher.h's PrefillLaunch, field by field (the library reports its size
    and offsets; :func:`build_prefill` compares)."""

    _fields_ = [
        ("q", _P),
        ("q_row_stride", _I64),
        ("q_head_stride", _I64),
        ("qo_indptr", _P),
        ("k", _P),
        ("v", _P),
        ("k_page_stride", _I64),
        ("k_slot_stride", _I64),
        ("k_head_stride", _I64),
        ("v_page_stride", _I64),
        ("v_slot_stride", _I64),
        ("v_head_stride", _I64),
        ("kv_indices", _P),
        ("kv_indptr", _P),
        ("kv_last_page_len", _P),
        ("page_size", _I64),
        ("num_indices", _I64),
        ("num_pages", _I64),
        ("mask", _P),
        ("mask_indptr", _P),
        ("out", _P),
        ("out_row_stride", _I64),
        ("out_head_stride", _I64),
        ("lse", _P),
        ("tmp_v", _P),
        ("tmp_lse", _P),
        ("num_qo_heads", _I64),
        ("num_kv_heads", _I64),
        ("score_scale", _F32),
        ("score_cap", _F32),
        ("causal", _BOOL),
        ("window_left", _I64),
        ("single_qo_len", _I64),
        ("single_kv_len", _I64),
        ("plan", _P),
        ("work_capacity", _I64),
        ("merge_capacity", _I64),
        ("grid_work", _I64),
        ("grid_merge", _I64),
        ("chunk_tokens", _I64),
        ("single_chunks", _I64),
        ("pdl", _BOOL),
    ]


class EmulatedPrefill:
    """A prefill module for one dtype, head_dim and tiling, running on the emulator.
    ``land_at_issue`` and ``reverse``: the emulator's schedule (tests/emu/engine.py). The
    outputs and partial-state scratch are filled with NaN before each launch, so a row the
    kernel does not write shows."""

    def __init__(
        self,
        dtype: torch.dtype,
        head_dim: int,
        tiling: PrefillTiling,
        land_at_issue: bool = False,
        reverse: bool = False,
    ) -> None:
        spec = gen_prefill_module(dtype, head_dim, tiling)
        config = spec.renders[0].render()
        library = build_library(
            f"{spec.name}_emu",
            [REPO_ROOT / "csrc" / "prefill_kernel.cu", EMU_DIR / "prefill_emu.cc"],
            [config.parent],
        )
        fields = PrefillLaunch._fields_
        library.emu_prefill_launch_layout.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        layout = (ctypes.c_int64 * (len(fields) + 1))()
        library.emu_prefill_launch_layout(layout)
        want = [
            ctypes.sizeof(PrefillLaunch),
            *(getattr(PrefillLaunch, f).offset for f, _ in fields),
        ]
        if list(layout) != want:
            raise RuntimeError(
                f"PrefillLaunch's size and offsets are {list(layout)}, the mirror's {want}"
            )
        self.head_dim = head_dim
        self.launches: list[dict[str, Any]] = []  # each call's arguments, by name
        self.tile_rows = int(library.emu_prefill_tile_rows())
        self._launch = EmulatedLaunch(library, land_at_issue, reverse)

    def blocks_per_sm(self) -> int:
        return 1

    def _common(self, a: dict[str, Any], kv_heads: int) -> PrefillLaunch:
        q, k, v, out, hnd = a["q"], a["k"], a["v"], a["out"], a["hnd"]
        launch = PrefillLaunch()
        launch.q, launch.q_row_stride, launch.q_head_stride = q.data_ptr(), q.stride(0), q.stride(1)
        launch.k, launch.v = k.data_ptr(), v.data_ptr()
        launch.k_page_stride, launch.k_slot_stride, launch.k_head_stride, _ = cache_strides(k, hnd)
        launch.v_page_stride, launch.v_slot_stride, launch.v_head_stride, _ = cache_strides(v, hnd)
        launch.out, launch.out_row_stride, launch.out_head_stride = (
            out.data_ptr(),
            out.stride(0),
            out.stride(1),
        )
        launch.lse = pointer(a["lse"])
        launch.tmp_v, launch.tmp_lse = a["tmp_v"].data_ptr(), a["tmp_lse"].data_ptr()
        launch.num_qo_heads, launch.num_kv_heads = q.shape[1], kv_heads
        launch.score_scale, launch.score_cap = a["score_scale"], a["score_cap"]
        launch.causal = a["causal"]
        launch.window_left = -1 if a["window_left"] >= 1 << 31 else a["window_left"]
        launch.pdl = bool(a["enable_pdl"])
        return launch

    def _run(self, launch: PrefillLaunch, a: dict[str, Any]) -> None:
        self.launches.append(a)
        for name in ("out", "lse", "tmp_v", "tmp_lse"):
            if a[name] is not None:
                a[name].fill_(float("nan"))
        buffers = [t for t in a.values() if isinstance(t, torch.Tensor)]
        self._launch("emu_prefill_launch", buffers, launch)

    def batch_prefill(self, *args: Any) -> None:
        a = dict(zip(BATCH_PREFILL_ARGS, args, strict=True))
        k, hnd = a["k"], a["hnd"]
        paged = k.dim() == 4
        kv_heads = k.shape[(k.dim() - 3) + (0 if hnd else 1)]
        launch = self._common(a, kv_heads)
        launch.qo_indptr, launch.kv_indptr = a["qo_indptr"].data_ptr(), a["kv_indptr"].data_ptr()
        launch.num_pages, launch.page_size = 1, 1
        if paged:
            launch.kv_indices, launch.kv_last_page_len = (
                a["kv_indices"].data_ptr(),
                a["kv_last_page_len"].data_ptr(),
            )
            launch.num_indices, launch.num_pages = a["kv_indices"].shape[0], k.shape[0]
            launch.page_size = cache_strides(k, hnd)[3]
        launch.mask, launch.mask_indptr = pointer(a["custom_mask"]), pointer(a["mask_indptr"])
        launch.plan = a["plan"].data_ptr()
        launch.work_capacity, launch.merge_capacity = a["work_capacity"], a["merge_capacity"]
        launch.grid_work, launch.grid_merge = a["grid_work"], a["grid_merge"]
        self._run(launch, a)

    def single_prefill(self, *args: Any) -> None:
        a = dict(zip(SINGLE_PREFILL_ARGS, args, strict=True))
        q, k, hnd = a["q"], a["k"], a["hnd"]
        kv_heads = k.shape[0] if hnd else k.shape[1]
        kv_len = cache_strides(k, hnd)[3]
        launch = self._common(a, kv_heads)
        launch.mask = pointer(a["custom_mask"])
        launch.page_size, launch.num_pages = max(kv_len, 1), 1
        launch.single_qo_len, launch.single_kv_len = q.shape[0], kv_len
        rows = q.shape[0] * (q.shape[1] // kv_heads)
        launch.grid_work = -(-rows // self.tile_rows) * a["num_chunks"]
        launch.chunk_tokens, launch.single_chunks = a["chunk_tokens"], a["num_chunks"]
        self._run(launch, a)
