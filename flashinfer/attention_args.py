"""What the attention families (decode, prefill, cascade) share: argument checks in the
reference's terms, the score parameters in the kernels' log2 units, and the workspace
helpers of the wrappers."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from . import checks, ragged
from .alibi import alibi_slopes_log2
from .custom_op import is_symbolic
from .jit.dtypes import FP8_NAMES, dtype_info
from .jit.pos_encoding import POS_ENCODINGS

DTYPES = (torch.float16, torch.bfloat16)
INDEX = (torch.int32, torch.int64)
LOG2E = 1.4426950408889634
ALIGN = 256  # bytes: each workspace region starts at a multiple of this offset
# Each wrapper's own device buffer for its schedule, and its pinned staging twin (the
# reference library's sizes).
INT_WORKSPACE_BYTES = 8 << 20
BACKENDS = ("auto", "fa2")
# grid.y: the KV heads of the attention kernels, the query heads of their merges
MAX_GRID_Y = 65535


def check_heads(
    num_qo_heads: Any,
    num_kv_heads: Any,
    head_dim: Any,
    head_dims: tuple[int, ...],
    *,
    head_dim_name: str = "head_dim",
    kv_heads_from: str = "",
) -> int:
    """The GQA group size, after checking the head counts and that ``head_dim`` (the
    argument ``head_dim_name``) is one of the family's ``head_dims``. ``kv_heads_from``:
    where a count read from a tensor came from (a k of the other layout shows there)."""
    checks.check_int("num_qo_heads", num_qo_heads, 1, MAX_GRID_Y)
    checks.check_int("num_kv_heads", num_kv_heads, 1)
    if head_dim not in head_dims:
        raise ValueError(
            f"{head_dim_name} must be one of {', '.join(map(str, head_dims))}, got {head_dim}"
        )
    if num_qo_heads % num_kv_heads:
        source = f", {kv_heads_from}" if kv_heads_from else ""
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
            f"({num_kv_heads}{source}): the GQA group size must be integral"
        )
    return num_qo_heads // num_kv_heads


def check_dtype_name(name: str, value: Any) -> torch.dtype:
    """A torch dtype or its name, as the reference accepts ``q_data_type`` and friends."""
    if isinstance(value, str):
        try:
            value = getattr(torch, dtype_info(value).name)
        except TypeError:
            raise TypeError(
                f"{name} {value!r} is not a supported dtype; use float16 or bfloat16"
            ) from None
    if value not in DTYPES:
        raise TypeError(f"{name} is {value}; supported: float16, bfloat16")
    return value


# KV cache dtypes besides q's (the decode and prefill kernels read them)
FP8_KV_DTYPES = tuple(getattr(torch, name) for name in FP8_NAMES)


def check_kv_dtype(name: str, value: Any, q_dtype: torch.dtype) -> torch.dtype:
    """The KV cache dtype ``name`` gives (None: q's): q's dtype or one of FP8_KV_DTYPES."""
    if value is None:
        return q_dtype
    if isinstance(value, str):
        named = getattr(torch, value.removeprefix("torch."), None)
        value = named if named in FP8_KV_DTYPES else value
    if value in FP8_KV_DTYPES:
        return value
    try:
        dtype = check_dtype_name(name, value)
    except TypeError:
        dtype = None
    if dtype == q_dtype:
        return dtype
    supported = ", ".join(map(str, (q_dtype, *FP8_KV_DTYPES)))
    if dtype is None:
        raise TypeError(f"{name} {value!r} is not a supported dtype; supported: {supported}")
    raise TypeError(f"{name} {dtype} differs from q_data_type {q_dtype}; supported: {supported}")


def check_kv_tensor_dtypes(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> None:
    """k and v share one dtype: q's or one of FP8_KV_DTYPES."""
    if k.dtype not in FP8_KV_DTYPES:
        checks.check_same_dtype("k", k, "q", q)
    checks.check_same_dtype("v", v, "k", k)


def check_out_dtype(value: Any, q_dtype: torch.dtype) -> None:
    """``o_data_type`` (None: q's) must be q's dtype: the output takes it."""
    dtype = None if value is None else check_dtype_name("o_data_type", value)
    if dtype not in (None, q_dtype):
        raise TypeError(
            f"o_data_type {dtype} differs from q_data_type {q_dtype}; the output takes q's dtype"
        )


def check_optional_number(
    name: str, value: Any, low: float | None = None, low_open: bool = False
) -> float | None:
    return None if value is None else checks.check_number(name, value, low, low_open=low_open)


def check_score_args(sm_scale: Any, logits_soft_cap: Any) -> tuple[float | None, float]:
    """``sm_scale`` (None: the default) and the soft cap (0: none), validated."""
    return (
        check_optional_number("sm_scale", sm_scale, 0.0, low_open=True),
        check_optional_number("logits_soft_cap", logits_soft_cap, 0.0) or 0.0,
    )


def score_params(
    head_dim: int, sm_scale: Any, logits_soft_cap: Any, q_scale: Any = None, k_scale: Any = None
) -> tuple[float, float]:
    """(scale, cap) as the kernel applies them, in log2 units (see decode.cuh)."""
    sm_scale, cap = check_score_args(sm_scale, logits_soft_cap)
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    for name, factor in (("q_scale", q_scale), ("k_scale", k_scale)):
        if factor is not None:
            scale *= checks.check_number(name, factor, 0.0, low_open=True)
    if cap > 0:
        return scale / cap, cap * LOG2E
    return scale * LOG2E, 0.0


def check_window(window_left: Any) -> int:
    return checks.check_int("window_left", window_left, -1)


def check_pos_encoding(mode: Any) -> str:
    """``pos_encoding_mode``: "NONE" (q and k used as given), "ROPE_LLAMA" (RoPE inside
    attention) or "ALIBI" (each score biased by its head's slope times the key's distance to
    the query), each its own build of the kernels."""
    if mode not in POS_ENCODINGS:
        raise ValueError(
            f"pos_encoding_mode {mode!r} is not supported; use one of "
            f"{', '.join(map(repr, POS_ENCODINGS))}"
        )
    return mode


def check_alibi_cap(pos_encoding: str, cap: float | None) -> None:
    """ALiBi with a logits soft cap is refused: the reference's kernels scale such scores by
    sm_scale twice, which no caller means."""
    if pos_encoding == "ALIBI" and cap:
        raise ValueError("pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap")


def alibi_slopes_for(pos_encoding: str, num_qo_heads: int, like: torch.Tensor) -> Any:
    """The slopes an ALiBi launch on ``like``'s device passes
    (:func:`flashinfer.alibi.alibi_slopes_log2`; a placeholder while tracing with fake
    tensors, never cached); None for the other encodings."""
    if pos_encoding != "ALIBI":
        return None
    if is_fake(like) or like.is_meta:
        return torch.empty(num_qo_heads, dtype=torch.float32, device=like.device)
    return alibi_slopes_log2(num_qo_heads, like.device)


def check_rope(rope_scale: Any, rope_theta: Any) -> None:
    """``rope_scale`` and ``rope_theta`` (None: 1 and 1e4), positive when given."""
    check_optional_number("rope_scale", rope_scale, 0.0, low_open=True)
    check_optional_number("rope_theta", rope_theta, 0.0, low_open=True)


def rope_params(rope_scale: Any, rope_theta: Any) -> tuple[float, float]:
    """(1 / rope_scale, 1 / rope_theta) as the kernels take them, with the reference's
    defaults (rope_scale 1, rope_theta 1e4)."""
    check_rope(rope_scale, rope_theta)
    scale = 1.0 if rope_scale is None else float(rope_scale)
    theta = 1e4 if rope_theta is None else float(rope_theta)
    return 1.0 / scale, 1.0 / theta


def check_output(
    name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor
) -> None:
    checks.check_tensor(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    checks.check_cuda(name, t, like=like)


def check_vectors(name: str, t: torch.Tensor) -> None:
    """The kernel moves 16-byte vectors: the last dim contiguous, every other stride a
    multiple of 16 bytes (8 elements, 16 of an fp8 cache) and the data 16-byte aligned
    (checked by the binding where the call is traced: fake tensors have no address)."""
    checks.check_last_dim_contiguous(name, t)
    vec = 16 // t.element_size()
    for dim in range(t.dim() - 1):
        if t.shape[dim] > 1 and t.stride(dim) % vec:
            raise ValueError(
                f"{name}'s strides must be multiples of {vec} elements (16 "
                f"bytes), got {tuple(t.stride())}"
            )
    if not is_symbolic(t) and t.data_ptr() % 16:
        raise ValueError(f"{name} must be 16-byte aligned")


def apply_v_scale(out: torch.Tensor, v_scale: float | None) -> None:
    """The reference applies ``v_scale`` to the finished output; so do we."""
    if v_scale is not None and v_scale != 1.0:
        out.mul_(v_scale)


def check_workspace(name: str, buffer: Any) -> torch.Tensor:
    """A contiguous, 16-byte aligned 1-D buffer, viewed as bytes. A fake buffer (a wrapper
    built to trace a model without a GPU) has no address to check."""
    checks.check_tensor(name, buffer)
    if buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor")
    if not is_symbolic(buffer) and buffer.data_ptr() % 16:
        raise ValueError(f"{name} must be 16-byte aligned")
    return buffer.view(torch.uint8)


def pinned_like(buffer: torch.Tensor) -> torch.Tensor:
    """The host staging twin of a device buffer (pinned when the buffer is on a GPU)."""
    pin = buffer.device.type == "cuda" and not is_symbolic(buffer)
    return torch.empty(buffer.numel(), dtype=torch.uint8, device="cpu", pin_memory=pin)


def to_device(
    t: torch.Tensor, like: torch.Tensor, non_blocking: bool, dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """``t`` as ``dtype`` on ``like``'s device, where plan() puts the arrays run()'s kernel
    reads (``t`` itself when it already is). A host ``t`` bound for fake buffers (a wrapper
    planned to trace a model without a GPU) becomes a fake tensor of its shape: nothing
    reads its values."""
    if is_symbolic(like) and not is_symbolic(t):
        return like.new_empty(t.shape, dtype=dtype)
    if dtype == torch.int32 and t.dtype == torch.int64:  # clamped where it lands
        return ragged.int32_ids(t.to(device=like.device, non_blocking=non_blocking))
    return t.to(device=like.device, dtype=dtype, non_blocking=non_blocking)


def copy_prefix(buffer: torch.Tensor, t: torch.Tensor, non_blocking: bool) -> None:
    """``buffer[:len(t)] = t``: plan() filling a CUDA-graph buffer. A fake buffer has no
    contents to fill."""
    if not is_symbolic(buffer):
        if buffer.dtype == torch.int32 and t.dtype == torch.int64:
            t = to_device(t, buffer, non_blocking)  # narrowed as to_device narrows
        buffer.narrow(0, 0, t.shape[0]).copy_(t, non_blocking=non_blocking)


def round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class WorkspaceOwner:
    """The workspace methods decode and prefill wrappers share (they set the attributes)."""

    _copy_done: torch.cuda.Event | None
    _int_workspace_buffer: torch.Tensor
    _pin_memory_int_workspace_buffer: torch.Tensor
    _workspace: torch.Tensor  # the float workspace as bytes
    _plan_info: Any

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor
    ) -> None:
        """Use new workspaces; the next ``run()`` needs a new ``plan()``."""
        self._workspace = check_workspace("float_workspace_buffer", float_workspace_buffer)
        check_workspace("int_workspace_buffer", int_workspace_buffer)
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the staging buffer is about to be replaced
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer
        self._pin_memory_int_workspace_buffer = pinned_like(int_workspace_buffer)
        self._plan_info = None

    def _planned(self, args: tuple[Any, ...]) -> Any:
        """The current plan, for a run() whose extra positional arguments are ``args``."""
        if self._plan_info is None:
            raise RuntimeError("call plan() before run()")
        if args:
            raise ValueError(
                "run() got extra positional arguments: they feed custom kernel "
                "variants (jit_args), which this library does not have"
            )
        return self._plan_info

    def _tmp_rows_fit(self, num_qo_heads: int, head_dim: int) -> int:
        """How many split-KV partial-state rows (``num_qo_heads`` heads of ``head_dim``
        floats and their LSEs) the float workspace holds at least, as _split_buffers lays
        them out."""
        return max(0, self._workspace.numel() - 2 * ALIGN) // (4 * num_qo_heads * (head_dim + 1))

    def _split_buffers(
        self, num_words: int, tmp_rows: int, num_qo_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where a plan's schedule (``num_words`` int32 words, in the int workspace) and its
        split-KV partial states (float32 ``tmp_v`` and ``tmp_lse`` for ``tmp_rows`` rows, in
        the float workspace) live; raises (changing nothing) when a workspace is too small."""
        int_bytes = 4 * num_words
        if int_bytes > self._int_workspace_buffer.nbytes:
            raise ValueError(
                f"int_workspace_buffer has {self._int_workspace_buffer.nbytes} "
                f"bytes; this plan needs {int_bytes} (see reset_workspace_buffer)"
            )
        tmp_v_bytes = round_up(4 * tmp_rows * num_qo_heads * head_dim)
        tmp_lse_bytes = round_up(4 * tmp_rows * num_qo_heads)
        needed = tmp_v_bytes + tmp_lse_bytes
        if needed > self._workspace.numel():
            raise ValueError(
                f"float_workspace_buffer has {self._workspace.numel()} bytes; this "
                f"plan needs {needed}"
            )
        words = self._int_workspace_buffer.view(torch.uint8).narrow(0, 0, int_bytes)
        return (
            words.view(torch.int32),
            self._workspace.narrow(0, 0, tmp_v_bytes).view(torch.float32),
            self._workspace.narrow(0, tmp_v_bytes, tmp_lse_bytes).view(torch.float32),
        )

    def _upload(self, words: list[int], target: torch.Tensor) -> None:
        """One async host-to-device copy of the schedule into ``target`` (this wrapper's int
        workspace) through the pinned staging buffer, which is reused once the previous
        plan's copy has finished. The event is recorded on the stream of the target's
        device, where the copy runs. A fake target (no GPU) has no contents to write."""
        if is_symbolic(target):
            return
        if self._copy_done is not None:
            self._copy_done.synchronize()
        staging = self._pin_memory_int_workspace_buffer[: 4 * len(words)].view(torch.int32)
        staging.copy_(torch.tensor(words, dtype=torch.int32))
        with torch.cuda.device(target.device):
            target.copy_(staging, non_blocking=True)
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
