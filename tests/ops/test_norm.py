"""The norm family: argument checks (CPU) and numerics against float64 torch (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import norm as norm_api
from flashinfer.jit.norm import gen_norm_module, gen_norm_quant_module
from flashinfer.testing import reference
from flashinfer.testing.sass import resource_usage

FP8 = torch.float8_e4m3fn

# -- argument checks: run on the CPU, raise before any module is built or launched ---------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(norm_api, "get_norm_module", refuse)
    monkeypatch.setattr(norm_api, "get_norm_quant_module", refuse)


def _x(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def _fp8(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=FP8)


def _escape(message: str) -> str:
    return message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")


RMSNORM_BAD_CALLS = [
    ("input must be a torch.Tensor", TypeError, lambda: ([[1.0]], _x(8))),
    ("input must be 2-D [tokens, hidden] or 3-D", ValueError, lambda: (_x(2, 3, 4, 8), _x(8))),
    ("weight must be 1-D", ValueError, lambda: (_x(4, 8), _x(1, 8))),
    ("weight has 7 elements, but input's last dim is 8", ValueError, lambda: (_x(4, 8), _x(7))),
    (
        "weight has dtype torch.bfloat16, but input has torch.float16",
        TypeError,
        lambda: (_x(4, 8), _x(8, dtype=torch.bfloat16)),
    ),
    (
        "input has dtype torch.float64; supported: float16, bfloat16, float32",
        TypeError,
        lambda: (_x(4, 8, dtype=torch.float64), _x(8, dtype=torch.float64)),
    ),
    ("input must be contiguous in its last dim", ValueError, lambda: (_x(8, 4).t(), _x(8))),
    ("weight must be contiguous", ValueError, lambda: (_x(4, 8), _x(16)[::2])),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(4, 8), _x(8))),
    ("input must be a CUDA tensor, got device cpu", ValueError, lambda: (_x(4, 2, 8), _x(8))),
]


@pytest.mark.parametrize("api", [flashinfer.rmsnorm, flashinfer.gemma_rmsnorm])
@pytest.mark.parametrize(
    "message,error,make", RMSNORM_BAD_CALLS, ids=[c[0][:40] for c in RMSNORM_BAD_CALLS]
)
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
    "eps,error",
    [(-1e-6, ValueError), (float("nan"), ValueError), ("1e-6", TypeError), (True, TypeError)],
)
def test_bad_eps(no_launch, eps, error) -> None:
    with pytest.raises(error, match="eps"):
        flashinfer.rmsnorm(_x(4, 8), _x(8), eps=eps)
    with pytest.raises(error, match="eps"):
        flashinfer.layernorm(
            _x(4, 8), _x(8, dtype=torch.float32), _x(8, dtype=torch.float32), eps=eps
        )
    with pytest.raises(error, match="eps"):
        flashinfer.rmsnorm_quant(_fp8(4, 8), _x(4, 8), _x(8), 1.0, eps=eps)


# Every API taking enable_pdl, called with valid CPU arguments (they stop at the device check).
PDL_CALLS = {
    "rmsnorm": lambda pdl: flashinfer.rmsnorm(_x(4, 8), _x(8), enable_pdl=pdl),
    "gemma_rmsnorm": lambda pdl: flashinfer.gemma_rmsnorm(_x(4, 8), _x(8), enable_pdl=pdl),
    "fused_add_rmsnorm": lambda pdl: flashinfer.fused_add_rmsnorm(
        _x(4, 8), _x(4, 8), _x(8), enable_pdl=pdl
    ),
    "gemma_fused_add_rmsnorm": lambda pdl: flashinfer.gemma_fused_add_rmsnorm(
        _x(4, 8), _x(4, 8), _x(8), enable_pdl=pdl
    ),
    "rmsnorm_quant": lambda pdl: flashinfer.rmsnorm_quant(
        _fp8(4, 8), _x(4, 8), _x(8), 0.5, enable_pdl=pdl
    ),
    "fused_add_rmsnorm_quant": lambda pdl: flashinfer.fused_add_rmsnorm_quant(
        _fp8(4, 8), _x(4, 8), _x(4, 8), _x(8), torch.tensor([0.5]), enable_pdl=pdl
    ),
}


@pytest.mark.parametrize("api", list(PDL_CALLS))
@pytest.mark.parametrize("enable_pdl", ["yes", 1, 0.0])
def test_enable_pdl_must_be_a_bool_or_none(no_launch, api, enable_pdl) -> None:
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        PDL_CALLS[api](enable_pdl)


@pytest.mark.parametrize("api", list(PDL_CALLS))
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_valid_enable_pdl_reaches_the_device_check(no_launch, api, enable_pdl) -> None:
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        PDL_CALLS[api](enable_pdl)


FUSED_BAD_CALLS = [
    ("residual must be a torch.Tensor", TypeError, lambda x: (x, None, _x(8))),
    (
        r"residual has shape \(4, 9\), input has \(4, 8\)",
        ValueError,
        lambda x: (x, _x(4, 9), _x(8)),
    ),
    (
        "residual has dtype torch.bfloat16, but input has torch.float16",
        TypeError,
        lambda x: (x, _x(4, 8, dtype=torch.bfloat16), _x(8)),
    ),
    ("residual must be contiguous in its last dim", ValueError, lambda x: (x, _x(8, 4).t(), _x(8))),
    ("weight has 4 elements", ValueError, lambda x: (x, _x(4, 8), _x(4))),
    ("input and residual must be different tensors", ValueError, lambda x: (x, x, _x(8))),
    ("input must be 2-D", ValueError, lambda x: (x[0], x[0].clone(), _x(8))),
    ("input must be a CUDA tensor", ValueError, lambda x: (x, _x(4, 8), _x(8))),
]


@pytest.mark.parametrize("api", [flashinfer.fused_add_rmsnorm, flashinfer.gemma_fused_add_rmsnorm])
@pytest.mark.parametrize(
    "message,error,make", FUSED_BAD_CALLS, ids=[c[0][:40] for c in FUSED_BAD_CALLS]
)
def test_fused_add_rmsnorm_bad_arguments(no_launch, api, message, error, make) -> None:
    args = make(_x(4, 8))
    with pytest.raises(error, match=message):
        api(*args)


@pytest.mark.parametrize(
    "message,error,make", FUSED_BAD_CALLS, ids=[c[0][:40] for c in FUSED_BAD_CALLS]
)
def test_fused_add_rmsnorm_quant_checks_input_residual_and_weight(
    no_launch, message, error, make
) -> None:
    x, residual, w = make(_x(4, 8))
    out = _fp8(*x.shape) if isinstance(x, torch.Tensor) else None
    with pytest.raises(error, match=message):
        flashinfer.fused_add_rmsnorm_quant(out, x, residual, w, 1.0)


QUANT_OUT_BAD = [
    ("out has dtype torch.float16; supported: float8_e4m3fn", TypeError, lambda: _x(4, 8)),
    (
        "out has dtype torch.float8_e5m2; supported: float8_e4m3fn",
        TypeError,
        lambda: torch.zeros(4, 8, dtype=torch.float8_e5m2),
    ),
    (r"out has shape \(4, 9\), input has \(4, 8\)", ValueError, lambda: _fp8(4, 9)),
    (r"out has shape \(2, 2, 8\), input has \(4, 8\)", ValueError, lambda: _fp8(2, 2, 8)),
    ("out must be contiguous in its last dim", ValueError, lambda: _fp8(8, 4).t()),
    ("out must be a torch.Tensor", TypeError, lambda: None),
]

SCALE_BAD = [
    ("scale must be a float or a torch.Tensor, got str", TypeError, "0.5"),
    ("scale must be a float or a torch.Tensor, got bool", TypeError, True),
    ("scale must be a float or a torch.Tensor, got NoneType", TypeError, None),
    ("scale must be > 0.0, got 0.0", ValueError, 0.0),
    ("scale must be > 0.0, got -2.0", ValueError, -2),
    ("scale must be finite", ValueError, float("inf")),
    ("scale must be finite", ValueError, float("nan")),
    (
        r"scale must be a scalar tensor or have shape \(1,\), got shape \(2,\)",
        ValueError,
        torch.ones(2),
    ),
    (
        r"scale must be a scalar tensor or have shape \(1,\), got shape \(1, 1\)",
        ValueError,
        torch.ones(1, 1),
    ),
    (
        "scale has dtype torch.int32; expected a floating dtype",
        TypeError,
        torch.ones(1, dtype=torch.int32),
    ),
]


def _quant_call(api: str, out, scale) -> None:  # noqa: ANN001
    if api == "rmsnorm_quant":
        flashinfer.rmsnorm_quant(out, _x(4, 8), _x(8), scale)
    else:
        flashinfer.fused_add_rmsnorm_quant(out, _x(4, 8), _x(4, 8), _x(8), scale)


@pytest.mark.parametrize("api", ["rmsnorm_quant", "fused_add_rmsnorm_quant"])
@pytest.mark.parametrize(
    "message,error,make", QUANT_OUT_BAD, ids=[c[0][:40] for c in QUANT_OUT_BAD]
)
def test_quant_out_must_be_fp8_e4m3_shaped_like_input(no_launch, api, message, error, make) -> None:
    with pytest.raises(error, match=message):
        _quant_call(api, make(), 1.0)


@pytest.mark.parametrize("api", ["rmsnorm_quant", "fused_add_rmsnorm_quant"])
@pytest.mark.parametrize("message,error,scale", SCALE_BAD, ids=[c[0][:40] for c in SCALE_BAD])
def test_quant_scale_is_checked(no_launch, api, message, error, scale) -> None:
    with pytest.raises(error, match=message):
        _quant_call(api, _fp8(4, 8), scale)


@pytest.mark.parametrize("api", ["rmsnorm_quant", "fused_add_rmsnorm_quant"])
@pytest.mark.parametrize(
    "scale",
    [0.5, 2, torch.tensor(0.5), torch.tensor([0.5]), torch.tensor([0.5], dtype=torch.bfloat16)],
    ids=["float", "int", "0-d", "1-elem", "bf16"],
)
def test_quant_accepts_the_reference_scale_forms(no_launch, api, scale) -> None:
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        _quant_call(api, _fp8(4, 8), scale)


def test_rmsnorm_quant_checks_input_and_weight(no_launch) -> None:
    for message, error, make in RMSNORM_BAD_CALLS:
        x, w = make()
        out = _fp8(*x.shape) if isinstance(x, torch.Tensor) else None
        with pytest.raises(error, match=_escape(message)):
            flashinfer.rmsnorm_quant(out, x, w, 1.0)


def _f32(n: int) -> torch.Tensor:
    return _x(n, dtype=torch.float32)


LAYERNORM_BAD_CALLS = [
    ("input must be 2-D", ValueError, lambda: (_x(8), _f32(8), _f32(8))),
    ("gemma has 7 elements", ValueError, lambda: (_x(4, 8), _f32(7), _f32(8))),
    ("beta must be 1-D", ValueError, lambda: (_x(4, 8), _f32(8), _x(2, 8, dtype=torch.float32))),
    (
        "gemma has dtype torch.float16; supported: float32",
        TypeError,
        lambda: (_x(4, 8), _x(8), _f32(8)),
    ),
    (
        "beta has dtype torch.bfloat16; supported: float32",
        TypeError,
        lambda: (_x(4, 8), _f32(8), _x(8, dtype=torch.bfloat16)),
    ),
    ("gemma must be contiguous", ValueError, lambda: (_x(4, 8), _f32(16)[::2], _f32(8))),
    (
        "input has dtype torch.int32",
        TypeError,
        lambda: (torch.ones(4, 8, dtype=torch.int32), _f32(8), _f32(8)),
    ),
    ("input must be a CUDA tensor", ValueError, lambda: (_x(4, 8), _f32(8), _f32(8))),
]


@pytest.mark.parametrize(
    "message,error,make", LAYERNORM_BAD_CALLS, ids=[c[0][:40] for c in LAYERNORM_BAD_CALLS]
)
def test_layernorm_bad_arguments(no_launch, message, error, make) -> None:
    with pytest.raises(error, match=message):
        flashinfer.layernorm(*make())


def test_unsupported_dtype_module_request() -> None:
    with pytest.raises(TypeError, match="unsupported dtype"):
        flashinfer.get_norm_module(torch.int8)
    with pytest.raises(TypeError, match="unsupported dtype"):
        norm_api.get_norm_quant_module(torch.float8_e4m3fn)


def test_every_norm_function_is_exported_by_the_module() -> None:
    module = flashinfer.get_norm_module(torch.float16)
    x = _x(2, 8)
    calls = {
        "rmsnorm": (torch.empty_like(x), x, _x(8), 1e-6, True),
        "gemma_rmsnorm": (torch.empty_like(x), x, _x(8), 1e-6, False),
        "fused_add_rmsnorm": (x, x.clone(), _x(8), 1e-6, True),
        "gemma_fused_add_rmsnorm": (x, x.clone(), _x(8), 1e-6, False),
        "layernorm": (torch.empty_like(x), x, _f32(8), _f32(8), 1e-6, True),
    }
    for name, args in calls.items():  # the binding's own checks stop each at the device
        with pytest.raises(ValueError, match="input must be a CUDA tensor"):
            getattr(module, name)(*args)
    with pytest.raises(TypeError, match="gemma has dtype float16, expected float32"):
        module.layernorm(torch.empty_like(x), x, _x(8), _f32(8), 1e-6, True)


def test_exported_functions_convert_and_count_their_arguments() -> None:
    """csrc/ffi_export.h: each argument converts as tvm-ffi's typed export converts it (an
    int for a double, a bool, a tensor), a wrong type or count raises TypeError naming the
    function, the argument and what it got, and return values come back."""
    module = flashinfer.get_norm_module(torch.float16)
    assert module.dtype() == "float16"
    x = _x(2, 8)
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):  # eps given as an int
        module.rmsnorm(torch.empty_like(x), x, _x(8), 1, True)
    with pytest.raises(TypeError, match=r"rmsnorm: argument #1 must be \S*Tensor\S*, got \S*Str"):
        module.rmsnorm(torch.empty_like(x), "x", _x(8), 1e-6, True)
    with pytest.raises(TypeError, match=r"rmsnorm: argument #3 must be \S+, got None"):
        module.rmsnorm(torch.empty_like(x), x, _x(8), None, True)
    with pytest.raises(TypeError, match=r"rmsnorm takes 5 arguments, got 4"):
        module.rmsnorm(torch.empty_like(x), x, _x(8), 1e-6)
    with pytest.raises(TypeError, match=r"dtype takes 0 arguments, got 1"):
        module.dtype(1)


def build_without_spills(spec):  # noqa: ANN001, ANN202
    """Builds ``spec`` and asserts that no kernel of it spills: none has a stack frame or
    local memory (cuobjdump's resource usage of the library, so a kernel object a cache
    supplied is read too, which a build log would not show); returns the loaded module."""
    library = spec.build()
    try:
        kernels = resource_usage(library)
    except FileNotFoundError as err:
        pytest.skip(str(err))
    assert kernels, "cuobjdump listed no kernel"
    spilled = [(name, r) for name, r in kernels if r.stack or r.local]
    assert not spilled, spilled
    return spec.build_and_load()


def test_quant_module_compiles_without_spills_and_rechecks_arguments() -> None:
    module = build_without_spills(gen_norm_quant_module(torch.float16))
    assert module.dtype() == "float16"
    x, w, out = _x(2, 8), _x(8), _fp8(2, 8)
    for args in (
        (out, x, w, None, 0.5, 1e-6, True),
        (out, x, w, torch.tensor([0.5]), 1.0, 1e-6, False),
    ):
        with pytest.raises(ValueError, match="input must be a CUDA tensor"):
            module.rmsnorm_quant(*args)
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        module.fused_add_rmsnorm_quant(out, x, x.clone(), w, None, 0.5, 1e-6, True)
    with pytest.raises(TypeError, match="out has dtype float16, expected float8_e4m3fn"):
        module.rmsnorm_quant(x.clone(), x, w, None, 0.5, 1e-6, True)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        module.rmsnorm_quant(out, x, w, None, 0.0, 1e-6, True)
    with pytest.raises(ValueError, match="scale must be a scalar tensor"):
        module.rmsnorm_quant(out, x, w, torch.ones(2), 1.0, 1e-6, True)
    with pytest.raises(TypeError, match="scale has dtype float64, expected float32"):
        module.rmsnorm_quant(out, x, w, torch.ones(1, dtype=torch.float64), 1.0, 1e-6, True)
    with pytest.raises(ValueError, match="input and residual must be different tensors"):
        module.fused_add_rmsnorm_quant(out, x, x, w, None, 0.5, 1e-6, True)
    with pytest.raises(TypeError, match="input has dtype bfloat16, expected float16"):
        module.rmsnorm_quant(out, x.bfloat16(), w, None, 0.5, 1e-6, True)


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("gen", [gen_norm_module, gen_norm_quant_module])
def test_no_norm_kernel_spills(gen, dtype: str) -> None:
    build_without_spills(gen(dtype))


# -- numerics on a GPU ----------------------------------------------------------------------

TOLERANCE = {
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
HIDDEN = [1, 7, 64, 128, 1000, 4096, 4097, 5120, 8192, 16384]


def _inputs(
    batch: int, hidden: int, dtype: torch.dtype, seed: int, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(batch, hidden, dtype=dtype, device=device) * 3 + 0.5
    w = torch.rand(hidden, dtype=dtype, device=device) + 0.5
    return x, w


@pytest.mark.gpu
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("batch", [1, 3, 19, 128])
def test_rmsnorm_matches_reference(
    gemma: bool, dtype: torch.dtype, hidden: int, batch: int
) -> None:
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
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    w = torch.rand(head_dim, dtype=dtype, device="cuda") + 0.5
    for t in (q, k):
        expected = reference.rmsnorm(t, w, 1e-6)
        torch.testing.assert_close(flashinfer.rmsnorm(t, w).double(), expected, **TOLERANCE[dtype])
    before = qkv.clone()
    flashinfer.rmsnorm(q, w, out=q)  # in place on the slice: k and v stay untouched
    torch.testing.assert_close(
        q.double(),
        reference.rmsnorm(before[:, : heads * head_dim].view(tokens, heads, head_dim), w, 1e-6),
        **TOLERANCE[dtype],
    )
    assert torch.equal(qkv[:, heads * head_dim :], before[:, heads * head_dim :])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_strided_and_misaligned_rows(dtype: torch.dtype) -> None:
    wide = torch.randn(33, 4096 + 24, dtype=dtype, device="cuda")
    w = torch.randn(4096, dtype=dtype, device="cuda")
    for x in (wide[:, :4096], wide[:, 1:4097], wide[:, 3:4099]):  # vectorized, then scalar
        out = torch.full((33, 4096), float("nan"), dtype=dtype, device="cuda")
        flashinfer.rmsnorm(x, w, out=out)
        torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6), **TOLERANCE[dtype])
    strided_out = torch.full_like(wide, float("nan"))[:, 8:4104]
    flashinfer.rmsnorm(wide[:, :4096], w, out=strided_out)
    torch.testing.assert_close(
        strided_out.double(), reference.rmsnorm(wide[:, :4096], w, 1e-6), **TOLERANCE[dtype]
    )


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
    flashinfer.rmsnorm_quant(torch.empty(0, 2048, dtype=FP8, device="cuda"), empty, w, 1.0)


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
    torch.testing.assert_close(
        out.double(), reference.rmsnorm(x, w, 1e-6), **TOLERANCE[torch.float16]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 4096, 4097, 8192])
@pytest.mark.parametrize("batch", [1, 19, 128])
def test_fused_add_rmsnorm_matches_reference(
    gemma: bool, dtype: torch.dtype, hidden: int, batch: int
) -> None:
    x, w = _inputs(batch, hidden, dtype, hidden + batch)
    residual = torch.randn_like(x)
    expected, expected_residual = reference.fused_add_rmsnorm(
        x, residual, w, 1e-6, weight_offset=1.0 if gemma else 0.0
    )
    api = flashinfer.gemma_fused_add_rmsnorm if gemma else flashinfer.fused_add_rmsnorm
    assert api(x, residual, w, 1e-6) is None
    torch.testing.assert_close(residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(x.double(), expected, **TOLERANCE[dtype])


def _bf16_rounding_margin(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bf16 rounding of float64 ``values``, distance to the nearest rounding boundary in
    units of the bf16 spacing at each value: 0.5 on a bf16 value, 0 at a tie)."""
    rounded = values.to(torch.bfloat16)
    _, exponent = torch.frexp(values)  # |v| in [2^(e-1), 2^e): 8 significant bits
    spacing = torch.ldexp(torch.ones_like(values), exponent - 8)
    return rounded, 0.5 - (values - rounded.double()).abs() / spacing


