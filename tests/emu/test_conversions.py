"""The emulator's element conversions (tests/emu/include's cuda_fp16.h, cuda_bf16.h and
cuda_fp8.h stand-ins) against torch's casts, which round to nearest even as the GPU's
``cvt.rn`` does: a stride through every float32 bit pattern (both signs, every exponent,
subnormals, infinities, NaNs), and every tie between adjacent values of the target format
with its float32 neighbours, where rounding direction is decided. The widening of fp8 pairs
to half (an fp8 KV cache's loads) is checked on every code."""

from __future__ import annotations

import ctypes
import functools

import pytest
import torch

from tests.emu.engine import EMU_DIR, build_library

# (kind in conversions.cu, target dtype, torch's cast of float32 values as the GPU converts)
KINDS = {
    "float16": (0, torch.float16, lambda x: x.to(torch.float16)),
    "bfloat16": (1, torch.bfloat16, lambda x: x.to(torch.bfloat16)),
    # cvt.rn.satfinite: beyond +-448 (infinities too) saturates; NaN stays NaN
    "float8_e4m3fn": (2, torch.float8_e4m3fn, lambda x: x.clamp(-448, 448).to(torch.float8_e4m3fn)),
}


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("conversions", [EMU_DIR / "conversions.cu"], [])


def _emulated(kind: int, dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype)
    _library().emu_convert(
        ctypes.c_int(kind),
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_size_t(x.numel()),
    )
    return out


def _ties(dtype: torch.dtype) -> torch.Tensor:
    """The midpoints between adjacent finite values of ``dtype`` (exact in float32), each
    with its float32 neighbours."""
    bits = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int32)
    narrow = torch.int16 if dtype.itemsize == 2 else torch.uint8
    values = bits.to(narrow).view(dtype).double()
    values = values[values.isfinite()].unique()  # sorted; +-0 once
    mid = ((values[1:] + values[:-1]) / 2).float()
    return torch.cat(
        [mid, mid.nextafter(torch.tensor(-torch.inf)), mid.nextafter(torch.tensor(torch.inf))]
    )


def _sweep() -> torch.Tensor:
    """Every 4099th float32 bit pattern (about a million values)."""
    return torch.arange(0, 2**32, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("name", KINDS)
def test_conversions_round_as_torch_does(name: str) -> None:
    kind, dtype, cast = KINDS[name]
    x = torch.cat([_sweep(), _ties(dtype), torch.tensor([0.0, -0.0, torch.inf, -torch.inf])])
    got, want = _emulated(kind, dtype, x), cast(x)
    nan = want.float().isnan()
    assert torch.equal(got.float().isnan(), nan)
    narrow = torch.int16 if dtype.itemsize == 2 else torch.uint8
    wrong = (got.view(narrow) != want.view(narrow)) & ~nan
    assert not wrong.any(), (
        f"{int(wrong.sum())} of {x.numel()} differ, e.g. {x[wrong][:5].tolist()}: "
        f"{got[wrong][:5].float().tolist()} != {want[wrong][:5].float().tolist()}"
    )


@pytest.mark.parametrize("kind,dtype", [(0, torch.float8_e4m3fn), (1, torch.float8_e5m2)])
def test_fp8_pairs_widen_to_half_exactly(kind: int, dtype: torch.dtype) -> None:
    out = torch.empty(256, dtype=torch.float16)
    _library().emu_widen_fp8(ctypes.c_int(kind), ctypes.c_void_p(out.data_ptr()))
    want = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    got = out.float()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.equal(got.signbit()[~nan], want.signbit()[~nan])  # -0 stays -0
