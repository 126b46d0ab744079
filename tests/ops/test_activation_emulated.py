"""The gated activation kernels' own source (silu, gelu and gelu-tanh times the up half), run
on the CPU by the emulator (tests/emu), through the real APIs and binding, against the
float64 reference: float16, bfloat16 and float32, 16-byte vectors and element-wise rows
(odd widths, misaligned inputs), and a strided 3-D output whose neighbouring columns must
stay untouched. The same cases at GPU sizes are tests/ops/test_activation.py's GPU tests."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest
import torch

from flashinfer import activation as activation_api
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.testing import reference
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.emu.profile import PROFILED
from tests.ops.test_activation import APIS, TOLERANCE

OUTPUTS = {f"{act}_and_mul": ("out",) for act in APIS}


@functools.cache
def _module(dtype: torch.dtype) -> EmulatedModule:
    return EmulatedModule(gen_act_and_mul_module(dtype), OUTPUTS, reverse=True)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedModule]]:
    """emulate(dtype): the activation APIs then run the emulated module on CPU tensors."""

    def install(dtype: torch.dtype) -> EmulatedModule:
        module = _module(dtype)
        monkeypatch.setattr(activation_api, "get_act_and_mul_module", lambda d: module)
        return module

    with on_cpu_tensors(monkeypatch, activation_api):
        yield install


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d,offset", [(7, 0), (64, 0), (1000, 0), (64, 1)])
def test_act_and_mul_matches_reference(emulate, dtype: torch.dtype, d: int, offset: int) -> None:
    """d = 7: element-wise; offset 1: rows starting one element in (element-wise too)."""
    emulate(dtype)
    torch.manual_seed(d + offset)
    x = (torch.randn(3, 2 * d + offset) * 3).to(dtype)[:, offset:]
    for act, api in APIS.items():
        torch.testing.assert_close(
            api(x).double(), reference.act_and_mul(x, act), **TOLERANCE[dtype], msg=act
        )


def test_strided_3d_output_leaves_its_neighbours_untouched(emulate) -> None:
    emulate(torch.bfloat16)
    x = torch.randn(2, 3, 2 * 256, dtype=torch.bfloat16)
    for act, api in APIS.items():
        buffer = torch.full((2, 3, 256 + 64), 7.0, dtype=torch.bfloat16)
        out = buffer[:, :, 32:288]
        assert api(x, out=out) is out
        torch.testing.assert_close(
            out.double(), reference.act_and_mul(x, act), **TOLERANCE[torch.bfloat16], msg=act
        )
        assert bool((buffer[:, :, :32] == 7).all()) and bool((buffer[:, :, 288:] == 7).all())


@PROFILED
def test_vector_rows_are_read_and_written_in_whole_sectors(emulate) -> None:
    """The memory profile (tests/emu/profile.py) of the gated activations over rows of whole
    32-byte sectors: every global load and store takes the fewest sectors."""
    module = emulate(torch.bfloat16)
    x = torch.randn(4, 2 * 2048, dtype=torch.bfloat16)
    with module.profiling() as profile:
        for api in APIS.values():
            api(x)
    kinds = ("global load", "global store")
    assert {s.kind for s in profile.in_file("activation.cuh")} >= set(kinds)
    assert not profile.excessive(("activation.cuh",), kinds), profile.table()