@pytest.mark.gpu
def test_fused_add_rmsnorm_normalizes_the_unrounded_float32_sum() -> None:
    """The norm is of float32(input + residual), not of the sum rounded to bf16. Where the two
    readings round to different bf16 outputs, and the float32-sum result is clearly away
    from a rounding boundary (> 0.05 spacing: the kernel's float32 error is ~1e-6
    relative, the spacing 2^-8 relative), the output must be exactly the float32-sum one."""
    torch.manual_seed(7)
    residual = (torch.randn(512, 256, device="cuda") * 4).bfloat16()
    x = (torch.randn(512, 256, device="cuda") * 0.3).bfloat16()  # sums need more bits
    w = (torch.rand(256, device="cuda") + 0.5).bfloat16()
    total = x.float() + residual.float()
    new = reference.rmsnorm(total, w, 1e-6)
    old = reference.rmsnorm(total.bfloat16(), w, 1e-6)
    expected, margin = _bf16_rounding_margin(new)
    decisive = (expected != old.to(torch.bfloat16)) & (margin > 0.05)
    assert int(decisive.sum()) > 100  # the two readings do differ here
    flashinfer.fused_add_rmsnorm(x, residual, w, 1e-6)
    assert torch.equal(x[decisive], expected[decisive])
    assert torch.equal(residual, total.bfloat16())


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
    gemma = torch.rand(hidden, device="cuda") + 0.5
    beta = torch.randn(hidden, device="cuda")
    out = flashinfer.layernorm(x, gemma=gemma, beta=beta, eps=1e-5)
    # float32: the mean's reduction error over 8k elements is ~1e-6 relative to |x| ~ 5
    tolerance = dict(atol=5e-5, rtol=5e-5) if dtype == torch.float32 else TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), reference.layernorm(x, gemma, beta, 1e-5), **tolerance)


