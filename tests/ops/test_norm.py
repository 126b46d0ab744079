"""The norm family: argument checks (CPU) and numerics against float64 torch (GPU)."""

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


def _escape(message: str) -> str:
    return message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")


RMSNORM_BAD_CALLS = [
    ("input must be a torch.Tensor", TypeError, lambda: ([[1.0]], _x(8))),
    ("input must be 2-D [tokens, hidden] or 3-D", ValueError, lambda: (_x(2, 3, 4, 8), _x(8))),
    ("weight must be 1-D", ValueError, lambda: (_x(4, 8), _x(1, 8))),
    ("weight has 7 elements, but input's last dim is 8", ValueError, lambda: (_x(4, 8), _x(7))),
    ("weight has dtype torch.bfloat16, but input has torch.float16", TypeError,
     lambda: (_x(4, 8), _x(8, dtype=torch.bfloat16))),
    ("input has dtype torch.float64; supported: float16, bfloat16, float32", TypeError,
     lambda: (_x(4, 8, dtype=torch.float64), _x(8, dtype=torch.float64))),
    ("input must be contiguous in its last dim", ValueError, lambda: (_x(8, 4).t(), _x(8))),
    ("weight must be contiguous", ValueError, lambda: (_x(4, 8), _x(16)[::2])),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(4, 8), _x(8))),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(4, 2, 8), _x(8))),
]


@pytest.mark.parametrize("api", [flashinfer.rmsnorm, flashinfer.gemma_rmsnorm])
@pytest.mark.parametrize("message,error,make", RMSNORM_BAD_CALLS,
                         ids=[c[0][:40] for c in RMSNORM_BAD_CALLS])
def test_rmsnorm_bad_arguments_raise_before_launch(no_launch, api, message, error, make) -> None:
    x, w = make()
    with pytest.raises(error, match=_escape(message)):
        api(x, w)


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
    with pytest.raises(error, match="eps"):
        flashinfer.layernorm(_x(4, 8), _x(8, dtype=torch.float32), _x(8, dtype=torch.float32),
                             eps=eps)


FUSED_BAD_CALLS = [
    ("residual must be a torch.Tensor", TypeError, lambda x: (x, None, _x(8))),
    (r"residual has shape \(4, 9\), input has \(4, 8\)", ValueError, lambda x: (x, _x(4, 9), _x(8))),
    ("residual has dtype torch.bfloat16, but input has torch.float16", TypeError,
     lambda x: (x, _x(4, 8, dtype=torch.bfloat16), _x(8))),
    ("residual must be contiguous in its last dim", ValueError, lambda x: (x, _x(8, 4).t(), _x(8))),
    ("weight has 4 elements", ValueError, lambda x: (x, _x(4, 8), _x(4))),
    ("input and residual must be different tensors", ValueError, lambda x: (x, x, _x(8))),
    ("input must be 2-D", ValueError, lambda x: (x[0], x[0].clone(), _x(8))),
    ("input must be a CUDA tensor", ValueError, lambda x: (x, _x(4, 8), _x(8))),
]


@pytest.mark.parametrize("api", [flashinfer.fused_add_rmsnorm, flashinfer.gemma_fused_add_rmsnorm])
@pytest.mark.parametrize("message,error,make", FUSED_BAD_CALLS,
                         ids=[c[0][:40] for c in FUSED_BAD_CALLS])
def test_fused_add_rmsnorm_bad_arguments(no_launch, api, message, error, make) -> None:
    args = make(_x(4, 8))
    with pytest.raises(error, match=message):
        api(*args)


def _f32(n: int) -> torch.Tensor:
    return _x(n, dtype=torch.float32)


LAYERNORM_BAD_CALLS = [
    ("input must be 2-D", ValueError, lambda: (_x(8), _f32(8), _f32(8))),
    ("gamma has 7 elements", ValueError, lambda: (_x(4, 8), _f32(7), _f32(8))),
    ("beta must be 1-D", ValueError, lambda: (_x(4, 8), _f32(8), _x(2, 8, dtype=torch.float32))),
    ("gamma has dtype torch.float16; supported: float32", TypeError,
     lambda: (_x(4, 8), _x(8), _f32(8))),
    ("beta has dtype torch.bfloat16; supported: float32", TypeError,
     lambda: (_x(4, 8), _f32(8), _x(8, dtype=torch.bfloat16))),
    ("gamma must be contiguous", ValueError, lambda: (_x(4, 8), _f32(16)[::2], _f32(8))),
    ("input has dtype torch.int32", TypeError,
     lambda: (torch.ones(4, 8, dtype=torch.int32), _f32(8), _f32(8))),
    ("input must be a CUDA tensor", ValueError, lambda: (_x(4, 8), _f32(8), _f32(8))),
]


@pytest.mark.parametrize("message,error,make", LAYERNORM_BAD_CALLS,
                         ids=[c[0][:40] for c in LAYERNORM_BAD_CALLS])
def test_layernorm_bad_arguments(no_launch, message, error, make) -> None:
    with pytest.raises(error, match=message):
        flashinfer.layernorm(*make())


def test_unsupported_dtype_module_request() -> None:
    with pytest.raises(TypeError, match="unsupported dtype"):
        flashinfer.get_norm_module(torch.int8)


