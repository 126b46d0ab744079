"""The norm kernels' own source, run on the CPU by the emulator (tests/emu), through the real
APIs and binding, against the float64 reference: RMSNorm, its Gemma form, the fused
residual add (both forms), LayerNorm and the fp8 quantized forms, in every row layout the
launcher picks (rows shared by the lanes of a warp, one block a row with the row cached in
registers, the looping block for long rows), with 16-byte vectors and with scalars
(misaligned rows), float16, bfloat16 and float32, 2-D rows and per-head rows of a strided
3-D slice. The same cases at GPU sizes are tests/ops/test_norm.py's GPU tests."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest
import torch

import flashinfer
from flashinfer import norm as norm_api
from flashinfer.jit.norm import gen_norm_module, gen_norm_quant_module
from flashinfer.testing import reference
from tests.emu.module import EmulatedModule, on_cpu_tensors
from tests.emu.profile import PROFILED
from tests.ops import test_norm as checks

OUTPUTS = {name: ("out",) for name in ("rmsnorm", "gemma_rmsnorm", "layernorm")}
QUANT_OUTPUTS = {name: ("out",) for name in ("rmsnorm_quant", "fused_add_rmsnorm_quant")}
TOLERANCE = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}


@functools.cache
def _module(dtype: torch.dtype, reverse: bool) -> EmulatedModule:
    return EmulatedModule(gen_norm_module(dtype), OUTPUTS, reverse=reverse)


@functools.cache
def _quant_module(dtype: torch.dtype) -> EmulatedModule:
    return EmulatedModule(gen_norm_quant_module(dtype), QUANT_OUTPUTS)


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., EmulatedModule]]:
    """emulate(dtype, reverse=False): the norm APIs then run the emulated module on CPU
    tensors (the fp8 quantized norms their own module, of the input's dtype)."""

    def install(dtype: torch.dtype, reverse: bool = False) -> EmulatedModule:
        module = _module(dtype, reverse)
        module.launches.clear()
        monkeypatch.setattr(norm_api, "get_norm_module", lambda d: module)
        monkeypatch.setattr(norm_api, "get_norm_quant_module", _quant_module)
        return module

    with on_cpu_tensors(monkeypatch, norm_api):
        yield install


# (dtype, rows, hidden, offset): offset 0 rows start on 16-byte boundaries (vectors), else
# one element in (scalars). The layout each takes (include/flashinfer/norm.cuh, PlanRows):
CASES = [
    (torch.float32, 3, 7, 0),  # scalars, 8 lanes a row
    (torch.float16, 19, 64, 0),  # vectors, 8 lanes a row, 3 rows past the last full block
    (torch.bfloat16, 5, 1000, 0),  # vectors, a cached block of 2 warps
    (torch.float32, 2, 4096, 0),  # float32 vectors, a cached block of 16 warps
    (torch.float16, 3, 300, 1),  # scalars, a cached block
    (torch.bfloat16, 2, 4097, 1),  # scalars, the looping block
    (torch.bfloat16, 2, 16392, 0),  # vectors, the looping block
]


def _rows(dtype: torch.dtype, rows: int, hidden: int, offset: int, seed: int) -> torch.Tensor:
    """Random rows (never zero on average: + 0.5), starting `offset` elements into a wider
    buffer."""
    torch.manual_seed(seed)
    wide = torch.randn(rows, hidden + 8, dtype=torch.float32) * 3 + 0.5
    return wide.to(dtype)[:, offset : offset + hidden]


@pytest.mark.parametrize(
    "dtype,rows,hidden,offset", CASES, ids=[f"{str(c[0])[6:]}-{c[1]}x{c[2]}+{c[3]}" for c in CASES]
)
def test_every_norm_in_every_row_layout_matches_the_reference(
    emulate, dtype: torch.dtype, rows: int, hidden: int, offset: int
) -> None:
    module = emulate(dtype, reverse=hidden % 2 == 0)
    x = _rows(dtype, rows, hidden, offset, seed=hidden)
    w = (torch.rand(hidden) + 0.5).to(dtype)
    tolerance = TOLERANCE[dtype]
    for api, want in (
        (flashinfer.rmsnorm, reference.rmsnorm),
        (flashinfer.gemma_rmsnorm, reference.gemma_rmsnorm),
    ):
        torch.testing.assert_close(api(x, w, eps=1e-5).double(), want(x, w, 1e-5), **tolerance)

    for api, weight_offset in (
        (flashinfer.fused_add_rmsnorm, 0.0),
        (flashinfer.gemma_fused_add_rmsnorm, 1.0),
    ):
        x_in, residual = x.clone(), _rows(dtype, rows, hidden, 0, seed=hidden + 1).clone()
        want, want_residual = reference.fused_add_rmsnorm(x_in, residual, w, 1e-6, weight_offset)
        api(x_in, residual, w, eps=1e-6)
        torch.testing.assert_close(x_in.double(), want, **tolerance)
        assert torch.equal(residual, want_residual)

    gamma, beta = torch.rand(hidden) + 0.5, torch.randn(hidden)
    torch.testing.assert_close(
        flashinfer.layernorm(x, gamma, beta, 1e-5).double(),
        reference.layernorm(x, gamma, beta, 1e-5),
        **tolerance,
    )
    assert len(module.launches) == 5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_per_head_rows_of_a_strided_slice_in_place(emulate, dtype: torch.dtype) -> None:
    """QK norm: q and k are [tokens, heads, 128] views into a fused qkv buffer (16 lanes a
    row); normalizing q in place leaves k and v untouched."""
    emulate(dtype, reverse=True)
    tokens, heads, kv_heads, head_dim = 9, 4, 2, 128
    qkv = _rows(dtype, tokens, (heads + 2 * kv_heads) * head_dim - 8, 0, seed=3)
    qkv = torch.cat([qkv, qkv[:, :8]], dim=1).contiguous()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    w = (torch.rand(head_dim) + 0.5).to(dtype)
    for t in (q, k):
        torch.testing.assert_close(
            flashinfer.rmsnorm(t, w).double(), reference.rmsnorm(t, w, 1e-6), **TOLERANCE[dtype]
        )
    before = qkv.clone()
    flashinfer.rmsnorm(q, w, out=q)
    want = reference.rmsnorm(before[:, : heads * head_dim].view(tokens, heads, head_dim), w, 1e-6)
    torch.testing.assert_close(q.double(), want, **TOLERANCE[dtype])
    assert torch.equal(qkv[:, heads * head_dim :], before[:, heads * head_dim :])


# (dtype, rows, hidden, scale): the row layouts above; scales giving mostly normal fp8
# values, unit, and mostly saturated ones
QUANT_CASES = [
    (torch.float16, 1, 7, 0.02),
    (torch.float16, 19, 128, 0.02),
    (torch.float32, 2, 4096, 1.0),
    (torch.bfloat16, 3, 4097, 0.0005),
    (torch.bfloat16, 2, 8192, 0.02),
]


@pytest.mark.parametrize(
    "dtype,rows,hidden,scale",
    QUANT_CASES,
    ids=[f"{str(c[0])[6:]}-{c[1]}x{c[2]}-{c[3]}" for c in QUANT_CASES],
)
def test_rmsnorm_quant_matches_the_reference(
    emulate, dtype: torch.dtype, rows: int, hidden: int, scale: float
) -> None:
    emulate(dtype)
    checks.check_rmsnorm_quant("cpu", dtype, hidden, rows, scale)


FUSED_QUANT_CASES = [
    (torch.bfloat16, 5, 1000, True),
    (torch.float16, 2, 4097, False),
    (torch.float32, 19, 128, True),
]


@pytest.mark.parametrize(
    "dtype,rows,hidden,tensor_scale",
    FUSED_QUANT_CASES,
    ids=[f"{str(c[0])[6:]}-{c[1]}x{c[2]}-{c[3]}" for c in FUSED_QUANT_CASES],
)
def test_fused_add_rmsnorm_quant_matches_the_reference(
    emulate, dtype: torch.dtype, rows: int, hidden: int, tensor_scale: bool
) -> None:
    emulate(dtype)
    checks.check_fused_add_rmsnorm_quant("cpu", dtype, hidden, rows, tensor_scale)


def test_rmsnorm_quant_per_head_rows_into_a_strided_output(emulate) -> None:
    emulate(torch.float16)
    checks.check_rmsnorm_quant_per_head_strided("cpu")


@PROFILED
def test_vector_rows_are_read_and_written_in_whole_sectors(emulate) -> None:
    """The memory profile (tests/emu/profile.py) of RMSNorm, Gemma's and the fused residual
    add over rows of whole 32-byte sectors in each row layout (warp groups, the cached block,
    the looping block): every global load and store takes the fewest sectors, and the block
    reductions' shared memory the fewest wavefronts. (LayerNorm's float32 weights, two
    16-byte loads a lane of which each uses half of every sector, are left out.)"""
    module = emulate(torch.bfloat16)
    torch.manual_seed(7)
    with module.profiling() as profile:
        for hidden in (64, 1024, 4096, 16384):
            x = torch.randn(5, hidden, dtype=torch.bfloat16)
            weight = torch.randn(hidden, dtype=torch.bfloat16)
            norm_api.rmsnorm(x, weight)
            norm_api.gemma_rmsnorm(x, weight)
            norm_api.fused_add_rmsnorm(x, torch.randn_like(x), weight)
    kinds = ("global load", "global store", "shared load", "shared store")
    assert {s.kind for s in profile.in_file("norm.cuh")} >= {"global load", "global store"}
    assert not profile.excessive(("norm.cuh", "vec.cuh"), kinds), profile.table()
