"""Device and arch helpers (what this device and this CUDA toolkit can run) and
``@backend_requirement``."""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Iterable, Mapping, TypeVar

import torch

from .alibi import get_alibi_slopes as get_alibi_slopes  # (the reference's home of it)
from .fp4 import FP4Tensor as FP4Tensor  # (the reference's home of it)

F = TypeVar("F", bound=Callable[..., Any])

# The reference's table: target -> (compute capability major, minor or None for any minor
# of that major, first CUDA toolkit release its kernels need). sm103a is ours.
_ARCH_SPECIFIC: dict[str, tuple[int, int | None, tuple[int, int]]] = {
    "sm90a": (9, None, (12, 3)),
    "sm100a": (10, None, (12, 8)),
    "sm100f": (10, None, (12, 9)),
    "sm103a": (10, 3, (12, 9)),
    "sm110a": (11, None, (13, 0)),
    "sm120a": (12, 0, (12, 8)),
    "sm120f": (12, None, (12, 9)),
    "sm121a": (12, 1, (12, 9)),
}


_RANGES: dict[tuple[int, torch.device], torch.Tensor] = {}


def _get_range_buf(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """``arange(seq_len)`` as int32 on ``device`` (engines build the decode wrappers' qo_indptr
    from it, as with the reference's): a view of one cached buffer per power-of-two length
    and device, so repeated calls allocate nothing."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be an int >= 0, got {seq_len!r}")
    length = 1 << max(seq_len - 1, 0).bit_length()
    key = (length, torch.device(device))
    if key not in _RANGES:
        _RANGES[key] = torch.arange(length, dtype=torch.int32, device=key[1])
    return _RANGES[key][:seq_len]


class BackendNotSupportedError(RuntimeError):
    """An API was called with a backend or on a device it does not support."""


def cuda_device_index(device: torch.device | str | int | None) -> int:
    """The index of a CUDA device; None or an index-less device means the current one."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"{device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


def get_compute_capability(device: torch.device | str | int) -> tuple[int, int]:
    """(major, minor) of a CUDA device (``torch.device``, ``"cuda:1"`` or an index; a device
    without an index is the current one)."""
    return _capability(cuda_device_index(device))


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def get_device_sm_count(device: torch.device | str | int) -> int:
    """Number of streaming multiprocessors of a CUDA device (forms as for
    :func:`get_compute_capability`)."""
    return _sm_count(cuda_device_index(device))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def get_nvcc_version() -> tuple[int, int] | None:
    """(major, minor) of the nvcc the JIT uses, or None when there is none."""
    try:
        from .jit.toolchain import current_toolchain

        text = current_toolchain().nvcc_version()
    except Exception:
        return None
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def _toolkit_version() -> tuple[int, int] | None:
    """The CUDA toolkit our kernels are built with: the JIT's nvcc, else (an AOT-only
    install without a compiler) the one torch was built with, else None."""
    nvcc = get_nvcc_version()
    if nvcc is not None:
        return nvcc
    match = re.match(r"(\d+)\.(\d+)", torch.version.cuda or "")
    return (int(match[1]), int(match[2])) if match else None


def is_arch_supported(arch: str, device: torch.device | str | int | None = None) -> bool:
    """True when the device belongs to ``arch`` (e.g. "sm90a", "sm120f"; see the table
    above) and the CUDA toolkit is recent enough for it."""
    major, minor, min_toolkit = _ARCH_SPECIFIC[arch]
    if not torch.cuda.is_available():
        return False
    device_major, device_minor = get_compute_capability(device)
    if device_major != major or (minor is not None and device_minor != minor):
        return False
    toolkit = _toolkit_version()
    return toolkit is not None and toolkit >= min_toolkit


def is_sm90a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm90a", device)


def is_sm100a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm100a", device)


def is_sm100f_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm100f", device)


def is_sm103a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm103a", device)


def is_sm110a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm110a", device)


def is_sm120a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm120a", device)


def is_sm120f_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm120f", device)


def is_sm121a_supported(device: torch.device | str | int) -> bool:
    return is_arch_supported("sm121a", device)


def is_sm12x_supported(device: torch.device | str | int) -> bool:
    """sm120a or sm121a."""
    return is_sm120a_supported(device) or is_sm121a_supported(device)


def _as_cc(cc: int | tuple[int, int]) -> int:
    """75, (7, 5) -> 75."""
    return cc[0] * 10 + cc[1] if isinstance(cc, tuple) else int(cc)


def _cuda_device_of(args: Iterable[Any], kwargs: Mapping[str, Any]) -> torch.device | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return None


def backend_requirement(
    backends: Mapping[str, Iterable[int | tuple[int, int]]], default_backend: str | None = None
) -> Callable[[F], F]:
    """Declare which compute capabilities each backend of an API supports.

    ``backends`` maps a backend name to capabilities as ``90`` or ``(9, 0)``. The API gains
    ``is_compute_capability_supported(cc)`` and ``is_backend_supported(name, cc=None)``,
    and a call on a CUDA tensor whose device (or chosen ``backend=`` keyword) is not
    supported raises :class:`BackendNotSupportedError` before anything is compiled.
    """
    table = {name: {_as_cc(cc) for cc in ccs} for name, ccs in backends.items()}
    if not table:
        raise ValueError("backend_requirement needs at least one backend")
    default = default_backend or next(iter(table))
    if default not in table:
        raise ValueError(f"default backend {default!r} is not among {sorted(table)}")

    def decorator(func: F) -> F:
        name = func.__qualname__

        def is_compute_capability_supported(cc: int | tuple[int, int]) -> bool:
            return any(_as_cc(cc) in ccs for ccs in table.values())

        def is_backend_supported(backend: str, cc: int | tuple[int, int] | None = None) -> bool:
            return backend in table and (cc is None or _as_cc(cc) in table[backend])

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            backend = kwargs.get("backend", default)
            if backend not in table:
                raise BackendNotSupportedError(
                    f"{name}: unknown backend {backend!r}; available: {', '.join(table)}"
                )
            device = _cuda_device_of(args, kwargs)
            if device is not None:
                major, minor = get_compute_capability(device)
                if major * 10 + minor not in table[backend]:
                    supported = ", ".join(f"{c // 10}.{c % 10}" for c in sorted(table[backend]))
                    raise BackendNotSupportedError(
                        f"{name}: backend {backend!r} does not support compute capability "
                        f"{major}.{minor} ({device}); it supports {supported}"
                    )
            return func(*args, **kwargs)

        checked.is_compute_capability_supported = is_compute_capability_supported  # type: ignore[attr-defined]
        checked.is_backend_supported = is_backend_supported  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorator
