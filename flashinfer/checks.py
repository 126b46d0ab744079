"""Host-side argument checks shared by the public APIs.

Each raises ``TypeError`` or ``ValueError`` naming the argument, before any launch.
Callers check rank, shape, dtype and strides before the device, so that every
mistake gets its own message and is testable with CPU tensors.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from .custom_op import is_symbolic


def check_tensor(name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    if tensor.dim() != ndim:
        raise ValueError(
            f"{name} must be {ndim}-D {layout}, got {tensor.dim()}-D with shape "
            f"{tuple(tensor.shape)}"
        )


def check_dtype(name: str, tensor: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"{name} has dtype {tensor.dtype}; supported: {names}")


def check_same_dtype(name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if tensor.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {tensor.dtype}, but {ref_name} has {ref.dtype}")


def check_last_dim_contiguous(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() > 0 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim (stride {tensor.stride(-1)}); "
            "call .contiguous() first"
        )


def check_same_device(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    if tensor.device != like.device:
        raise ValueError(f"{name} is on {tensor.device}, the input is on {like.device}")


def check_cuda(name: str, tensor: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if tensor.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {tensor.device}")
    if like is not None:
        check_same_device(name, tensor, like)


def check_distinct(
    name: str,
    tensor: torch.Tensor,
    other_name: str,
    other: torch.Tensor,
    *,
    same_allowed: bool = False,
) -> None:
    """Two tensors a kernel reads and writes must not share memory: not starting at one
    address (unless ``same_allowed`` and they are the same view, an in-place call), and,
    when each is one dense block, not overlapping. Overlap of other strided views is not
    judged (a q and a k sliced from one fused qkv interleave without sharing an element).
    Data pointers are not real while tracing: with fake tensors the same storage and byte
    offsets count instead, and under dynamo (which cannot trace storage access) nothing is
    compared; the op's real implementation calls this again with the real tensors."""
    if not tensor.numel() or not other.numel() or torch.compiler.is_compiling():
        return
    if is_symbolic(tensor, other):
        if tensor.untyped_storage() is not other.untyped_storage():
            return
        start = tensor.storage_offset() * tensor.element_size()
        other_start = other.storage_offset() * other.element_size()
    else:
        start, other_start = tensor.data_ptr(), other.data_ptr()
    if start == other_start:
        if same_allowed and _same_view(tensor, other):
            return
        raise ValueError(f"{name} and {other_name} must be different tensors")
    if _dense(tensor) and _dense(other):
        end = start + tensor.numel() * tensor.element_size()
        other_end = other_start + other.numel() * other.element_size()
        if start < other_end and other_start < end:
            raise ValueError(f"{name} and {other_name} overlap in memory; pass tensors that do not")


def check_writable(name: str, tensor: torch.Tensor) -> None:
    """A tensor a kernel writes must not map two of its elements to one address (an
    expand()ed view: stride 0 in a dim of more than one element). An empty one has none."""
    if tensor.numel() and any(
        size > 1 and stride == 0 for size, stride in zip(tensor.shape, tensor.stride())
    ):
        raise ValueError(
            f"{name} has stride 0 in a dim of size > 1 (an expanded view): a kernel writing "
            "it would write one element many times; pass a tensor of its own"
        )


def _same_view(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    """Same dtype, shape and strides, but those of size-1 dims (which view() and reshape()
    reset), from the same start: the same elements at the same addresses."""
    if tensor.dtype != other.dtype or tensor.shape != other.shape:
        return False
    return all(
        size <= 1 or a == b for size, a, b in zip(tensor.shape, tensor.stride(), other.stride())
    )


def _dense(tensor: torch.Tensor) -> bool:
    """Its elements fill one block of memory, each once (contiguous in some dim order)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def check_kv_layout(kv_layout: Any) -> bool:
    """A paged/contiguous KV layout name; True for "HND" (heads before tokens)."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout == "HND"


def check_eps(eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


def check_index_tensor(
    name: str, tensor: Any, length: int | None, dtypes: Iterable[torch.dtype]
) -> None:
    """A contiguous 1-D index tensor of ``dtypes`` with ``length`` elements (any when None)."""
    check_tensor(name, tensor)
    check_ndim(name, tensor, 1, "index tensor")
    if length is not None and tensor.shape[0] != length:
        raise ValueError(f"{name} has {tensor.shape[0]} elements, expected {length}")
    check_dtype(name, tensor, dtypes)
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_optional_bool(name: str, value: Any) -> bool | None:
    """A bool or None (e.g. ``enable_pdl``, whose None is resolved from the device where the
    op runs, not while it is traced)."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool or None, got {type(value).__name__}")
    return value


def check_int(
    name: str, value: Any, low: int | None = None, high: int | None = None, *, kind: str = "an int"
) -> int:
    """An int (bool rejected) in ``[low, high]`` (either bound optional). ``kind`` names
    what the argument may be in the TypeError (e.g. "an int or a [batch] tensor")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def is_real_number(value: Any) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    kind: str = "a float",
    allow_inf: bool = False,
) -> float:
    """A real number (bool rejected; NaN, and infinities unless ``allow_inf``, refused) within
    the bounds, each closed unless ``*_open``. ``kind`` as for :func:`check_int`."""
    if not is_real_number(value):
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value) and allow_inf:
        raise ValueError(f"{name} must not be NaN")
    if not math.isfinite(value) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value
