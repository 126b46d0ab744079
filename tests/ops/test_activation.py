"""Gated activations: argument checks (CPU) and numerics against float64 torch (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import activation as activation_api
from flashinfer.jit.activation import gen_act_and_mul_module
from flashinfer.testing import reference

from .test_norm import build_without_spills

APIS = {
    "silu": flashinfer.silu_and_mul,
    "gelu": flashinfer.gelu_and_mul,
    "gelu_tanh": flashinfer.gelu_tanh_and_mul,
}


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(activation_api, "get_act_and_mul_module", refuse)


def _x(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


BAD_CALLS = [
    ("input must be a torch.Tensor", TypeError, lambda: ([1.0, 2.0], None)),
    ("input's last dim must be even", ValueError, lambda: (_x(4, 7), None)),
    ("input has dtype torch.float64", TypeError, lambda: (_x(4, 8, dtype=torch.float64), None)),
    ("input must be contiguous in its last dim", ValueError, lambda: (_x(8, 4).t(), None)),
    (r"out has shape \(4, 8\), expected \(4, 4\)", ValueError, lambda: (_x(4, 8), _x(4, 8))),
    (
        "out has dtype torch.bfloat16, but input has torch.float16",
        TypeError,
        lambda: (_x(4, 8), _x(4, 4, dtype=torch.bfloat16)),
    ),
    ("out must be a torch.Tensor", TypeError, lambda: (_x(4, 8), "out")),
    (
        "input's leading dims cannot be merged without a copy",
        ValueError,
        lambda: (_x(3, 5, 8).transpose(0, 1), None),
    ),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(2, 3, 8), None)),
]


@pytest.mark.parametrize("act", list(APIS))
@pytest.mark.parametrize("message,error,make", BAD_CALLS, ids=[c[0][:40] for c in BAD_CALLS])
def test_bad_arguments_raise_before_launch(no_launch, act, message, error, make) -> None:
    x, out = make()
    with pytest.raises(error, match=message):
        APIS[act](x, out=out)


@pytest.mark.parametrize("act", list(APIS))
@pytest.mark.parametrize("enable_pdl", ["yes", 1, 0.0])
def test_enable_pdl_must_be_a_bool_or_none(no_launch, act, enable_pdl) -> None:
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        APIS[act](_x(4, 8), enable_pdl=enable_pdl)


@pytest.mark.parametrize("act", list(APIS))
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_valid_enable_pdl_reaches_the_device_check(no_launch, act, enable_pdl) -> None:
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        APIS[act](_x(4, 8), None, enable_pdl)


def test_the_module_exports_every_activation_and_checks_in_the_binding() -> None:
    module = activation_api.get_act_and_mul_module(torch.bfloat16)
    assert module.dtype() == "bfloat16"
    x = _x(4, 16, dtype=torch.bfloat16)
    out = torch.empty(4, 8, dtype=torch.bfloat16)
    for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        with pytest.raises(ValueError, match="input must be a CUDA tensor"):
            getattr(module, name)(out, x, True)
    with pytest.raises(ValueError, match="input's last dim must be even"):
        module.silu_and_mul(out, x[:, :15], False)
    with pytest.raises(TypeError, match="input has dtype float16, expected bfloat16"):
        module.silu_and_mul(out, x.half(), True)


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_no_activation_kernel_spills(dtype: str) -> None:
    build_without_spills(gen_act_and_mul_module(dtype))


# -- numerics on a GPU ----------------------------------------------------------------------

TOLERANCE = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(APIS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [1, 7, 64, 4097, 11008, 14336])
@pytest.mark.parametrize("rows", [1, 5, 257])
def test_act_and_mul_matches_reference(act: str, dtype: torch.dtype, d: int, rows: int) -> None:
    torch.manual_seed(d + rows)
    x = torch.randn(rows, 2 * d, dtype=dtype, device="cuda") * 3
    out = torch.full((rows, d), float("nan"), dtype=dtype, device="cuda")
    assert APIS[act](x, out=out) is out
    torch.testing.assert_close(out.double(), reference.act_and_mul(x, act), **TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(APIS))
def test_act_and_mul_3d_strided_output_and_neighbours(act: str) -> None:
    x = torch.randn(3, 17, 2 * 1024, dtype=torch.bfloat16, device="cuda")
    buffer = torch.full((3, 17, 1024 + 64), 7.0, dtype=torch.bfloat16, device="cuda")
    out = buffer[:, :, 32:1056]  # a strided view: untouched columns around it
    APIS[act](x, out=out)
    torch.testing.assert_close(
        out.double(), reference.act_and_mul(x, act), **TOLERANCE[torch.bfloat16]
    )
    assert bool((buffer[:, :, :32] == 7).all()) and bool((buffer[:, :, 1056:] == 7).all())
    misaligned = torch.randn(5, 2 * 1024 + 1, dtype=torch.float16, device="cuda")[:, 1:]
    torch.testing.assert_close(
        APIS[act](misaligned).double(),
        reference.act_and_mul(misaligned, act),
        **TOLERANCE[torch.float16],
    )


@pytest.mark.gpu
def test_more_rows_than_one_grid_dimension_holds() -> None:
    x = torch.randn(70_000, 16, dtype=torch.float16, device="cuda")  # rows > 65535
    out = flashinfer.silu_and_mul(x)
    torch.testing.assert_close(
        out.double(), reference.act_and_mul(x, "silu"), **TOLERANCE[torch.float16]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(APIS))
def test_pdl_on_and_off_give_bitwise_identical_results(act: str) -> None:
    """Each kernel reads what the one just before it wrote, on one stream: with PDL a kernel
    that read before its griddepcontrol.wait would see stale data."""
    torch.manual_seed(3)
    src = torch.randn(4096, 2 * 8192, dtype=torch.bfloat16, device="cuda")

    def chain(enable_pdl: bool) -> list[torch.Tensor]:
        x = torch.mul(src, 0.5)  # a torch kernel writes the input right before the launch
        y = APIS[act](x, enable_pdl=enable_pdl)  # [4096, 8192]
        z = APIS[act](y, enable_pdl=enable_pdl)  # reads y, written by the kernel before
        return [
            y,
            z,
            APIS[act](
                z, out=torch.empty(4096, 2048, dtype=z.dtype, device="cuda"), enable_pdl=enable_pdl
            ),
        ]

    expected = chain(False)
    for _ in range(3):
        for a, b in zip(chain(True), expected):
            assert torch.equal(a, b)
