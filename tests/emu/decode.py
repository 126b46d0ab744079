"""The decode module, emulated: csrc/decode_kernel.cu (the kernel TU as nvcc compiles it,
include/flashinfer/decode.cuh with its split-KV merge) built for the CPU, with the functions
the wrappers call (``batch_decode``, ``single_decode``, ``blocks_per_sm``) taking the
binding's arguments. It fills the launcher's ``DecodeKV`` and ``DecodeLaunch`` as
csrc/decode.cc does; it does not repeat that binding's argument checks (tests/ops/test_decode.py
covers them)."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from flashinfer.jit.decode import gen_decode_module

from .binding import cache_strides, pointer
from .engine import EMU_DIR, REPO_ROOT, EmulatedLaunch, build_library

_P, _I64, _F32, _BOOL = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_bool


class DecodeKV(ctypes.Structure):
    """csrc/decode_launcher.h's DecodeKV, field by field."""

    _fields_ = [
        ("k", _P),
        ("v", _P),
        ("k_page_stride", _I64),
        ("k_slot_stride", _I64),
        ("k_head_stride", _I64),
        ("v_page_stride", _I64),
        ("v_slot_stride", _I64),
        ("v_head_stride", _I64),
        ("indices", _P),
        ("indptr", _P),
        ("last_page_len", _P),
        ("page_size", _I64),
        ("num_indices", _I64),
        ("num_pages", _I64),
    ]


class DecodeLaunch(ctypes.Structure):
    """csrc/decode_launcher.h's DecodeLaunch, field by field."""

    _fields_ = [
        ("q", _P),
        ("q_batch_stride", _I64),
        ("q_head_stride", _I64),
        ("out", _P),
        ("out_batch_stride", _I64),
        ("out_head_stride", _I64),
        ("lse", _P),
        ("tmp_v", _P),
        ("tmp_lse", _P),
        ("num_qo_heads", _I64),
        ("num_kv_heads", _I64),
        ("score_scale", _F32),
        ("score_cap", _F32),
        ("plan", _P),
        ("work_capacity", _I64),
        ("merge_capacity", _I64),
        ("grid_work", _I64),
        ("grid_merge", _I64),
        ("chunk_tokens", _I64),
        ("window_left", _I64),
        ("single_len", _I64),
        ("pdl", _BOOL),
    ]


def _layout(struct: type[ctypes.Structure]) -> list[int]:
    return [ctypes.sizeof(struct), *(getattr(struct, f).offset for f, _ in struct._fields_)]


class EmulatedDecode:
    """A decode module for one dtype and head_dim, running on the emulator. ``land_at_issue``
    and ``reverse``: the emulator's schedule (tests/emu/engine.py). The outputs and the
    partial-state scratch are filled with NaN before each launch, so a row the kernel does
    not write shows. ``launches`` records each call's arguments by name."""

    def __init__(
        self, dtype: torch.dtype, head_dim: int, land_at_issue: bool = False, reverse: bool = False
    ) -> None:
        spec = gen_decode_module(dtype, head_dim)
        config = spec.renders[0].render()
        library = build_library(
            f"{spec.name}_emu",
            [REPO_ROOT / "csrc" / "decode_kernel.cu", EMU_DIR / "decode_emu.cc"],
            [config.parent],
        )
        want = _layout(DecodeKV) + _layout(DecodeLaunch)
        library.emu_decode_layout.argtypes = [ctypes.POINTER(ctypes.c_int64)]
        layout = (ctypes.c_int64 * len(want))()
        library.emu_decode_layout(layout)
        if list(layout) != want:
            raise RuntimeError(
                f"DecodeKV and DecodeLaunch's sizes and offsets are {list(layout)}, the "
                f"mirrors' {want}"
            )
        self._args = spec.function_args
        self.head_dim = head_dim
        self.launches: list[dict[str, Any]] = []
        self._launch = EmulatedLaunch(library, land_at_issue, reverse)

    def blocks_per_sm(self, group: int) -> int:
        return 1

    def _common(self, a: dict[str, Any], kv_heads: int) -> DecodeLaunch:
        """The fields batch and single decode share (csrc/decode.cc's LaunchOf)."""
        q, out = a["q"], a["out"]
        batched = q.dim() == 3
        launch = DecodeLaunch()
        launch.q, launch.q_head_stride = q.data_ptr(), q.stride(-2)
        launch.q_batch_stride = q.stride(0) if batched else 0
        launch.out, launch.out_head_stride = out.data_ptr(), out.stride(-2)
        launch.out_batch_stride = out.stride(0) if batched else 0
        launch.lse = pointer(a["lse"])
        launch.tmp_v, launch.tmp_lse = a["tmp_v"].data_ptr(), a["tmp_lse"].data_ptr()
        launch.num_qo_heads, launch.num_kv_heads = q.shape[-2], kv_heads
        launch.score_scale, launch.score_cap = a["score_scale"], a["score_cap"]
        launch.window_left = a["window_left"]
        launch.pdl = bool(a["enable_pdl"])
        return launch

    def _run(self, kv: DecodeKV, launch: DecodeLaunch, a: dict[str, Any]) -> None:
        self.launches.append(a)
        for name in ("out", "lse", "tmp_v", "tmp_lse"):
            if a[name] is not None:
                a[name].fill_(float("nan"))
        buffers = [t for t in a.values() if isinstance(t, torch.Tensor)]
        self._launch("emu_decode_launch", buffers, kv, launch)

    def batch_decode(self, *args: Any) -> None:
        a = dict(zip(self._args["batch_decode"], args, strict=True))
        k, v, hnd = a["k_cache"], a["v_cache"], a["hnd"]
        kv_heads = k.shape[1] if hnd else k.shape[2]
        kv = DecodeKV()
        kv.k, kv.v = k.data_ptr(), v.data_ptr()
        kv.k_page_stride, kv.k_slot_stride, kv.k_head_stride, kv.page_size = cache_strides(k, hnd)
        kv.v_page_stride, kv.v_slot_stride, kv.v_head_stride, _ = cache_strides(v, hnd)
        kv.indices, kv.indptr = a["kv_indices"].data_ptr(), a["kv_indptr"].data_ptr()
        kv.last_page_len = a["kv_last_page_len"].data_ptr()
        kv.num_indices, kv.num_pages = a["kv_indices"].shape[0], k.shape[0]
        launch = self._common(a, kv_heads)
        launch.plan = a["plan"].data_ptr()
        launch.work_capacity, launch.merge_capacity = a["work_capacity"], a["merge_capacity"]
        launch.grid_work, launch.grid_merge = a["grid_work"], a["grid_merge"]
        self._run(kv, launch, a)

    def single_decode(self, *args: Any) -> None:
        a = dict(zip(self._args["single_decode"], args, strict=True))
        k, v, hnd = a["k"], a["v"], a["hnd"]
        kv_heads = k.shape[0] if hnd else k.shape[1]
        kv = DecodeKV()
        kv.k, kv.v = k.data_ptr(), v.data_ptr()
        _, kv.k_slot_stride, kv.k_head_stride, kv_len = cache_strides(k, hnd)
        _, kv.v_slot_stride, kv.v_head_stride, _ = cache_strides(v, hnd)
        kv.page_size, kv.num_pages = max(kv_len, 1), 1
        launch = self._common(a, kv_heads)
        launch.grid_work, launch.chunk_tokens = a["num_chunks"], a["chunk_tokens"]
        launch.single_len = kv_len
        self._run(kv, launch, a)
