"""The emulator's special-function stand-ins (tests/emu/include/flashinfer/fast_math.cuh): each
off from the exact function by about the most its PTX instruction may be, up on some inputs
and down on others, never more, with the exact cases the kernels rely on kept (NaN through
tanh, 2^0 = 1, sin 0 and cos 0, denormal powers of two flushed)."""

from __future__ import annotations

import ctypes
import functools
import math

import pytest
import torch

from tests.emu.engine import EMU_DIR, build_library

EX2, TANH, SIN, COS = range(4)
FLOAT_EPS = 2.0**-24  # float32's rounding of the exact value, on top of the modelled error


@functools.cache
def _library() -> ctypes.CDLL:
    return build_library("sfu", [EMU_DIR / "sfu.cu"], [])


def _emulated(kind: int, x: torch.Tensor) -> torch.Tensor:
    x = x.float().contiguous()
    out = torch.empty_like(x)
    _library().emu_sfu(
        ctypes.c_int(kind),
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_size_t(x.numel()),
    )
    return out


def _inputs(low: float, high: float) -> torch.Tensor:
    return torch.linspace(low, high, 20001, dtype=torch.float32)


def _relative(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return ((got.double() - exact) / exact).abs()


def test_ex2_is_off_by_up_to_two_ulp_but_exact_on_whole_numbers() -> None:
    x = _inputs(-100.0, 100.0)
    x = x[x != x.round()]
    error = (_emulated(EX2, x).double() - torch.exp2(x.double())) / torch.exp2(x.double())
    assert error.abs().max() <= 2.0**-22 + 2 * FLOAT_EPS
    assert error.max() > 2.0**-23 and error.min() < -(2.0**-23)  # both ways
    whole = torch.arange(-126, 128, dtype=torch.float32)
    assert torch.equal(_emulated(EX2, whole), torch.exp2(whole))
    tiny = torch.tensor([-127.5, -140.0, -math.inf])
    assert torch.equal(_emulated(EX2, tiny), torch.zeros(3))  # .ftz: denormal results flush


def test_tanh_is_off_by_up_to_2_to_the_minus_11_never_past_one_and_keeps_nan() -> None:
    x = _inputs(-12.0, 12.0)
    x = x[x != 0]
    got = _emulated(TANH, x)
    error = _relative(got, torch.tanh(x.double()))
    assert error.max() <= 2.0**-11 + 4 * FLOAT_EPS and error.max() > 2.0**-12
    off = (got.double() - torch.tanh(x.double())) / torch.tanh(x.double())
    assert off.max() > 0 and off.min() < 0
    assert got.abs().max() <= 1.0
    assert _emulated(TANH, torch.tensor([math.nan])).isnan().all()
    assert _emulated(TANH, torch.tensor([0.0])).item() == 0.0


@pytest.mark.parametrize("kind,exact", [(SIN, torch.sin), (COS, torch.cos)])
def test_sin_and_cos_are_off_by_up_to_2_to_the_minus_21_after_reducing_by_turns(
    kind: int, exact
) -> None:  # noqa: ANN001
    x = _inputs(-3000.0, 3000.0)
    reduced = torch.remainder(x.double() + math.pi, 2 * math.pi) - math.pi
    error = _emulated(kind, x).double() - exact(reduced)
    assert error.abs().max() <= 2.0**-21 + 4 * FLOAT_EPS and error.abs().max() > 2.0**-22
    assert error.max() > 0 and error.min() < 0
    zero = _emulated(kind, torch.tensor([0.0])).item()
    assert zero == (0.0 if kind == SIN else 1.0)
