"""flashinfer.rmsnorm: argument checks (CPU) and numerics against torch (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import norm as norm_api
from flashinfer.testing import reference

# -- argument checks: run on the CPU, raise before any module is built or launched ---------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(norm_api, "get_norm_module", refuse)


def _x(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


BAD_CALLS = [
    ("input must be a torch.Tensor", TypeError, lambda: ([[1.0]], _x(8))),
    ("input must be 2-D", ValueError, lambda: (_x(2, 3, 8), _x(8))),
    ("weight must be 1-D", ValueError, lambda: (_x(4, 8), _x(1, 8))),
    ("weight has 7 elements, but input's hidden size is 8", ValueError,
     lambda: (_x(4, 8), _x(7))),
    ("weight has dtype torch.bfloat16, but input has torch.float16", TypeError,
     lambda: (_x(4, 8), _x(8, dtype=torch.bfloat16))),
    ("input has dtype torch.float64; supported: float16, bfloat16, float32", TypeError,
     lambda: (_x(4, 8, dtype=torch.float64), _x(8, dtype=torch.float64))),
    ("input must be contiguous in its last dim", ValueError, lambda: (_x(8, 4).t(), _x(8))),
    ("weight must be contiguous", ValueError, lambda: (_x(4, 8), _x(16)[::2])),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(4, 8), _x(8))),
]


@pytest.mark.parametrize("message,error,make", BAD_CALLS, ids=[c[0][:40] for c in BAD_CALLS])
def test_bad_arguments_raise_before_launch(no_launch, message, error, make) -> None:
    x, w = make()
    with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
        flashinfer.rmsnorm(x, w)


@pytest.mark.parametrize(
    "out,message,error",
    [
        (_x(4, 9), r"out has shape \(4, 9\), input has \(4, 8\)", ValueError),
        (_x(4, 8, dtype=torch.float32), "out has dtype torch.float32", TypeError),
        (_x(8, 4).t(), "out must be contiguous in its last dim", ValueError),
        ("not a tensor", "out must be a torch.Tensor", TypeError),
    ],
)
def test_bad_out_raises_before_launch(no_launch, out, message, error) -> None:
    with pytest.raises(error, match=message):
        flashinfer.rmsnorm(_x(4, 8), _x(8), out=out)


@pytest.mark.parametrize(
    "eps,error", [(-1e-6, ValueError), (float("nan"), ValueError), ("1e-6", TypeError),
                  (True, TypeError)]
)
def test_bad_eps(no_launch, eps, error) -> None:
    with pytest.raises(error, match="eps"):
        flashinfer.rmsnorm(_x(4, 8), _x(8), eps=eps)


def test_unsupported_dtype_module_request() -> None:
    with pytest.raises(TypeError, match="unsupported dtype"):
        flashinfer.get_norm_module(torch.int8)


# -- numerics on a GPU ----------------------------------------------------------------------

TOLERANCE = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [1, 7, 64, 128, 1000, 4096, 4097, 5120, 8192, 16384])
@pytest.mark.parametrize("batch", [1, 3, 19, 128])
def test_rmsnorm_matches_reference(dtype: torch.dtype, hidden: int, batch: int) -> None:
    torch.manual_seed(hidden * 1000 + batch)
    x = torch.randn(batch, hidden, dtype=dtype, device="cuda") * 3 + 0.5
    w = torch.rand(hidden, dtype=dtype, device="cuda") + 0.5
    out = torch.full_like(x, float("nan"))
    result = flashinfer.rmsnorm(x, w, eps=1e-6, out=out)
    torch.cuda.synchronize()
    assert result is out
    torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6), **TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_strided_and_misaligned_rows(dtype: torch.dtype) -> None:
    wide = torch.randn(33, 4096 + 24, dtype=dtype, device="cuda")
    w = torch.randn(4096, dtype=dtype, device="cuda")
    for x in (wide[:, :4096], wide[:, 1:4097], wide[:, 3:4099]):  # vectorized, then scalar
        out = torch.full((33, 4096), float("nan"), dtype=dtype, device="cuda")
        flashinfer.rmsnorm(x, w, out=out)
        torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6),
                                   **TOLERANCE[dtype])
    strided_out = torch.full_like(wide, float("nan"))[:, 8:4104]
    flashinfer.rmsnorm(wide[:, :4096], w, out=strided_out)
    torch.testing.assert_close(strided_out.double(), reference.rmsnorm(wide[:, :4096], w, 1e-6),
                               **TOLERANCE[dtype])


@pytest.mark.gpu
def test_rmsnorm_in_place_on_a_side_stream_and_empty_input() -> None:
    x = torch.randn(64, 2048, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(2048, dtype=torch.bfloat16, device="cuda")
    expected = reference.rmsnorm(x, w, 1e-5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flashinfer.rmsnorm(x, w, eps=1e-5, out=x)
    stream.synchronize()
    torch.testing.assert_close(x.double(), expected, **TOLERANCE[torch.bfloat16])
    empty = torch.empty(0, 2048, dtype=torch.bfloat16, device="cuda")
    assert flashinfer.rmsnorm(empty, w).shape == (0, 2048)


@pytest.mark.gpu
def test_rmsnorm_cpu_weight_with_cuda_input_is_rejected() -> None:
    x = torch.randn(4, 8, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="weight must be a CUDA tensor"):
        flashinfer.rmsnorm(x, torch.randn(8, dtype=torch.float16))


@pytest.mark.gpu
def test_rmsnorm_launches_on_the_current_stream_under_graph_capture() -> None:
    """A launch on any stream but the capturing one breaks the capture, so a graph that
    captures and replays correctly proves the kernel used torch's current stream."""
    x = torch.randn(32, 1024, dtype=torch.float16, device="cuda")
    w = torch.randn(1024, dtype=torch.float16, device="cuda")
    out = torch.empty_like(x)
    flashinfer.rmsnorm(x, w, out=out)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashinfer.rmsnorm(x, w, out=out)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6),
                               **TOLERANCE[torch.float16])