# -- fp8 quantized norms (GPU) --------------------------------------------------------------


def _poisoned_fp8(*shape: int, device: str = "cuda") -> torch.Tensor:
    """An fp8 e4m3 tensor of NaNs (0x7f): a kernel that skips an element leaves a NaN."""
    return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(FP8)


def _fp8_ordinal(t: torch.Tensor) -> torch.Tensor:
    """e4m3 values as integers in value order: adjacent fp8 values differ by 1 (+0 and -0
    are both 0)."""
    bits = t.view(torch.uint8).to(torch.int32)
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude)


def assert_fp8_close(out: torch.Tensor, expected: torch.Tensor, unquantized: torch.Tensor) -> None:
    """``out`` equals torch's e4m3 cast of the float64 reference, or is its fp8 neighbour.

    Why one fp8 ulp: the kernel computes in float32 (reduction, rsqrt, products: ~1e-6
    relative error), the reference in float64; the two round to different fp8 values only
    when the exact result lies within that error of a rounding boundary (e4m3 steps are
    2^-3 relative), which moves it by one step and happens for about 1e-5 of the elements,
    so at most 0.1% of them (or one) may differ at all. Saturated elements (|y / scale| well
    beyond 448) must be exact, and every element finite (``out`` is poisoned with NaN)."""
    assert not torch.isnan(out.float()).any(), "an element was not written"
    diff = (_fp8_ordinal(out) - _fp8_ordinal(expected)).abs()
    assert int((diff > 1).sum()) == 0, f"{int((diff > 1).sum())} elements off by more than one ulp"
    assert int((diff > 0).sum()) <= max(1, out.numel() // 1000)
    saturated = unquantized.abs() > 1.1 * 448
    assert torch.equal(out.float()[saturated], expected.float()[saturated])


QUANT_SCALES = [0.02, 1.0, 0.0005]  # mostly normal values, unit, mostly saturated

# The quantized norms' checks take the device their tensors live on: "cuda" in the GPU tests
# here, "cpu" in tests/ops/test_norm_emulated.py, where the kernels run on the emulator.


def check_rmsnorm_quant(
    device: str, dtype: torch.dtype, hidden: int, batch: int, scale: float
) -> None:
    x, w = _inputs(batch, hidden, dtype, hidden * 3 + batch, device)
    out = _poisoned_fp8(batch, hidden, device=device)
    assert flashinfer.rmsnorm_quant(out, x, w, scale, 1e-6) is None
    y = reference.rmsnorm(x, w, 1e-6)
    value = float(torch.tensor(scale, dtype=torch.float32))  # the kernel's scale
    assert_fp8_close(out, reference.fp8_e4m3_quantize(y, value), y / value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 4096, 4097, 8192])
