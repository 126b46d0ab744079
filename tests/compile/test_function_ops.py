"""The function APIs (norm, activation, RoPE, paged-KV append, sampling) as torch custom ops.

On the CPU, with fake CUDA tensors: every API traces (make_fx, and torch.export strict, which
fails on a graph break) into exactly its ``torch.ops.flashinfer.*`` node(s), each writing
exactly the tensors its schema marks mutable, with outputs shaped as the API returns them and
nothing built or launched; the registered ops are exactly the ones the APIs call; checks
still raise while tracing; the aliasing check that cannot read addresses while tracing is
repeated by the op on real tensors; sampling leaves its random draw to the op; logging and
the fi_trace auto-dump stay out of traced code. With the ops' implementations registered for
CPU tensors and stand-in modules: opcheck of every op with the arguments the APIs pass,
torch.compile(fullgraph=True, backend="aot_eager") against eager, and an explicit generator
breaking the graph and being read at every call.

On a GPU: opcheck of every op with the real kernels, each API under
torch.compile(fullgraph=True) against eager, compiled sampling drawing as eager does, and
CUDA-graph replays (eager capture and mode="reduce-overhead") drawing new numbers, or the
numbers of the seed tensors they read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

import flashinfer
from flashinfer import activation as act_api
from flashinfer import checks
from flashinfer import norm as norm_api
from flashinfer import page as page_api
from flashinfer import rope as rope_api
from flashinfer import sampling as sampling_api
from tests.conftest import run_python

from . import cpu_kernels, module_ops

F16, BF16, F32, I32, I64 = torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64
FAMILIES = (norm_api, act_api, rope_api, page_api, sampling_api)
GETTERS = {
    norm_api: ("get_norm_module", "get_norm_quant_module"),
    act_api: ("get_act_and_mul_module",),
    rope_api: ("get_rope_module",),
    page_api: ("get_page_module",),
    sampling_api: ("get_sampling_module",),
}

# Dynamo cannot compile the host validation of a CPU indptr (ragged.check_indptr reads its
# values); CUDA index tensors are never read, so these compile on a GPU.
CPU_INDEX_CHECKS = {
    "apply_rope",
    "apply_rope_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "append_paged_kv_cache",
    "append_paged_kv_cache_int64_page_size_1",
    "append_paged_kv_cache_5d_nhd",
    "append_paged_kv_cache_5d_hnd",
}


@dataclass
class Case:
    """A call of one API: ``fn(*inputs)``; per op node in order, its name and where each
    argument it writes comes from ("in<i>": input i, "out<i>": returned value i, "tmp": a
    tensor allocated inside, None: no tensor); what the call returns (shape, dtype)."""

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    writes: list[tuple[str, dict[str, str | None]]]
    returns: list[tuple[tuple[int, ...], torch.dtype]]


def randn(*shape: int, dtype: torch.dtype = F16, stride: tuple[int, ...] | None = None) -> Any:
    if stride is None:
        return torch.randn(shape, dtype=dtype)
    return torch.empty_strided(shape, stride, dtype=dtype).normal_()


def ints(values: list[int], dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def probs(batch: int = 4, vocab: int = 1000, dtype: torch.dtype = F32) -> torch.Tensor:
    return torch.randn(batch, vocab).softmax(-1).to(dtype)


OUT = {"out": "out0"}
QK_NEW = {"q_rope": "out0", "k_rope": "out1"}
QK_IN = {"q": "in0", "k": "in1"}
SAMPLE = {"out": "out0", "valid": None}


def _norm_cases() -> dict[str, Callable[[], Case]]:
    x = lambda dtype=F16: randn(6, 128, dtype=dtype, stride=(160, 1))  # noqa: E731
    w = lambda dtype=F16: randn(128, dtype=dtype)  # noqa: E731
    rows = [((6, 128), F16)]
    return {
        "rmsnorm": lambda: Case(
            lambda x, w: flashinfer.rmsnorm(x, w, 1e-5), (x(), w()), [("rmsnorm", OUT)], rows
        ),
        "rmsnorm_out": lambda: Case(
            lambda x, w, o: flashinfer.rmsnorm(x, w, out=o),
            (x(), w(), randn(6, 128)),
            [("rmsnorm", {"out": "in2"})],
            rows,
        ),
        "rmsnorm_per_head": lambda: Case(
            lambda x, w: flashinfer.rmsnorm(x, w),
            (randn(5, 4, 64, dtype=BF16), randn(64, dtype=BF16)),
            [("rmsnorm", OUT)],
            [((5, 4, 64), BF16)],
        ),
        "gemma_rmsnorm": lambda: Case(
            lambda x, w: flashinfer.gemma_rmsnorm(x, w, enable_pdl=False),
            (x(BF16), w(BF16)),
            [("gemma_rmsnorm", OUT)],
            [((6, 128), BF16)],
        ),
        "fused_add_rmsnorm": lambda: Case(
            lambda x, r, w: flashinfer.fused_add_rmsnorm(x, r, w),
            (x(), randn(6, 128), w()),
            [("fused_add_rmsnorm", {"input": "in0", "residual": "in1"})],
            [],
        ),
        "gemma_fused_add_rmsnorm": lambda: Case(
            lambda x, r, w: flashinfer.gemma_fused_add_rmsnorm(x, r, w, 1e-5),
            (x(F32), randn(6, 128, dtype=F32), w(F32)),
            [("gemma_fused_add_rmsnorm", {"input": "in0", "residual": "in1"})],
            [],
        ),
        "rmsnorm_quant": lambda: Case(
            lambda o, x, w, s: flashinfer.rmsnorm_quant(o, x, w, s),
            (torch.empty(6, 128, dtype=torch.float8_e4m3fn), x(), w(), ints([2], F32)),
            [("rmsnorm_quant", {"out": "in0"})],
            [],
        ),
        "fused_add_rmsnorm_quant": lambda: Case(
            lambda o, x, r, w: flashinfer.fused_add_rmsnorm_quant(o, x, r, w, 0.5),
            (torch.empty(6, 128, dtype=torch.float8_e4m3fn), x(), randn(6, 128), w()),
            [("fused_add_rmsnorm_quant", {"out": "in0", "residual": "in2"})],
            [],
        ),
        "layernorm": lambda: Case(
            lambda x, g, b: flashinfer.layernorm(x, g, b),
            (x(), w(F32), w(F32)),
            [("layernorm", OUT)],
            rows,
        ),
    }


def _activation_cases() -> dict[str, Callable[[], Case]]:
    return {
        "silu_and_mul": lambda: Case(
            lambda x: flashinfer.silu_and_mul(x),
            (randn(2, 3, 256),),
            [("silu_and_mul", OUT)],
            [((2, 3, 128), F16)],
        ),
        "gelu_and_mul_out": lambda: Case(
            lambda x, o: flashinfer.gelu_and_mul(x, out=o),
            (randn(5, 192, dtype=BF16), randn(5, 96, dtype=BF16)),
            [("gelu_and_mul", {"out": "in1"})],
            [((5, 96), BF16)],
        ),
        "gelu_tanh_and_mul": lambda: Case(
            lambda x: flashinfer.gelu_tanh_and_mul(x, enable_pdl=True),
            (randn(4, 100, dtype=F32),),
            [("gelu_tanh_and_mul", OUT)],
            [((4, 50), F32)],
        ),
    }


def _rope_cases() -> dict[str, Callable[[], Case]]:
    def qk(dtype: torch.dtype = F16) -> tuple[torch.Tensor, torch.Tensor]:
        return randn(9, 4, 64, dtype=dtype), randn(9, 2, 64, dtype=dtype)

    def positions() -> torch.Tensor:
        return torch.arange(9, dtype=I32) + 3

    def ragged() -> tuple[torch.Tensor, torch.Tensor]:
        return ints([0, 4, 9]), ints([3, 10])

    new_qk = [((9, 4, 64), F16), ((9, 2, 64), F16)]
    llama = dict(rope_scale=8, rope_theta=5e5, low_freq_factor=1, high_freq_factor=4)

    def cos_sin_cache() -> torch.Tensor:
        angles = torch.rand(64, 16) * 6
        return torch.cat([angles.cos(), angles.sin()], -1)

    return {
        "apply_rope_pos_ids": lambda: Case(
            lambda q, k, p: flashinfer.apply_rope_pos_ids(q, k, p, rotary_dim=32),
            (*qk(), positions()),
            [("apply_rope_pos_ids", QK_NEW)],
            new_qk,
        ),
        "apply_rope_pos_ids_inplace": lambda: Case(
            lambda q, k, p: flashinfer.apply_rope_pos_ids_inplace(q, k, p, interleave=True),
            (*qk(BF16), positions()),
            [("apply_rope_pos_ids_inplace", QK_IN)],
            [],
        ),
        "apply_llama31_rope_pos_ids": lambda: Case(
            lambda q, k, p: flashinfer.apply_llama31_rope_pos_ids(q, k, p, **llama),
            (*qk(), positions()),
            [("apply_llama31_rope_pos_ids", QK_NEW)],
            new_qk,
        ),
        "apply_llama31_rope_pos_ids_inplace": lambda: Case(
            lambda q, k, p: flashinfer.apply_llama31_rope_pos_ids_inplace(q, k, p),
            (*qk(), positions()),
            [("apply_llama31_rope_pos_ids_inplace", QK_IN)],
            [],
        ),
        "apply_rope": lambda: Case(
            lambda q, k, i, o: flashinfer.apply_rope(q, k, i, o, rope_theta=1e6),
            (*qk(), *ragged()),
            [("apply_rope_pos_ids", QK_NEW)],
            new_qk,
        ),
        "apply_rope_inplace": lambda: Case(
            lambda q, k, i, o: flashinfer.apply_rope_inplace(q, k, i, o),
            (*qk(), *ragged()),
            [("apply_rope_pos_ids_inplace", QK_IN)],
            [],
        ),
        "apply_llama31_rope": lambda: Case(
            lambda q, k, i, o: flashinfer.apply_llama31_rope(q, k, i, o),
            (*qk(), *ragged()),
            [("apply_llama31_rope_pos_ids", QK_NEW)],
            new_qk,
        ),
        "apply_llama31_rope_inplace": lambda: Case(
            lambda q, k, i, o: flashinfer.apply_llama31_rope_inplace(q, k, i, o, **llama),
            (*qk(), *ragged()),
            [("apply_llama31_rope_pos_ids_inplace", QK_IN)],
            [],
        ),
        "apply_rope_with_cos_sin_cache": lambda: Case(
            lambda p, q, k, c: flashinfer.apply_rope_with_cos_sin_cache(p, q, k, 64, c),
            (torch.randint(0, 64, (9,)), randn(9, 256), randn(9, 128), cos_sin_cache()),
            [("apply_rope_with_cos_sin_cache", QK_NEW)],
            [((9, 256), F16), ((9, 128), F16)],
        ),
        "apply_rope_with_cos_sin_cache_inplace": lambda: Case(
            lambda p, q, k, c: flashinfer.apply_rope_with_cos_sin_cache_inplace(
                p, q, k, 64, c, is_neox=False
            ),
            (torch.randint(0, 64, (9,)), *qk(BF16), cos_sin_cache()),
            [("apply_rope_with_cos_sin_cache_inplace", {"q": "in1", "k": "in2"})],
            [],
        ),
    }


def _page_cases() -> dict[str, Callable[[], Case]]:
    # Two requests in pages of 4: request 0 owns pages [2, 0] (7 tokens after the append),
    # request 1 page [1] (2 tokens); the append writes request 0's positions 5 and 6 and
    # request 1's position 1. In pages of 1 token (``one_token_pages``) the same requests
    # own 7 and 2 of 9 shuffled pages (with the table of pages of 4, every position would
    # lie past its request's pages: a kernel skips such tokens, and the case wrote nothing).
    def table(dtype: torch.dtype = I32, one_token_pages: bool = False) -> tuple[torch.Tensor, ...]:
        indices, indptr, last = [2, 0, 1], [0, 2, 3], [3, 2]
        if one_token_pages:
            indices, indptr, last = [4, 7, 0, 8, 2, 5, 1, 6, 3], [0, 7, 9], [1, 1]
        return (
            ints([0, 0, 1], dtype),
            ints([5, 6, 1], dtype),
            ints(indices, dtype),
            ints(indptr, dtype),
            ints(last, dtype),
        )

    def append(layout: str = "NHD") -> Callable[..., None]:
        def call(k, v, b, p, cache, *rest) -> None:  # noqa: ANN001
            flashinfer.append_paged_kv_cache(k, v, b, p, cache, *rest, kv_layout=layout)

        return call

    def pair_call(k, v, b, p, k_cache, v_cache, *rest) -> None:  # noqa: ANN001
        flashinfer.append_paged_kv_cache(k, v, b, p, (k_cache, v_cache), *rest)

    def inputs(
        *caches: torch.Tensor, dtype: torch.dtype = I32, one_token_pages: bool = False
    ) -> tuple[torch.Tensor, ...]:
        b, p, *rest = table(dtype, one_token_pages)
        return (randn(3, 2, 64), randn(3, 2, 64), b, p, *caches, *rest)

    pair = [("append_paged_kv_cache", {"k_cache": "in4", "v_cache": "in5"})]
    # A combined cache reaches the op whole: writes through two select() views of one graph
    # input are lost under dynamic shapes (see test_compiled_append_with_dynamic_shapes).
    one = [("append_paged_kv_cache", {"k_cache": "in4", "v_cache": None})]
    return {
        "append_paged_kv_cache": lambda: Case(
            pair_call, inputs(randn(3, 4, 2, 64), randn(3, 4, 2, 64)), pair, []
        ),
        "append_paged_kv_cache_int64_page_size_1": lambda: Case(
            pair_call,
            inputs(randn(9, 2, 64), randn(9, 2, 64), dtype=I64, one_token_pages=True),
            pair,
            [],
        ),
        "append_paged_kv_cache_5d_nhd": lambda: Case(
            append(), inputs(randn(3, 2, 4, 2, 64)), one, []
        ),
        "append_paged_kv_cache_5d_hnd": lambda: Case(
            append("HND"), inputs(randn(3, 2, 2, 4, 64)), one, []
        ),
    }


def _sampling_cases() -> dict[str, Callable[[], Case]]:
    # Seeds given, so that a GPU run is reproducible (draws from the default generator have
    # tests of their own).
    seeds = dict(seed=7, offset=8)
    tokens = [((4,), I32)]
    return {
        "softmax": lambda: Case(
            lambda x: flashinfer.softmax(x),
            (randn(4, 1000),),
            [("softmax", OUT)],
            [((4, 1000), F32)],
        ),
        "softmax_temperature_tensor": lambda: Case(
            lambda x, t: flashinfer.softmax(x, t, enable_pdl=False),
            (randn(4, 1000, dtype=BF16), torch.rand(4) + 0.5),
            [("softmax", OUT)],
            [((4, 1000), F32)],
        ),
        "sampling_from_logits": lambda: Case(
            lambda x: flashinfer.sampling_from_logits(x, **seeds),
            (randn(4, 1000),),
            [("sampling_from_logits", OUT)],
            tokens,
        ),
        "sampling_from_logits_indices": lambda: Case(
            lambda x, i: flashinfer.sampling_from_logits(x, i, **seeds),
            (randn(4, 1000, dtype=F32), ints([3, 0, 0, 2, 1, 3], I64)),
            [("sampling_from_logits", OUT)],
            [((6,), I64)],
        ),
        "sampling_from_probs_seed_tensors": lambda: Case(
            lambda x, s, o: flashinfer.sampling_from_probs(x, seed=s, offset=o),
            (probs(), ints([11], I64), ints([12, 13, 14, 15], I64)),
            [("sampling_from_probs", SAMPLE)],
            tokens,
        ),
        "top_p_sampling_from_probs": lambda: Case(
            lambda x: flashinfer.top_p_sampling_from_probs(x, 0.9, return_valid=True, **seeds),
            (probs(),),
            [("sampling_from_probs", {"out": "out0", "valid": "out1"})],
            [((4,), I32), ((4,), torch.bool)],
        ),
        "top_k_sampling_from_probs": lambda: Case(
            lambda x, k: flashinfer.top_k_sampling_from_probs(x, k, **seeds),
            (probs(), ints([1, 5, 50, 2000], I64)),
            [("sampling_from_probs", SAMPLE)],
            tokens,
        ),
        "min_p_sampling_from_probs": lambda: Case(
            lambda x: flashinfer.min_p_sampling_from_probs(x, 0.1, **seeds),
            (probs(dtype=F16),),
            [("sampling_from_probs", SAMPLE)],
            tokens,
        ),
        "top_k_top_p_sampling_from_probs": lambda: Case(
            lambda x: flashinfer.top_k_top_p_sampling_from_probs(
                x, 20, 0.8, filter_apply_order="joint", **seeds
            ),
            (probs(),),
            [("sampling_from_probs", SAMPLE)],
            tokens,
        ),
        "top_k_top_p_sampling_from_logits": lambda: Case(
            lambda x, p: flashinfer.top_k_top_p_sampling_from_logits(x, 20, p, **seeds),
            (randn(4, 1000), torch.rand(4) * 0.5 + 0.4),
            [("softmax", {"out": "tmp"}), ("sampling_from_probs", SAMPLE)],
            tokens,
        ),
        "top_p_renorm_probs": lambda: Case(
            lambda x: flashinfer.top_p_renorm_probs(x, 0.7),
            (probs(dtype=F16),),
            [("renorm_probs", OUT)],
            [((4, 1000), F32)],
        ),
        "top_k_renorm_probs": lambda: Case(
            lambda x, k: flashinfer.top_k_renorm_probs(x, k),
            (probs(dtype=BF16), ints([1, 10, 100, 1000])),
            [("renorm_probs", OUT)],
            [((4, 1000), BF16)],
        ),
        "top_k_mask_logits": lambda: Case(
            lambda x: flashinfer.top_k_mask_logits(x, 10),
            (randn(4, 1000),),
            [("top_k_mask_logits", OUT)],
            [((4, 1000), F16)],
        ),
    }


CASES: dict[str, Callable[[], Case]] = {
    **_norm_cases(),
    **_activation_cases(),
    **_rope_cases(),
    **_page_cases(),
    **_sampling_cases(),
}


# -- CPU: fake CUDA tensors ------------------------------------------------------------------


@pytest.fixture
def no_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a module (so building or launching anything) fails the test."""

    def refuse(*args: Any) -> None:
        raise AssertionError("a kernel module was requested while tracing")

    for module, getters in GETTERS.items():
        for getter in getters:
            monkeypatch.setattr(module, getter, refuse)