def test_every_norm_function_is_exported_by_the_module() -> None:
    module = flashinfer.get_norm_module(torch.float16)
    x = _x(2, 8)
    calls = {
        "rmsnorm": (torch.empty_like(x), x, _x(8), 1e-6),
        "gemma_rmsnorm": (torch.empty_like(x), x, _x(8), 1e-6),
        "fused_add_rmsnorm": (x, x.clone(), _x(8), 1e-6),
        "gemma_fused_add_rmsnorm": (x, x.clone(), _x(8), 1e-6),
        "layernorm": (torch.empty_like(x), x, _f32(8), _f32(8), 1e-6),
    }
    for name, args in calls.items():  # the binding's own checks stop each at the device
        with pytest.raises(ValueError, match="input must be a CUDA tensor"):
            getattr(module, name)(*args)


# -- numerics on a GPU ----------------------------------------------------------------------

TOLERANCE = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
HIDDEN = [1, 7, 64, 128, 1000, 4096, 4097, 5120, 8192, 16384]


def _inputs(batch: int, hidden: int, dtype: torch.dtype, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(batch, hidden, dtype=dtype, device="cuda") * 3 + 0.5
    w = torch.rand(hidden, dtype=dtype, device="cuda") + 0.5
    return x, w


@pytest.mark.gpu
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("batch", [1, 3, 19, 128])
def test_rmsnorm_matches_reference(gemma: bool, dtype: torch.dtype, hidden: int,
                                   batch: int) -> None:
    x, w = _inputs(batch, hidden, dtype, hidden * 1000 + batch)
    out = torch.full_like(x, float("nan"))
    api = flashinfer.gemma_rmsnorm if gemma else flashinfer.rmsnorm
    assert api(x, w, eps=1e-6, out=out) is out
    expected = (reference.gemma_rmsnorm if gemma else reference.rmsnorm)(x, w, 1e-6)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_per_head_on_a_strided_3d_slice(dtype: torch.dtype) -> None:
    """QK norm: q is a [tokens, heads, head_dim] view into a fused qkv buffer."""
    tokens, heads, kv_heads, head_dim = 37, 8, 2, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device="cuda")
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    w = torch.rand(head_dim, dtype=dtype, device="cuda") + 0.5
    for t in (q, k):
        expected = reference.rmsnorm(t, w, 1e-6)
        torch.testing.assert_close(flashinfer.rmsnorm(t, w).double(), expected,
                                   **TOLERANCE[dtype])
    before = qkv.clone()
    flashinfer.rmsnorm(q, w, out=q)  # in place on the slice: k and v stay untouched
    torch.testing.assert_close(q.double(), reference.rmsnorm(before[:, : heads * head_dim]
                                                             .view(tokens, heads, head_dim),
                                                             w, 1e-6), **TOLERANCE[dtype])
    assert torch.equal(qkv[:, heads * head_dim:], before[:, heads * head_dim:])


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


@pytest.mark.gpu
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 4096, 4097, 8192])
@pytest.mark.parametrize("batch", [1, 19, 128])
def test_fused_add_rmsnorm_matches_reference(gemma: bool, dtype: torch.dtype, hidden: int,
                                             batch: int) -> None:
    x, w = _inputs(batch, hidden, dtype, hidden + batch)
    residual = torch.randn_like(x)
    expected, expected_residual = reference.fused_add_rmsnorm(
        x, residual, w, 1e-6, weight_offset=1.0 if gemma else 0.0)
    api = flashinfer.gemma_fused_add_rmsnorm if gemma else flashinfer.fused_add_rmsnorm
    assert api(x, residual, w, 1e-6) is None
    torch.testing.assert_close(residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(x.double(), expected, **TOLERANCE[dtype])


@pytest.mark.gpu
def test_fused_add_rmsnorm_leaves_neighbouring_memory_untouched() -> None:
    buffer = torch.randn(2, 40, 4096 + 64, dtype=torch.bfloat16, device="cuda")
    sentinel = buffer.clone()
    x, residual = buffer[0, 4:36, 32:4128], buffer[1, 4:36, 32:4128]
    w = torch.rand(4096, dtype=torch.bfloat16, device="cuda") + 0.5
    expected, expected_residual = reference.fused_add_rmsnorm(x, residual, w)
    flashinfer.fused_add_rmsnorm(x, residual, w)
    torch.testing.assert_close(residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(x.double(), expected, **TOLERANCE[torch.bfloat16])
    mask = torch.ones_like(buffer, dtype=torch.bool)
    mask[:, 4:36, 32:4128] = False
    assert torch.equal(buffer[mask], sentinel[mask])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 1000, 4096, 4097, 8192])
@pytest.mark.parametrize("batch", [1, 19, 128])
def test_layernorm_matches_reference(dtype: torch.dtype, hidden: int, batch: int) -> None:
    x, _ = _inputs(batch, hidden, dtype, hidden * 7 + batch)
    x = x + 4.0  # a large mean exposes E[x^2] - mean^2 cancellation
    gamma = torch.rand(hidden, device="cuda") + 0.5
    beta = torch.randn(hidden, device="cuda")
    out = flashinfer.layernorm(x, gamma, beta, 1e-5)
    # float32: the mean's reduction error over 8k elements is ~1e-6 relative to |x| ~ 5
    tolerance = dict(atol=5e-5, rtol=5e-5) if dtype == torch.float32 else TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), reference.layernorm(x, gamma, beta, 1e-5),
                               **tolerance)