@pytest.mark.parametrize("batch", [1, 19, 128])
@pytest.mark.parametrize("scale", QUANT_SCALES)
def test_rmsnorm_quant_matches_reference(
    dtype: torch.dtype, hidden: int, batch: int, scale: float
) -> None:
    check_rmsnorm_quant("cuda", dtype, hidden, batch, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["0-d", "1-elem", "cpu", "float64"])
def test_rmsnorm_quant_scale_tensor_forms(form: str) -> None:
    """A tensor scale is read on the device; other devices and dtypes are converted first,
    as the reference library does."""
    x, w = _inputs(64, 2048, torch.bfloat16, 5)
    scale = {
        "0-d": torch.tensor(0.03, device="cuda"),
        "1-elem": torch.tensor([0.03], device="cuda"),
        "cpu": torch.tensor([0.03]),
        "float64": torch.tensor([0.03], dtype=torch.float64, device="cuda"),
    }[form]
    out = _poisoned_fp8(64, 2048)
    flashinfer.rmsnorm_quant(out, x, w, scale)
    y = reference.rmsnorm(x, w, 1e-6)
    value = float(scale.float())  # the kernel reads the scale as float32
    assert_fp8_close(out, reference.fp8_e4m3_quantize(y, value), y / value)


def check_rmsnorm_quant_per_head_strided(device: str) -> None:
    tokens, heads, head_dim = 33, 4, 128
    qkv = torch.randn(tokens, 3 * heads * head_dim, dtype=torch.float16, device=device)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    w = torch.rand(head_dim, dtype=torch.float16, device=device) + 0.5
    buffer = _poisoned_fp8(tokens, heads, head_dim + 32, device=device)
    out = buffer[:, :, 16 : 16 + head_dim]
    flashinfer.rmsnorm_quant(out, q, w, 0.015625)  # 2^-6: exact in float32
    y = reference.rmsnorm(q, w, 1e-6)
    assert_fp8_close(out, reference.fp8_e4m3_quantize(y, 0.015625), y / 0.015625)
    raw = buffer.view(torch.uint8)
    assert bool((raw[:, :, :16] == 0x7F).all()) and bool((raw[:, :, 16 + head_dim :] == 0x7F).all())