@pytest.fixture
def fake(no_modules: None) -> FakeTensorMode:
    return FakeTensorMode()


def _build(mode: FakeTensorMode, name: str) -> Case:
    with mode, torch.device("cuda"):
        return CASES[name]()


def _trace(case: Case) -> torch.fx.GraphModule:
    return make_fx(case.fn, tracing_mode="fake")(*case.inputs)


def _op_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [
        node
        for node in graph.nodes
        if isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "flashinfer"
    ]


def _op_name(node: torch.fx.Node) -> str:
    return node.target._schema.name.removeprefix("flashinfer::")


def _written(node: torch.fx.Node) -> dict[str, Any]:
    """The arguments the op node's schema marks written, by name."""
    arguments = node.target._schema.arguments
    bound = {**{a.name: v for a, v in zip(arguments, node.args)}, **node.kwargs}
    return {a.name: bound.get(a.name) for a in arguments if a.alias_info and a.alias_info.is_write}


def _returned(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    (output,) = [node for node in graph.nodes if node.op == "output"]
    value = output.args[0]
    values = value if isinstance(value, (tuple, list)) else [value]
    return [v for v in values if v is not None]


def _base(node: Any) -> Any:
    """The tensor ``node`` is a view of (itself if none)."""
    while isinstance(node, torch.fx.Node) and getattr(node.target, "is_view", False):
        node = node.args[0]
    return node


def _origin(value: Any, graph: torch.fx.Graph) -> str | None:
    if value is None:
        return None
    base = _base(value)
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    returned = [_base(node) for node in _returned(graph)]
    if base in inputs:
        return f"in{inputs.index(base)}"
    if base in returned:
        return f"out{returned.index(base)}"
    return "tmp"


def _called(graph: torch.fx.Graph) -> list[tuple[str, dict[str, str | None]]]:
    return [
        (_op_name(node), {arg: _origin(v, graph) for arg, v in _written(node).items()})
        for node in _op_nodes(graph)
    ]


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_the_api_traces_into_its_ops_writing_what_their_schemas_say(
    fake: FakeTensorMode, name: str
) -> None:
    case = _build(fake, name)
    graph = _trace(case).graph
    assert _called(graph) == case.writes
    returned = [node.meta["val"] for node in _returned(graph)]
    assert [(tuple(t.shape), t.dtype) for t in returned] == case.returns
    assert all(t.device.type == "cuda" and t.is_contiguous() for t in returned)


@pytest.mark.parametrize("name", list(CASES))
def test_the_api_exports_without_a_graph_break(fake: FakeTensorMode, name: str) -> None:
    case = _build(fake, name)
    exported = torch.export.export(_Call(case.fn), case.inputs, strict=True)
    assert [_op_name(node) for node in _op_nodes(exported.graph)] == [op for op, _ in case.writes]


def test_the_registered_ops_are_the_ones_the_apis_call() -> None:
    with FakeTensorMode(), torch.device("cuda"):
        called = {op for build in CASES.values() for op, _ in build().writes}
    assert {op._name for op in module_ops(*FAMILIES)} == called


def test_int64_indices_reach_the_append_op_as_int32(fake: FakeTensorMode) -> None:
    graph = _trace(_build(fake, "append_paged_kv_cache_int64_page_size_1")).graph
    (node,) = _op_nodes(graph)
    arguments = node.target._schema.arguments
    for a, value in zip(arguments, node.args):
        if a.name in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"):
            assert value.meta["val"].dtype == I32, a.name


@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_enable_pdl_reaches_the_op_as_given(fake: FakeTensorMode, enable_pdl: bool | None) -> None:
    with fake, torch.device("cuda"):
        x, w = randn(4, 64), randn(64)
    for api in (flashinfer.rmsnorm, flashinfer.silu_and_mul, flashinfer.softmax):
        args = (x, w) if api is flashinfer.rmsnorm else (x,)
        graph = make_fx(lambda *a: api(*a, enable_pdl=enable_pdl), tracing_mode="fake")(*args)
        (node,) = _op_nodes(graph.graph)
        assert node.args[-1] is enable_pdl


def test_checks_still_raise_while_tracing(fake: FakeTensorMode) -> None:
    with fake, torch.device("cuda"):
        x, w = randn(4, 64), randn(32)
        cpu = torch.empty(4, 64, dtype=F16, device="cpu")
    with pytest.raises(ValueError, match="weight has 32 elements, but input's last dim is 64"):
        make_fx(lambda x, w: flashinfer.rmsnorm(x, w), tracing_mode="fake")(x, w)
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        make_fx(lambda x: flashinfer.silu_and_mul(x), tracing_mode="fake")(cpu)
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got str"):
        make_fx(lambda x: flashinfer.softmax(x, enable_pdl="on"), tracing_mode="fake")(x)


def test_fused_add_rmsnorm_compares_storages_while_tracing(fake: FakeTensorMode) -> None:
    with fake, torch.device("cuda"):
        buffer, w = randn(8, 64), randn(64)
    trace = make_fx(lambda x, r, w: flashinfer.fused_add_rmsnorm(x, r, w), tracing_mode="fake")
    with pytest.raises(ValueError, match="input and residual must be different tensors"):
        trace(buffer, buffer, w)
    halves = (buffer.narrow(0, 0, 4), buffer.narrow(0, 4, 4))  # one storage, two offsets
    (node,) = _op_nodes(trace(*halves, w).graph)
    assert _op_name(node) == "fused_add_rmsnorm"


@pytest.mark.parametrize("op_name", ["fused_add_rmsnorm", "fused_add_rmsnorm_quant"])
def test_the_op_checks_aliasing_on_the_real_tensors(no_modules: None, op_name: str) -> None:
    """A graph traced with distinct fakes may run with one tensor for both: the op catches it
    before anything is loaded."""
    with FakeTensorMode(), torch.device("cuda"):
        fakes = (randn(4, 64), randn(4, 64), randn(64))
    graph = make_fx(lambda x, r, w: flashinfer.fused_add_rmsnorm(x, r, w), tracing_mode="fake")(
        *fakes
    )
    x, w = torch.randn(4, 64, dtype=F16), torch.randn(64, dtype=F16)
    out = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    op = getattr(torch.ops.flashinfer, op_name).default
    args = (
        (x, x, w, 1e-6, None)
        if op_name == "fused_add_rmsnorm"
        else (out, x, x, w, None, 1.0, 1e-6, None)
    )
    with cpu_kernels(norm_api):
        with pytest.raises(ValueError, match="input and residual must be different tensors"):
            graph(x, x, w)
        with pytest.raises(ValueError, match="input and residual must be different tensors"):
            op(*args)
        with pytest.raises(AssertionError, match="kernel module was requested"):
            graph(x, x.clone(), w)  # distinct: on to the module


def test_sampling_leaves_the_draw_to_the_op(fake: FakeTensorMode) -> None:
    """Without seed or generator the op gets no position (it reads the default generator each
    time it runs); ints pass as int64 values, tensors as graph inputs."""
    with fake, torch.device("cuda"):
        p, seed, offset = probs(), ints([1], I64), ints([2], I64)
    position = ("seed_values", "offset_values", "seed", "offset")

    def traced(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        (node,) = _op_nodes(make_fx(fn, tracing_mode="fake")(*args).graph)
        names = [a.name for a in node.target._schema.arguments]
        return {n: v for n, v in zip(names, node.args) if n in position}

    assert traced(lambda p: flashinfer.sampling_from_probs(p), p) == dict.fromkeys(position)
    assert traced(lambda p: flashinfer.sampling_from_logits(p), p) == dict.fromkeys(position)
    given = traced(lambda p: flashinfer.top_p_sampling_from_probs(p, 0.5, seed=2**64 - 1), p)
    assert given == dict(seed_values=None, offset_values=None, seed=-1, offset=0)
    tensors = traced(
        lambda p, s, o: flashinfer.sampling_from_probs(p, seed=s, offset=o), p, seed, offset
    )
    assert [v.op for v in tensors.values() if v is not None] == ["placeholder", "placeholder"]
    assert tensors["seed"] is None and tensors["offset"] is None


def test_a_generator_is_refused_while_tracing_with_fake_tensors(fake: FakeTensorMode) -> None:
    with fake, torch.device("cuda"):
        p = probs()
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    with pytest.raises(ValueError, match="generator is read when the call is made"):
        make_fx(
            lambda p: flashinfer.sampling_from_probs(p, generator=generator), tracing_mode="fake"
        )(p)
    assert torch.equal(generator.get_state(), state)  # not drawn from


def test_check_nan_moves_into_the_op_while_tracing(fake: FakeTensorMode) -> None:
    with fake, torch.device("cuda"):
        p = probs()
    for check_nan in (False, True):
        fn = lambda p: flashinfer.sampling_from_probs(p, check_nan=check_nan, seed=1)  # noqa: E731
        (node,) = _op_nodes(make_fx(fn, tracing_mode="fake")(p).graph)
        assert node.args[-1] is check_nan


def test_nan_checks_on_real_tensors(no_modules: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager, the API checks before the op; the op checks when the traced graph passes it on."""
    monkeypatch.setattr(checks, "check_cuda", lambda name, tensor, like=None: None)
    nan = torch.full((2, 8), 0.125)
    nan[1, 3] = float("nan")
    out = torch.empty(2, dtype=I32)
    with cpu_kernels(sampling_api):
        with pytest.raises(ValueError, match="probs contains NaN"):
            flashinfer.sampling_from_probs(nan, check_nan=True, seed=1)
        with pytest.raises(ValueError, match="logits contains NaN"):
            flashinfer.top_k_top_p_sampling_from_logits(nan, 2, 0.5, check_nan=True, seed=1)
        with pytest.raises(ValueError, match="probs contains NaN"):
            torch.ops.flashinfer.sampling_from_probs(
                out, None, nan, None, None, None, None, 1, 1.0, 0.0, 0, True, None, None, 1, 2, True
            )
        with pytest.raises(ValueError, match="logits contains NaN"):
            torch.ops.flashinfer.sampling_from_logits(out, nan, None, None, None, 1, 2, True)


def test_packbits_traces_into_plain_torch(fake: FakeTensorMode) -> None:
    """No kernel, no op: packbits is torch code (segment_packbits sizes its output from
    indptr's values, so it is eager-only)."""
    with fake, torch.device("cuda"):
        x = torch.empty(20, dtype=torch.bool)
    graph = make_fx(lambda x: flashinfer.packbits(x, "little"), tracing_mode="fake")(x).graph
    assert not _op_nodes(graph)
    (out,) = [node.meta["val"] for node in _returned(graph)]
    assert tuple(out.shape) == (3,) and out.dtype == torch.uint8


_EXPORT_AND_CALL = """
import json, sys
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import flashinfer

class Norm(torch.nn.Module):
    def forward(self, x, w):
        return flashinfer.rmsnorm(x, w)

with FakeTensorMode():
    x = torch.empty(4, 64, dtype=torch.float16, device="cuda")
    w = torch.empty(64, dtype=torch.float16, device="cuda")
exported = torch.export.export(Norm(), (x, w), strict=True)
ops = [str(n.target) for n in exported.graph.nodes if "flashinfer" in str(n.target)]
print("MARK", json.dumps(ops), flush=True)
try:
    flashinfer.rmsnorm(torch.ones(4, 64, dtype=torch.float16), torch.ones(64, dtype=torch.float16))
except ValueError as err:
    print("EAGER", err, flush=True)
"""


def test_logging_and_the_trace_dump_stay_out_of_traced_code(tmp_path) -> None:  # noqa: ANN001
    """At FLASHINFER_LOGLEVEL=3 with the fi_trace auto-dump on, an export (dynamo, strict)
    logs and dumps nothing and builds nothing; the eager call after it is logged and dumped."""
    workspace, dumps = tmp_path / "ws", tmp_path / "dumps"
    proc = run_python(
        _EXPORT_AND_CALL,
        env={
            "FLASHINFER_LOGLEVEL": "3",
            "FLASHINFER_LOGDEST": "stdout",
            "FLASHINFER_TRACE_DUMP": "1",
            "FLASHINFER_TRACE_DUMP_DIR": str(dumps),
            "FLASHINFER_WORKSPACE_BASE": str(workspace),
            "FLASHINFER_DISABLE_JIT": "1",
        },
    )
    traced, _, eager = proc.stdout.partition("MARK ")
    assert "FlashInfer API Call" not in traced
    ops_line, _, eager = eager.partition("\n")
    assert json.loads(ops_line) == ["flashinfer.rmsnorm.default"]
    assert eager.count("FlashInfer API Call: rmsnorm") == 1
    assert "EAGER input must be a CUDA tensor" in eager
    (dumped,) = dumps.iterdir()  # the eager call's definition only
    assert json.loads(dumped.read_text())["name"] == dumped.stem and "rmsnorm" in dumped.stem
    assert not list(workspace.rglob("cached_ops"))


# -- Running the cases: CPU stand-ins for the modules, or a GPU ---------------------------------


def _clone_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy with ``t``'s strides: torch.clone makes a strided row layout (rows padded past
    their width) contiguous, and the cases build such inputs on purpose."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _clone(value: Any) -> Any:
    return tree_map_only(torch.Tensor, _clone_tensor, value)


def _assert_same(actual: Any, expected: Any) -> None:
    """Bitwise equal tensors (fp8 compared as bytes), NaN matching NaN."""
    if isinstance(expected, torch.Tensor) and expected.dtype == torch.float8_e4m3fn:
        actual, expected = actual.view(torch.uint8), expected.view(torch.uint8)
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_same(a, e)
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


class _RecordOps(TorchDispatchMode):
    """Records each flashinfer op call with copies of its arguments as they came in."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.namespace == "flashinfer":
            self.calls.append((func, _clone(args)))
        return func(*args, **(kwargs or {}))


# The binding arguments each module function writes (as the ops call them).
_WRITTEN_ARGS = {
    "rmsnorm": (0,),
    "gemma_rmsnorm": (0,),
    "fused_add_rmsnorm": (0, 1),
    "gemma_fused_add_rmsnorm": (0, 1),
    "rmsnorm_quant": (0,),
    "fused_add_rmsnorm_quant": (0, 2),
    "layernorm": (0,),
    "silu_and_mul": (0,),
    "gelu_and_mul": (0,),
    "gelu_tanh_and_mul": (0,),
    "apply_rope_pos_ids": (0, 1),
    "apply_llama31_rope_pos_ids": (0, 1),
    "apply_rope_cos_sin_cache": (0, 1),
    "append_paged_kv_cache": (4, 5),
    "softmax": (0,),
    "sampling_from_logits": (0,),
    "sampling_from_probs": (0, 1),
    "renorm_probs": (0,),
    "top_k_mask_logits": (0,),
}


class _StandInModule:
    """Stands in for every compiled module: a launch fills the i-th tensor it writes with
    i + 1, so that a result or an input that a compiled call leaves unwritten, or writes
    into the wrong place, differs from eager."""

    def __getattr__(self, function: str) -> Callable[..., None]:
        def launch(*args: Any) -> None:
            for value, position in enumerate(_WRITTEN_ARGS[function], 1):
                if args[position] is not None:
                    args[position].fill_(value)

        return launch


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ops run on CPU tensors (the device checks let them through) into stand-in
    modules."""
    module = _StandInModule()
    for family, getters in GETTERS.items():
        for getter in getters:
            monkeypatch.setattr(family, getter, lambda *args: module)
    monkeypatch.setattr(checks, "check_cuda", lambda name, tensor, like=None: None)
    with cpu_kernels(*FAMILIES):
        yield


def _cpu_case(name: str) -> Case:
    torch.manual_seed(0)
    with torch.device("cpu"):
        return CASES[name]()


def _recorded_calls(case: Case) -> list[tuple[Any, tuple[Any, ...]]]:
    """The op calls ``case`` makes, each with copies of its arguments."""
    with _RecordOps() as recorder:
        case.fn(*_clone(case.inputs))
    assert [func._schema.name.removeprefix("flashinfer::") for func, _ in recorder.calls] == [
        op for op, _ in case.writes
    ]
    return recorder.calls


def _opcheck(func: Any, args: tuple[Any, ...]) -> None:
    """opcheck's tests; its schema test compares tensors with allclose, which float8 lacks,
    so the fp8 norms skip that one (what they write is checked by the trace tests)."""
    tests = (
        "test_schema",
        "test_autograd_registration",
        "test_faketensor",
        "test_aot_dispatch_dynamic",
    )
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
        tests = tests[1:]
    torch.library.opcheck(func, args, test_utils=tests)


def _written_inputs(case: Case) -> set[int]:
    """The inputs ``case``'s ops write ("in<i>" in its writes)."""
    return {
        int(source[2:])
        for _, arguments in case.writes
        for source in arguments.values()
        if source is not None and source.startswith("in")
    }


def _compiled_matches_eager(case: Case, **options: Any) -> None:
    """Same results and the same effect on the inputs (in-place APIs, out=, the cache); the
    eager call changes every input the case writes, so the comparison is not of two
    untouched copies."""
    eager_inputs, compiled_inputs = _clone(case.inputs), _clone(case.inputs)
    expected = case.fn(*eager_inputs)
    for i in _written_inputs(case):
        before, after = case.inputs[i], eager_inputs[i]
        if before.dtype == torch.float8_e4m3fn:
            before, after = before.view(torch.uint8), after.view(torch.uint8)
        assert not torch.equal(before, after), f"the eager call left input {i} as it was"
    actual = torch.compile(case.fn, fullgraph=True, **options)(*compiled_inputs)
    _assert_same(actual, expected)
    _assert_same(compiled_inputs, eager_inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_opcheck_on_cpu_stand_ins(stand_ins: None, name: str) -> None:
    for func, args in _recorded_calls(_cpu_case(name)):
        _opcheck(func, args)


@pytest.mark.parametrize("name", [n for n in CASES if n not in CPU_INDEX_CHECKS])
def test_compiled_call_matches_eager_on_cpu_stand_ins(stand_ins: None, name: str) -> None:
    _compiled_matches_eager(_cpu_case(name), backend="aot_eager")


def test_a_generator_breaks_the_graph_and_is_read_at_every_call(stand_ins: None) -> None:
    """Dynamo cannot trace a generator read: fullgraph refuses it, and a graph-broken compile
    reads and advances it at every call, as eager calls do."""
    x = torch.rand(4, 100)

    def states(generator: torch.Generator, fn: Callable[..., Any]) -> list[torch.Tensor]:
        drawn = []
        for _ in range(2):
            fn(x)
            drawn.append(generator.get_state().clone())
        return drawn

    eager, compiled = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(
            lambda x: flashinfer.sampling_from_probs(x, generator=compiled),
            fullgraph=True,
            backend="aot_eager",
        )(x)
    expected = states(eager, lambda x: flashinfer.sampling_from_probs(x, generator=eager))
    fn = torch.compile(
        lambda x: flashinfer.sampling_from_probs(x, generator=compiled), backend="aot_eager"
    )
    actual = states(compiled, fn)
    assert not torch.equal(expected[0], expected[1])
    _assert_same(actual, expected)


# -- GPU: the real kernels -------------------------------------------------------------------


def _gpu_case(name: str) -> Case:
    torch.manual_seed(0)
    with torch.device("cuda"):
        return CASES[name]()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_opcheck_with_the_arguments_the_api_passes(name: str) -> None:
    for func, args in _recorded_calls(_gpu_case(name)):
        _opcheck(func, args)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_call_matches_eager(name: str) -> None:
    _compiled_matches_eager(_gpu_case(name))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_compiled_append_with_dynamic_shapes(layout: str) -> None:
    """A combined 5-D cache appended to under dynamic shapes (what a second shape turns on)
    keeps every write; through two select() views of the cache, torch loses them."""
    name = "append_paged_kv_cache_5d_nhd" if layout == "NHD" else "append_paged_kv_cache_5d_hnd"
    _compiled_matches_eager(_gpu_case(name), dynamic=True)


@pytest.mark.gpu
def test_compiled_sampling_draws_from_the_default_generator_like_eager() -> None:
    """The op reads the default generator when it runs: each compiled call draws anew, and
    from the same generator state the numbers eager calls draw (one draw per call, so that
    no reordering of launches in the compiled graph can change the order of the reads)."""
    p = torch.full((8, 4096), 1.0 / 4096, device="cuda")

    def sample(p: torch.Tensor) -> torch.Tensor:
        return flashinfer.top_k_sampling_from_probs(p, 1000)

    compiled = torch.compile(sample, fullgraph=True)
    compiled(p)  # compile outside the compared draws
    torch.manual_seed(1)
    eager = [sample(p), sample(p)]
    torch.manual_seed(1)
    drawn = [compiled(p), compiled(p)]
    _assert_same(drawn, eager)
    assert not torch.equal(eager[0], eager[1])


def _capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm up: modules load outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("explicit", [False, True])
def test_cuda_graph_replays_draw_new_numbers(explicit: bool) -> None:
    """Captured without a seed (the default generator, or passed explicitly), every replay
    draws anew: the seed is drawn on the device from the generator's stream."""
    vocab = 4096
    p = torch.full((16, vocab), 1.0 / vocab, device="cuda")
    p[:, vocab // 2 :] = 0  # tokens from the first half only
    generator = torch.cuda.default_generators[torch.cuda.current_device()] if explicit else None
    graph, out = _capture(lambda: flashinfer.sampling_from_probs(p, generator=generator))
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(out.clone())
    torch.cuda.synchronize()
    assert all(((r >= 0) & (r < vocab // 2)).all() for r in replays)
    assert not torch.equal(replays[0], replays[1]) and not torch.equal(replays[1], replays[2])


@pytest.mark.gpu
def test_reduce_overhead_replays_draw_new_numbers() -> None:
    """torch.compile's CUDA graphs capture the op: its replays draw anew too."""
    vocab = 4096
    p = torch.full((16, vocab), 1.0 / vocab, device="cuda")
    p[:, vocab // 2 :] = 0
    compiled = torch.compile(
        lambda p: flashinfer.sampling_from_probs(p), mode="reduce-overhead", fullgraph=True
    )
    draws = [compiled(p).clone() for _ in range(5)]  # warm-up, record, then replays
    torch.cuda.synchronize()
    assert all(((d >= 0) & (d < vocab // 2)).all() for d in draws)
    assert len({tuple(d.tolist()) for d in draws[2:]}) == 3


@pytest.mark.gpu
def test_cuda_graph_replays_read_seed_tensors() -> None:
    p = torch.randn(8, 1000, device="cuda").softmax(-1)
    seed = torch.zeros(1, dtype=I64, device="cuda")
    offset = torch.zeros(1, dtype=I64, device="cuda")
    graph, out = _capture(lambda: flashinfer.sampling_from_probs(p, seed=seed, offset=offset))
    for value in (5, 6, 5):
        seed.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(out, flashinfer.sampling_from_probs(p, seed=value, offset=0))
