"""Seeds and offsets for the counter-based (Philox) kernels.

A kernel's random numbers are a pure function of ``(seed, offset)`` and the position they
are drawn for, so the same pair gives the same result on any run. Callers pass the pair
explicitly, or a ``torch.Generator`` that supplies it:

- a CUDA generator gives its own Philox seed and offset, and its offset is advanced so
  the next call (ours or torch's) draws fresh numbers; reading it costs no device sync;
- a CPU generator draws a 64-bit seed (offset 0);
- neither: the default CUDA generator of the tensor's device, as torch's samplers do.

A generator is read on the host when the call is made, so a call captured in a CUDA graph
replays with the numbers of the capture; pass a fresh ``offset`` per call (and re-capture)
when replays must differ.
"""

from __future__ import annotations

from typing import Any

import torch

_UINT64 = 1 << 64
# What one call advances a CUDA generator's offset by (torch's offsets move in steps of 4).
OFFSET_INCREMENT = 4


def _check_uint64(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < _UINT64:
        raise ValueError(f"{name} must be in [0, 2^64), got {value}")
    return value


def check_seed_args(generator: Any, seed: Any, offset: Any) -> None:
    """Raises for a bad combination or value without drawing anything."""
    if seed is not None or offset is not None:
        if generator is not None:
            raise ValueError("pass either generator or seed/offset, not both")
        if seed is None:
            raise ValueError("offset needs a seed")
        _check_uint64("seed", seed)
        _check_uint64("offset", 0 if offset is None else offset)
    elif generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def philox_seed_offset(device: torch.device, generator: torch.Generator | None = None,
                       seed: int | None = None, offset: int | None = None) -> tuple[int, int]:
    """The ``(seed, offset)`` a call on ``device`` draws with (see the module docstring)."""
    check_seed_args(generator, seed, offset)
    if seed is not None:
        return seed, 0 if offset is None else offset
    if generator is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
    if generator.device.type == "cpu":
        drawn = torch.randint(-(1 << 63), (1 << 63) - 1, (1,), dtype=torch.int64,
                              generator=generator)
        return int(drawn) % _UINT64, 0
    if generator.device != device:
        raise ValueError(f"generator is on {generator.device}, the input on {device}")
    state = generator.get_state()
    if state.numel() != 16:
        raise RuntimeError(f"unexpected CUDA generator state of {state.numel()} bytes "
                           "(expected seed and offset, 8 bytes each); pass seed= instead")
    gen_seed, gen_offset = (int(v) % _UINT64 for v in state.view(torch.int64).tolist())
    advanced = state.clone()
    advanced.view(torch.int64)[1] = gen_offset + OFFSET_INCREMENT
    generator.set_state(advanced)
    return gen_seed, gen_offset


def as_int64(value: int) -> int:
    """A uint64 in two's complement, for bindings that take int64 (the kernel reads uint64)."""
    return value - _UINT64 if value >= 1 << 63 else value