@pytest.mark.gpu
def test_rmsnorm_quant_per_head_3d_and_strided_output() -> None:
    check_rmsnorm_quant_per_head_strided("cuda")


def check_fused_add_rmsnorm_quant(
    device: str, dtype: torch.dtype, hidden: int, batch: int, tensor_scale: bool
) -> None:
    x, w = _inputs(batch, hidden, dtype, hidden * 5 + batch, device)
    residual = torch.randn_like(x)
    x_before = x.clone()
    y, expected_residual = reference.fused_add_rmsnorm(x, residual, w, 1e-6)
    out = _poisoned_fp8(batch, hidden, device=device)
    scale = torch.tensor([0.02], device=device) if tensor_scale else 0.02
    assert flashinfer.fused_add_rmsnorm_quant(out, x, residual, w, scale, 1e-6) is None
    value = float(torch.tensor(0.02, dtype=torch.float32))
    assert_fp8_close(out, reference.fp8_e4m3_quantize(y, value), y / value)
    assert torch.equal(residual, expected_residual)
    assert torch.equal(x, x_before)  # input is only read


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 4096, 4097, 8192])
@pytest.mark.parametrize("batch", [1, 19, 128])
@pytest.mark.parametrize("tensor_scale", [False, True])
def test_fused_add_rmsnorm_quant_matches_reference(
    dtype: torch.dtype, hidden: int, batch: int, tensor_scale: bool
) -> None:
    check_fused_add_rmsnorm_quant("cuda", dtype, hidden, batch, tensor_scale)


