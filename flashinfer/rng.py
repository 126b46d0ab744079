"""Seeds and offsets for the counter-based (Philox) kernels.

A kernel's random numbers are a pure function of ``(seed, offset)`` and the position they
are drawn for, so the same pair gives the same result on any run. Draws are laid out as
curand and torch lay out theirs: subsequence ``row``, words ``offset, offset + 1, ...``
(see include/flashinfer/philox.h). Callers pass the pair explicitly, as ints or as int64 /
uint64 device tensors (one entry, or one per output row, read when the kernel runs: a
CUDA graph replays with whatever they hold then), or a ``torch.Generator`` supplies it:

- a CUDA generator gives its own Philox seed and offset, and its offset is advanced by the
  words a call consumes per row, so the next call (ours or torch's) draws fresh numbers;
  reading it costs no device sync;
- a CPU generator draws a 64-bit seed (offset 0);
- neither: the default CUDA generator of the tensor's device, as torch's samplers do.

When both ``seed`` and ``offset`` are given they win over ``generator``, which is left
untouched (as in the reference).

A generator is read on the host when the call is made, except during CUDA graph capture: its
state read there would be baked into the graph, so a CUDA generator then draws a random seed
into a device tensor (``torch.randint`` on the generator, which torch keeps graph-safe: each
replay draws a new one and advances the generator) and the kernel reads it when it runs.
A replay therefore never repeats the capture's numbers, but it does not give the numbers an
eager call from the same generator state would. Seed and offset tensors the caller fills
before each replay give chosen, reproducible numbers instead.
"""

from __future__ import annotations

from typing import Any

import torch

from . import checks
from .tensor_format import graph_capture_in_progress
from .utils import cuda_device_index

_UINT64 = 1 << 64
_SEED_DTYPES = (torch.int64, torch.uint64)
# The least a call advances a CUDA generator's offset by (torch's offsets move in steps of 4).
OFFSET_INCREMENT = 4

Seed = int | torch.Tensor


def _check_uint64(name: str, value: Any) -> int:
    checks.check_int(name, value, kind="an int or an int64/uint64 tensor")
    if not 0 <= value < _UINT64:
        raise ValueError(f"{name} must be in [0, 2^64), got {value}")
    return value


def _check_seed_tensor(name: str, value: torch.Tensor) -> None:
    if value.dtype not in _SEED_DTYPES:
        raise TypeError(f"{name} has dtype {value.dtype}; expected int64 or uint64")
    if value.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor, got {value.dim()}-D")
    if value.shape[0] > 1 and value.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def check_seed_args(generator: Any, seed: Any, offset: Any) -> None:
    """Raises for a bad combination or value without drawing anything."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if seed is None and offset is None:
        return
    if seed is None:
        raise ValueError("offset needs a seed")
    if isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor):
        if not (isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)):
            raise ValueError("seed and offset must both be tensors or both be ints")
        _check_seed_tensor("seed", seed)
        _check_seed_tensor("offset", offset)
        return
    if offset is None and generator is not None:
        raise ValueError(
            "pass either generator or seed (with offset, it wins), not a lone seed and a generator"
        )
    _check_uint64("seed", seed)
    _check_uint64("offset", 0 if offset is None else offset)


def _random_seed(generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """A uniformly random 64-bit seed (as int64, shape ``(1,)``) drawn on ``device`` from
    ``generator``'s stream."""
    return torch.randint(
        -(1 << 63), (1 << 63) - 1, (1,), dtype=torch.int64, device=device, generator=generator
    )


def philox_seed_offset(
    device: torch.device,
    generator: torch.Generator | None = None,
    seed: Seed | None = None,
    offset: Seed | None = None,
    increment: int = OFFSET_INCREMENT,
) -> tuple[Seed, Seed]:
    """The ``(seed, offset)`` a call on ``device`` draws with (see the module docstring): ints,
    or ``(1,)`` int64 device tensors when a CUDA generator is read during graph capture;
    ``increment`` (a multiple of 4): the generator offsets the call consumes."""
    check_seed_args(generator, seed, offset)
    if seed is not None:
        return seed, 0 if offset is None else offset
    if generator is None:
        generator = torch.cuda.default_generators[cuda_device_index(device)]
    if generator.device.type == "cpu":
        return int(_random_seed(generator, generator.device)) % _UINT64, 0
    # torch.Generator(device="cuda") carries no index: it is the current device's.
    if generator.device.type != device.type or cuda_device_index(
        generator.device
    ) != cuda_device_index(device):
        raise ValueError(f"generator is on {generator.device}, the input on {device}")
    if graph_capture_in_progress():
        return _random_seed(generator, device), torch.zeros(1, dtype=torch.int64, device=device)
    state = generator.get_state()
    if state.numel() != 16:
        raise RuntimeError(
            f"unexpected CUDA generator state of {state.numel()} bytes "
            "(expected seed and offset, 8 bytes each); pass seed= instead"
        )
    gen_seed, gen_offset = (int(v) % _UINT64 for v in state.view(torch.int64).tolist())
    advanced = state.clone()
    advanced.view(torch.int64)[1] = as_int64((gen_offset + increment) % _UINT64)
    generator.set_state(advanced)
    return gen_seed, gen_offset


def as_int64(value: int) -> int:
    """A uint64 in two's complement, for bindings that take int64 (the kernel reads uint64)."""
    return value - _UINT64 if value >= 1 << 63 else value