# -- programmatic dependent launch (GPU) ----------------------------------------------------


def _norm_chain(
    src: torch.Tensor,
    residual0: torch.Tensor,
    w: torch.Tensor,
    gemma: torch.Tensor,
    beta: torch.Tensor,
    enable_pdl: bool,
) -> list[torch.Tensor]:
    """Each step reads what the kernel just before it wrote, on one stream: with PDL a
    kernel that touched memory before its griddepcontrol.wait would read stale data."""
    x = torch.mul(src, 1.5)  # a torch kernel writes the first norm's input right before it
    residual = residual0.clone()
    flashinfer.fused_add_rmsnorm(x, residual, w, enable_pdl=enable_pdl)
    y = flashinfer.rmsnorm(x, w, enable_pdl=enable_pdl)
    flashinfer.gemma_rmsnorm(y, w, out=y, enable_pdl=enable_pdl)
    flashinfer.gemma_fused_add_rmsnorm(y, residual, w, enable_pdl=enable_pdl)
    scale = y.float().abs().amax().reshape(1) / 448  # the scale comes from a kernel too
    q = torch.empty(y.shape, dtype=FP8, device=y.device)
    flashinfer.rmsnorm_quant(q, y, w, scale, enable_pdl=enable_pdl)
    q2 = torch.empty(y.shape, dtype=FP8, device=y.device)
    flashinfer.fused_add_rmsnorm_quant(q2, y, residual, w, scale, enable_pdl=enable_pdl)
    z = flashinfer.layernorm(residual, gemma, beta)
    return [x, y, residual, q.view(torch.uint8), q2.view(torch.uint8), z]


def _chain_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(11)
    rows, hidden = 8192, 4096  # big enough that each kernel runs for a while
    src = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn_like(src)
    w = torch.rand(hidden, dtype=torch.bfloat16, device="cuda") + 0.5
    gemma = torch.rand(hidden, device="cuda") + 0.5
    beta = torch.randn(hidden, device="cuda")
    return src, residual, w, gemma, beta


@pytest.mark.gpu
def test_pdl_on_and_off_give_bitwise_identical_results() -> None:
    inputs = _chain_inputs()
    expected = _norm_chain(*inputs, enable_pdl=False)
    for _ in range(3):
        got = _norm_chain(*inputs, enable_pdl=True)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_pdl_chain_replays_identically_from_a_cuda_graph() -> None:
    inputs = _chain_inputs()
    expected = _norm_chain(*inputs, enable_pdl=False)
    _norm_chain(*inputs, enable_pdl=True)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = _norm_chain(*inputs, enable_pdl=True)
    for t in got:
        t.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


# -- row layouts (GPU): warp groups, cached blocks, looping blocks --------------------------
# A row of `units` loads (16-byte vectors, or elements on the scalar path) is normalized by a
# group of lanes of a warp when units <= 64 (scalar: 128), by one block holding the row in
# registers up to 2048 units (scalar: 4096), and by a block re-reading it beyond that.


def _layout_hiddens(dtype: torch.dtype) -> list[int]:
    vec = 16 // torch.tensor([], dtype=dtype).element_size()
    return [
        vec,  # one vector: groups of one lane
        64,
        128,  # QK norm
        64 * vec,  # the longest row of the groups layout
        65 * vec,  # the shortest cached block
        2048 * vec,  # the longest cached block
        2049 * vec,  # the shortest looping block
        65536,  # looping
        127,  # scalar (not a multiple of the vector): groups
        4095,  # scalar: cached block
        4097,  # scalar: looping block
    ]


LAYOUT_CASES = [(d, h) for d in DTYPES for h in _layout_hiddens(d)]


def _check_layernorm(x: torch.Tensor) -> None:
    """layernorm of ``x`` (rows of its last dim) with float32 gamma/beta against float64."""
    gemma = torch.rand(x.shape[-1], device="cuda") + 0.5
    beta = torch.randn(x.shape[-1], device="cuda")
    tolerance = dict(atol=5e-5, rtol=5e-5) if x.dtype == torch.float32 else TOLERANCE[x.dtype]
    torch.testing.assert_close(
        flashinfer.layernorm(x, gemma, beta, 1e-5).double(),
        reference.layernorm(x, gemma, beta, 1e-5),
        **tolerance,
    )


def _poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 9, 130])
@pytest.mark.parametrize(
    "dtype,hidden", LAYOUT_CASES, ids=[f"{str(d)[6:]}-{h}" for d, h in LAYOUT_CASES]
)
def test_every_norm_at_each_row_layout(dtype: torch.dtype, hidden: int, rows: int) -> None:
    """Row counts that are not multiples of the rows per block (1 .. 256 in the groups
    layout), at hidden sizes on both sides of each layout's limit, for every kernel."""
    x, w = _inputs(rows, hidden, dtype, hidden * 11 + rows)
    tolerance = TOLERANCE[dtype]

    out = _poisoned_like(x)
    flashinfer.rmsnorm(x, w, eps=1e-6, out=out)
    torch.testing.assert_close(out.double(), reference.rmsnorm(x, w, 1e-6), **tolerance)

    out = _poisoned_like(x)
    flashinfer.gemma_rmsnorm(x, w, eps=1e-6, out=out)
    torch.testing.assert_close(out.double(), reference.gemma_rmsnorm(x, w, 1e-6), **tolerance)

    residual = torch.randn_like(x)
    expected, expected_residual = reference.fused_add_rmsnorm(x, residual, w, 1e-6)
    in_place = x.clone()
    flashinfer.fused_add_rmsnorm(in_place, residual, w, 1e-6)
    assert torch.equal(residual, expected_residual)
    torch.testing.assert_close(in_place.double(), expected, **tolerance)

    _check_layernorm(x)

    quantized = _poisoned_fp8(rows, hidden)
    flashinfer.rmsnorm_quant(quantized, x, w, 0.02, 1e-6)
    y = reference.rmsnorm(x, w, 1e-6)
    value = float(torch.tensor(0.02, dtype=torch.float32))
    assert_fp8_close(quantized, reference.fp8_e4m3_quantize(y, value), y / value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("tokens", [1, 7, 9, 130])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_per_head_norms_with_a_strided_head_dim(
    dtype: torch.dtype, head_dim: int, tokens: int, offset: int
) -> None:
    """QK norm on [tokens, heads, head_dim] views whose heads are every other head of a
    buffer (head stride 2 * (head_dim + 8)), so the rows are neither contiguous nor a
    multiple of the rows per block; offset 1 misaligns every row (the scalar path)."""
    heads = 3
    torch.manual_seed(tokens * 1000 + head_dim + offset)
    buffer = torch.randn(tokens, 2 * heads, head_dim + 8, dtype=dtype, device="cuda") * 2
    view = buffer[:, ::2, offset : offset + head_dim]
    w = torch.rand(head_dim, dtype=dtype, device="cuda") + 0.5
    tolerance = TOLERANCE[dtype]
    expected = reference.rmsnorm(view, w, 1e-6)

    out = _poisoned_like(view)
    flashinfer.rmsnorm(view, w, out=out)
    torch.testing.assert_close(out.double(), expected, **tolerance)

    _check_layernorm(view)

    residual_buffer = torch.randn_like(buffer)
    residual = residual_buffer[:, 1::2, offset : offset + head_dim]
    expected_sum, expected_residual = reference.fused_add_rmsnorm(view, residual, w, 1e-6)
    before, residual_before = buffer.clone(), residual_buffer.clone()
    flashinfer.fused_add_rmsnorm(view, residual, w, 1e-6)  # in place on both views
    assert torch.equal(residual, expected_residual)
    torch.testing.assert_close(view.double(), expected_sum, **tolerance)
    untouched_by_view = torch.ones_like(buffer, dtype=torch.bool)
    untouched_by_view[:, ::2, offset : offset + head_dim] = False
    assert torch.equal(buffer[untouched_by_view], before[untouched_by_view])
    untouched_by_residual = torch.ones_like(buffer, dtype=torch.bool)
    untouched_by_residual[:, 1::2, offset : offset + head_dim] = False
    assert torch.equal(
        residual_buffer[untouched_by_residual], residual_before[untouched_by_residual]
    )

    current = view.clone()
    flashinfer.rmsnorm(view, w, out=view)  # in place on the strided view
    torch.testing.assert_close(view.double(), reference.rmsnorm(current, w, 1e-6), **tolerance)
    assert torch.equal(buffer[untouched_by_view], before[untouched_by_view])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [128, 4096, 65536])
@pytest.mark.parametrize("misaligned", ["gemma", "beta", "both"])
def test_layernorm_with_misaligned_gamma_or_beta(
    dtype: torch.dtype, hidden: int, misaligned: str
) -> None:
    """gamma / beta slices starting 4 bytes into a buffer: not 16-byte aligned, so they are
    read one float at a time (the aligned case is in every other layernorm test)."""
    x, _ = _inputs(19, hidden, dtype, hidden + 3)
    gemma_buffer = torch.rand(hidden + 1, device="cuda") + 0.5
    beta_buffer = torch.randn(hidden + 1, device="cuda")
    gemma = gemma_buffer[1:] if misaligned in ("gemma", "both") else gemma_buffer[:-1]
    beta = beta_buffer[1:] if misaligned in ("beta", "both") else beta_buffer[:-1]
    assert (gemma.data_ptr() % 16 != 0) or (beta.data_ptr() % 16 != 0)
    tolerance = dict(atol=5e-5, rtol=5e-5) if dtype == torch.float32 else TOLERANCE[dtype]
    torch.testing.assert_close(
        flashinfer.layernorm(x, gemma, beta, 1e-5).double(),
        reference.layernorm(x, gemma, beta, 1e-5),
        **tolerance,
    )
