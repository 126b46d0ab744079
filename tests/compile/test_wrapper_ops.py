"""The attention APIs (decode, prefill and cascade wrappers, single_* and merge_state*) as
torch custom ops: plan() on the host, run() traced into ``torch.ops.flashinfer.*`` nodes.

On the CPU, with fake CUDA tensors: a wrapper built over a fake workspace and planned with
host index tensors traces (make_fx, and torch.export strict, which fails on a graph break)
into one op node per launch, fed with the planned buffers, with nothing built or launched;
the ops' schemas write exactly what the launches write; the registered attention ops are
exactly the ones the APIs call; argument checks still raise while tracing and none reads an
address. With the ops' implementations registered for CPU tensors and stand-in modules:
opcheck of every op, torch.compile(fullgraph=True) against eager, and a compiled run that
follows a later plan() without recompiling.

On a GPU: opcheck of every op with the real kernels, torch.compile(fullgraph=True) against
eager for every API, CUDA-graph replay of decode after a new plan(), and the alignment check
a traced run leaves to the op."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import flashinfer
from flashinfer import cascade as cascade_api
from flashinfer import checks
from flashinfer import decode as decode_api
from flashinfer import prefill as prefill_api
from flashinfer.attention_args import WorkspaceOwner
from flashinfer.jit.decode import gen_decode_module
from flashinfer.jit.prefill import BATCH_PREFILL_ARGS, SINGLE_PREFILL_ARGS
from tests.conftest import REPO_ROOT, run_python
from tests.ops.test_prefill import attention_ops, cpu_kernels

DTYPE = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM, PAGE = 8, 2, 128, 16
NUM_PAGES = 48
WORKSPACE_BYTES = 32 << 20
# One batch of three requests: KV lengths 37, 600 and 1 in pages of 16 (the long one splits
# on a GPU), their pages in reverse order; query lengths 3, 1, 3 for prefill.
KV_INDPTR, KV_LAST = [0, 3, 41, 42], [5, 8, 1]
KV_INDICES = list(range(41, -1, -1))
QO_INDPTR = [0, 3, 4, 7]
RAGGED_KV_INDPTR = [0, 10, 30, 40]
RAGGED_TOKENS = 320  # k/v rows of the ragged case: room for either plan
# A replan of the same batch size: other lengths (20, 1, 300) and pages; query lengths 4, 1,
# 2; ragged KV lengths 300, 1, 9.
KV_INDPTR_2, KV_LAST_2, KV_INDICES_2 = [0, 2, 3, 22], [4, 1, 12], list(range(22))
QO_INDPTR_2, RAGGED_KV_INDPTR_2 = [0, 4, 5, 7], [0, 300, 301, 310]
# A cascade level shared by the whole batch: two full pages after the batch's own.
SHARED = ([0, 7], [0, 2], [42, 43], [PAGE])

BATCH_DECODE = "flashinfer::batch_decode_with_paged_kv_cache"
BATCH_PREFILL = "flashinfer::batch_prefill_with_kv_cache"
SINGLE_DECODE = "flashinfer::single_decode_with_kv_cache"
SINGLE_PREFILL = "flashinfer::single_prefill_with_kv_cache"
MERGE_STATE = "flashinfer::merge_state"
MERGE_STATE_IN_PLACE = "flashinfer::merge_state_in_place"
MERGE_STATES = "flashinfer::merge_states"
# What each op's launch writes (its schema's mutable arguments).
WRITES = {
    BATCH_DECODE: {"tmp_v", "tmp_lse", "out", "lse"},
    BATCH_PREFILL: {"tmp_v", "tmp_lse", "out", "lse"},
    SINGLE_DECODE: {"out", "lse"},
    SINGLE_PREFILL: {"out", "lse"},
    MERGE_STATE: {"v_out", "s_out"},
    MERGE_STATE_IN_PLACE: {"v", "s"},
    MERGE_STATES: {"v_out", "s_out"},
}


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# -- the APIs under test, on any kind of tensor ------------------------------------------------

# Makes a tensor of a shape and dtype where the case runs (fake CUDA, CPU or CUDA).
New = Callable[..., torch.Tensor]


@dataclass
class Case:
    """A call of one API: ``fn(*inputs)``, the ops it launches (in order), the shapes and
    dtypes of what it returns, and the wrapper it runs (None for the functions)."""

    fn: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]
    ops: list[str]
    returns: list[tuple[tuple[int, ...], torch.dtype]]
    wrapper: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def _pages(new: New, layout: str = "NHD") -> torch.Tensor:
    shape = (PAGE, KV_HEADS) if layout == "NHD" else (KV_HEADS, PAGE)
    return new(NUM_PAGES, *shape, HEAD_DIM)


def _graph_buffers(new: New, decode: bool) -> dict[str, torch.Tensor]:
    """Fixed-size page-table buffers of a CUDA-graph wrapper for the batch of three."""
    names = (
        ("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer")
        if decode
        else ("paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf")
    )
    sizes = (4, 64, 3)
    buffers = {name: new(size, dtype=torch.int32) for name, size in zip(names, sizes)}
    if not decode:
        buffers["qo_indptr_buf"] = new(4, dtype=torch.int32)
    return buffers


def decode_case(
    new: New, layout: str = "NHD", tensor_cores: bool = False, cuda_graph: bool = False
) -> Case:
    buffers = _graph_buffers(new, True) if cuda_graph else {}
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        new(WORKSPACE_BYTES, dtype=torch.uint8),
        kv_layout=layout,
        use_cuda_graph=cuda_graph,
        use_tensor_cores=tensor_cores,
        **buffers,
    )
    wrapper.plan(
        _i32(KV_INDPTR),
        _i32(KV_INDICES),
        _i32(KV_LAST),
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        PAGE,
        q_data_type=DTYPE,
    )
    q = new(3, HEADS, HEAD_DIM)
    return Case(
        lambda q, k, v: wrapper.run(q, (k, v), return_lse=True),
        (q, _pages(new, layout), _pages(new, layout)),
        [BATCH_PREFILL if tensor_cores else BATCH_DECODE],
        [((3, HEADS, HEAD_DIM), DTYPE), ((3, HEADS), torch.float32)],
        wrapper,
    )


def paged_prefill_case(new: New, layout: str = "NHD", cuda_graph: bool = False) -> Case:
    buffers = _graph_buffers(new, False) if cuda_graph else {}
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        new(WORKSPACE_BYTES, dtype=torch.uint8),
        kv_layout=layout,
        use_cuda_graph=cuda_graph,
        **buffers,
    )
    wrapper.plan(
        _i32(QO_INDPTR),
        _i32(KV_INDPTR),
        _i32(KV_INDICES),
        _i32(KV_LAST),
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        PAGE,
        causal=True,
        q_data_type=DTYPE,
    )
    return Case(
        lambda q, k, v: wrapper.run(q, (k, v), return_lse=True),
        (new(7, HEADS, HEAD_DIM), _pages(new, layout), _pages(new, layout)),
        [BATCH_PREFILL],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
        wrapper,
    )


def ragged_prefill_case(new: New) -> Case:
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
        new(WORKSPACE_BYTES, dtype=torch.uint8)
    )
    wrapper.plan(
        _i32(QO_INDPTR),
        _i32(RAGGED_KV_INDPTR),
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        causal=True,
        q_data_type=DTYPE,
    )
    return Case(
        lambda q, k, v: wrapper.run(q, k, v, return_lse=True),
        (
            new(7, HEADS, HEAD_DIM),
            new(RAGGED_TOKENS, KV_HEADS, HEAD_DIM),
            new(RAGGED_TOKENS, KV_HEADS, HEAD_DIM),
        ),
        [BATCH_PREFILL],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
        wrapper,
    )


def cascade_case(new: New) -> Case:
    wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(
        2, new(WORKSPACE_BYTES, dtype=torch.uint8)
    )
    own = (QO_INDPTR, KV_INDPTR, KV_INDICES, KV_LAST)
    wrapper.plan(
        *([_i32(SHARED[i]), _i32(own[i])] for i in range(4)),
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        PAGE,
        causal=True,
        q_data_type=DTYPE,
    )
    return Case(
        lambda q, k, v: wrapper.run(q, (k, v)),
        (new(7, HEADS, HEAD_DIM), _pages(new), _pages(new)),
        [BATCH_PREFILL, BATCH_PREFILL, MERGE_STATE_IN_PLACE],
        [((7, HEADS, HEAD_DIM), DTYPE)],
        wrapper,
    )


def single_decode_case(new: New, tensor_cores: bool = False) -> Case:
    return Case(
        lambda q, k, v: flashinfer.single_decode_with_kv_cache(
            q, k, v, use_tensor_cores=tensor_cores, return_lse=True
        ),
        (new(HEADS, HEAD_DIM), new(600, KV_HEADS, HEAD_DIM), new(600, KV_HEADS, HEAD_DIM)),
        [SINGLE_PREFILL if tensor_cores else SINGLE_DECODE],
        [((HEADS, HEAD_DIM), DTYPE), ((HEADS,), torch.float32)],
    )


def single_prefill_case(new: New) -> Case:
    return Case(
        lambda q, k, v: flashinfer.single_prefill_with_kv_cache(
            q, k, v, causal=True, return_lse=True
        ),
        (new(7, HEADS, HEAD_DIM), new(600, KV_HEADS, HEAD_DIM), new(600, KV_HEADS, HEAD_DIM)),
        [SINGLE_PREFILL],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
    )


def _state(new: New) -> tuple[torch.Tensor, torch.Tensor]:
    return new(7, HEADS, HEAD_DIM), new(7, HEADS, dtype=torch.float32)


def merge_state_case(new: New) -> Case:
    return Case(
        flashinfer.merge_state,
        (*_state(new), *_state(new)),
        [MERGE_STATE],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
    )


def _merge_in_place(
    v: torch.Tensor, s: torch.Tensor, v_other: torch.Tensor, s_other: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    flashinfer.merge_state_in_place(v, s, v_other, s_other)
    return v, s


def merge_state_in_place_case(new: New) -> Case:
    return Case(
        _merge_in_place,
        (*_state(new), *_state(new)),
        [MERGE_STATE_IN_PLACE],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
    )


def merge_states_case(new: New) -> Case:
    return Case(
        flashinfer.merge_states,
        (new(7, 3, HEADS, HEAD_DIM), new(7, 3, HEADS, dtype=torch.float32)),
        [MERGE_STATES],
        [((7, HEADS, HEAD_DIM), DTYPE), ((7, HEADS), torch.float32)],
    )


def replan(wrapper: Any) -> None:
    """plan() a case's wrapper again for the batch of three, with the other lengths."""
    tables = (_i32(KV_INDPTR_2), _i32(KV_INDICES_2), _i32(KV_LAST_2))
    sizes = (HEADS, KV_HEADS, HEAD_DIM)
    if isinstance(wrapper, flashinfer.BatchDecodeWithPagedKVCacheWrapper):
        wrapper.plan(*tables, *sizes, PAGE, q_data_type=DTYPE)
    elif isinstance(wrapper, flashinfer.BatchPrefillWithPagedKVCacheWrapper):
        wrapper.plan(_i32(QO_INDPTR_2), *tables, *sizes, PAGE, causal=True, q_data_type=DTYPE)
    else:
        ragged = (_i32(QO_INDPTR_2), _i32(RAGGED_KV_INDPTR_2))
        wrapper.plan(*ragged, *sizes, causal=True, q_data_type=DTYPE)


CASES: dict[str, Callable[[New], Case]] = {
    "decode": decode_case,
    "decode_hnd": lambda new: decode_case(new, layout="HND"),
    "decode_tensor_cores": lambda new: decode_case(new, tensor_cores=True),
    "decode_cuda_graph": lambda new: decode_case(new, cuda_graph=True),
    "decode_tensor_cores_cuda_graph": lambda new: decode_case(
        new, tensor_cores=True, cuda_graph=True
    ),
    "paged_prefill": paged_prefill_case,
    "paged_prefill_hnd": lambda new: paged_prefill_case(new, layout="HND"),
    "paged_prefill_cuda_graph": lambda new: paged_prefill_case(new, cuda_graph=True),
    "ragged_prefill": ragged_prefill_case,
    "cascade": cascade_case,
    "single_decode": single_decode_case,
    "single_decode_tensor_cores": lambda new: single_decode_case(new, tensor_cores=True),
    "single_prefill": single_prefill_case,
    "merge_state": merge_state_case,
    "merge_state_in_place": merge_state_in_place_case,
    "merge_states": merge_states_case,
}


# -- tracing with fake CUDA tensors ------------------------------------------------------------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> New:
    """Fake CUDA tensors (of one FakeTensorMode), with every way to a module, a device query
    or a launch refused: tracing must need none."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("tracing reached a module, the device or a launch")

    for module, names in (
        (decode_api, ("get_decode_module", "_max_ctas", "get_device_sm_count")),
        (prefill_api, ("get_prefill_module", "_max_ctas", "get_device_sm_count")),
        (cascade_api, ("get_cascade_module",)),
    ):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    mode = FakeTensorMode()

    def new(*shape: int, dtype: torch.dtype = DTYPE) -> torch.Tensor:
        with mode:
            return torch.empty(*shape, dtype=dtype, device="cuda")

    return new


def _op_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [
        node
        for node in graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.namespace == "flashinfer"
    ]


def _op_name(node: torch.fx.Node) -> str:
    return node.target._schema.name


def _bound(node: torch.fx.Node) -> dict[str, Any]:
    """The op node's arguments by schema name."""
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _returned(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    (output,) = [node for node in graph.nodes if node.op == "output"]
    value = output.args[0]
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _trace(case: Case) -> torch.fx.GraphModule:
    return make_fx(case.fn, tracing_mode="fake")(*case.inputs)


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.fn(*inputs)


@pytest.mark.parametrize("name", CASES)
def test_the_api_traces_into_its_ops_and_nothing_is_launched(fake: New, name: str) -> None:
    case = CASES[name](fake)
    graph = _trace(case).graph
    assert [_op_name(node) for node in _op_nodes(graph)] == case.ops
    returned = [node.meta["val"] for node in _returned(graph)]
    assert [(tuple(t.shape), t.dtype) for t in returned] == case.returns
    assert all(t.device.type == "cuda" and t.is_contiguous() for t in returned)


@pytest.mark.parametrize("name", CASES)
def test_the_api_exports_without_a_graph_break(fake: New, name: str) -> None:
    case = CASES[name](fake)
    exported = torch.export.export(_Call(case.fn), case.inputs, strict=True)
    assert [_op_name(node) for node in _op_nodes(exported.graph)] == case.ops


def test_the_registered_attention_ops_are_the_ones_the_apis_call(fake: New) -> None:
    called = {op for build in CASES.values() for op in build(fake).ops}
    registered = {op._qualname for op in attention_ops()}
    assert registered == called == set(WRITES)


def test_each_op_writes_exactly_its_launch_outputs() -> None:
    for op in attention_ops():
        schema = op._opoverload._schema
        written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
        assert written == WRITES[op._qualname], op._qualname


@pytest.mark.parametrize("name", [n for n in CASES if "tensor_cores" not in n or "single" not in n])
def test_what_the_api_returns_is_what_its_ops_write(fake: New, name: str) -> None:
    """No output comes from anywhere but an op's written argument (the tensor-core single
    decode returns views of them, and is left out)."""
    graph = _trace(CASES[name](fake)).graph
    written = {
        value
        for node in _op_nodes(graph)
        for arg, value in _bound(node).items()
        if arg in WRITES[_op_name(node)]
    }
    returned = _returned(graph)
    assert returned and set(returned) <= written


def _constant(module: torch.fx.GraphModule, node: Any) -> torch.Tensor:
    assert isinstance(node, torch.fx.Node) and node.op == "get_attr", node
    return getattr(module, node.target)


_PLAN_FIELDS = {"plan": "plan_words", "tmp_v": "tmp_v", "tmp_lse": "tmp_lse"}


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_decode_run_launches_with_the_planned_buffers_and_scalars(fake: New, cuda_graph) -> None:
    case = decode_case(fake, cuda_graph=cuda_graph)
    wrapper, plan = case.wrapper, case.wrapper._plan_info
    assert wrapper._cached_module is None  # a fake workspace needs no module
    module = _trace(case)
    (node,) = _op_nodes(module.graph)
    args = _bound(node)
    for arg, planned in (
        ("kv_indptr", wrapper._paged_kv_indptr_buf),
        ("kv_indices", wrapper._paged_kv_indices_buf),
        ("kv_last_page_len", wrapper._paged_kv_last_page_len_buf),
        ("plan", plan.plan_words),
        ("tmp_v", plan.tmp_v),
        ("tmp_lse", plan.tmp_lse),
    ):
        assert _constant(module, args[arg]) is planned, arg
    assert [args[n] for n in ("work_capacity", "merge_capacity", "tmp_capacity")] == [
        plan.work_capacity,
        plan.merge_capacity,
        plan.tmp_capacity,
    ]
    assert (args["grid_work"], args["grid_merge"]) == (plan.grid_work, plan.grid_merge)
    assert (args["hnd"], args["window_left"], args["enable_pdl"]) == (False, -1, None)
    assert args["score_scale"] == pytest.approx(HEAD_DIM**-0.5 * 1.4426950408889634)
    assert plan.plan_words.untyped_storage() is wrapper._int_workspace_buffer.untyped_storage()
    assert plan.tmp_v.untyped_storage() is wrapper._float_workspace_buffer.untyped_storage()
    if cuda_graph:  # the constructor's buffers, and the same regions after another plan()
        buffers = {
            n: getattr(wrapper, f"_{n}_buf") for n in ("paged_kv_indptr", "paged_kv_indices")
        }
        replan(wrapper)
        replanned = _bound(_op_nodes(_trace(case).graph)[0])
        for arg in ("plan", "tmp_v", "tmp_lse"):
            first, second = (
                getattr(plan, _PLAN_FIELDS[arg]),
                getattr(wrapper._plan_info, _PLAN_FIELDS[arg]),
            )
            assert first.untyped_storage() is second.untyped_storage(), arg
            assert (first.storage_offset(), first.shape) == (second.storage_offset(), second.shape)
        assert replanned["grid_work"] == args["grid_work"]
        assert all(getattr(wrapper, f"_{n}_buf") is t for n, t in buffers.items())


def test_prefill_run_launches_with_the_planned_buffers(fake: New) -> None:
    case = paged_prefill_case(fake)
    wrapper, plan = case.wrapper, case.wrapper._plan_info
    module = _trace(case)
    args = _bound(_op_nodes(module.graph)[0])
    for arg, planned in (
        ("qo_indptr", wrapper._qo_indptr_buf),
        ("kv_indptr", wrapper._paged_kv_indptr_buf),
        ("kv_indices", wrapper._paged_kv_indices_buf),
        ("kv_last_page_len", wrapper._paged_kv_last_page_len_buf),
        ("plan", plan.plan_words),
        ("tmp_v", plan.tmp_v),
        ("tmp_lse", plan.tmp_lse),
    ):
        assert _constant(module, args[arg]) is planned, arg
    assert args["causal"] is True and args["custom_mask"] is None
    assert (args["grid_work"], args["grid_merge"]) == (plan.grid_work, plan.grid_merge)
    ragged = ragged_prefill_case(fake)
    ragged_args = _bound(_op_nodes(_trace(ragged).graph)[0])
    assert ragged_args["kv_indices"] is None and ragged_args["kv_last_page_len"] is None


@pytest.mark.parametrize(
    "name",
    ["decode", "decode_tensor_cores", "decode_cuda_graph", "paged_prefill", "ragged_prefill"],
)
def test_run_into_given_out_and_lse_is_the_op_alone(fake: New, name: str) -> None:
    """Nothing is allocated around the launch: a captured run() allocates nothing."""
    case = CASES[name](fake)
    out = torch.empty_like(case.inputs[0])
    lse = out.new_empty(out.shape[:2], dtype=torch.float32)
    wrapper = case.wrapper
    if name == "ragged_prefill":

        def run(q, k, v, out, lse):  # noqa: ANN001, ANN202
            return wrapper.run(q, k, v, out=out, lse=lse)
    else:

        def run(q, k, v, out, lse):  # noqa: ANN001, ANN202
            return wrapper.run(q, (k, v), out=out, lse=lse)

    graph = make_fx(run, tracing_mode="fake")(*case.inputs, out, lse).graph
    calls = [node for node in graph.nodes if node.op == "call_function"]
    assert [_op_name(node) for node in calls] == case.ops


def test_checks_still_raise_while_tracing(fake: New) -> None:
    case = decode_case(fake)
    q, k, v = case.inputs
    wrapper = case.wrapper
    with pytest.raises(ValueError, match="q has shape \\(2, 8, 128\\); plan\\(\\) was for"):
        make_fx(lambda q: wrapper.run(q, (k, v)), tracing_mode="fake")(fake(2, HEADS, HEAD_DIM))
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got str"):
        make_fx(lambda q: wrapper.run(q, (k, v), enable_pdl="yes"), tracing_mode="fake")(q)
    with pytest.raises(TypeError, match="s has dtype torch.int32"):
        make_fx(flashinfer.merge_states, tracing_mode="fake")(
            fake(7, 3, HEADS, HEAD_DIM), fake(7, 3, HEADS, dtype=torch.int32)
        )


def test_no_alignment_check_reads_an_address_while_tracing(fake: New) -> None:
    """A q 2 bytes past an aligned address: fake tensors have no address, so run() does not
    report it (the binding checks the real pointer when the op runs)."""
    case = paged_prefill_case(fake)
    _, k, v = case.inputs
    base = fake(7 * HEADS * HEAD_DIM + 8)
    q = base.narrow(0, 1, 7 * HEADS * HEAD_DIM).view(7, HEADS, HEAD_DIM)
    graph = make_fx(lambda q: case.wrapper.run(q, (k, v)), tracing_mode="fake")(q).graph
    assert [_op_name(node) for node in _op_nodes(graph)] == [BATCH_PREFILL]


@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_enable_pdl_reaches_the_op_as_given(fake: New, enable_pdl: bool | None) -> None:
    for case in (decode_case(fake), paged_prefill_case(fake)):
        q, k, v = case.inputs

        def run(q: torch.Tensor) -> torch.Tensor:
            return case.wrapper.run(q, (k, v), enable_pdl=enable_pdl)  # noqa: B023

        (node,) = _op_nodes(make_fx(run, tracing_mode="fake")(q).graph)
        assert _bound(node)["enable_pdl"] is enable_pdl


def test_tracing_in_a_fresh_process_builds_nothing(tmp_path) -> None:  # noqa: ANN001
    """The real modules' loaders in place: with the JIT disabled and an empty workspace,
    building and planning wrappers on fake buffers and tracing every API works."""
    workspace = tmp_path / "workspace"
    run_python(
        "import torch\n"
        "from torch.fx.experimental.proxy_tensor import make_fx\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from tests.compile.test_wrapper_ops import CASES\n"
        "mode = FakeTensorMode()\n"
        "def new(*shape, dtype=torch.bfloat16):\n"
        "    with mode:\n"
        "        return torch.empty(*shape, dtype=dtype, device='cuda')\n"
        "for build in CASES.values():\n"
        "    case = build(new)\n"
        "    make_fx(case.fn, tracing_mode='fake')(*case.inputs)\n",
        env={"FLASHINFER_WORKSPACE_BASE": str(workspace), "FLASHINFER_DISABLE_JIT": "1"},
        cwd=REPO_ROOT,
    )
    assert not list(workspace.rglob("cached_ops"))


# -- the ops on CPU tensors, with stand-in modules ---------------------------------------------


class StandIns:
    """Stand-ins for the attention modules on the CPU. Each launch is recorded by name and
    writes outputs computed from its inputs and scalars (out = q * score_scale, lse = the
    launch's grid or chunk count, merges add), so eager and compiled calls can be compared
    and a stale scalar shows."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple[Any, ...]]] = []

    def module(self, *args: Any) -> StandIns:
        return self

    def _record(self, name: str, args: tuple[Any, ...], names: tuple[str, ...]) -> dict:
        self.launches.append((name, args))
        return dict(zip(names, args))

    def _attention(self, a: dict[str, Any], count: int) -> None:
        a["out"].copy_(a["q"] * a["score_scale"])
        if a["lse"] is not None:
            a["lse"].fill_(float(count))

    def batch_decode(self, *args: Any) -> None:
        a = self._record("batch_decode", args, DECODE_ARGS)
        self._attention(a, a["grid_work"])

    def single_decode(self, *args: Any) -> None:
        a = self._record("single_decode", args, SINGLE_DECODE_ARGS)
        self._attention(a, a["num_chunks"])

    def batch_prefill(self, *args: Any) -> None:
        a = self._record("batch_prefill", args, BATCH_PREFILL_ARGS)
        self._attention(a, a["grid_work"])

    def single_prefill(self, *args: Any) -> None:
        a = self._record("single_prefill", args, SINGLE_PREFILL_ARGS)
        self._attention(a, a["num_chunks"])

    def merge_state(self, v_a, s_a, v_b, s_b, v_out, s_out, mask, in_place) -> None:  # noqa: ANN001
        self.launches.append(("merge_state", (v_a, s_a, v_b, s_b, v_out, s_out, mask, in_place)))
        v_out.copy_(v_a + v_b)
        s_out.copy_(s_a + s_b)

    def merge_states(self, v, s, v_out, s_out) -> None:  # noqa: ANN001
        self.launches.append(("merge_states", (v, s, v_out, s_out)))
        v_out.copy_(v.sum(1))
        s_out.copy_(s.sum(1))


_DECODE_FUNCTIONS = gen_decode_module(DTYPE, HEAD_DIM).function_args  # names, by function
DECODE_ARGS = _DECODE_FUNCTIONS["batch_decode"]
SINGLE_DECODE_ARGS = _DECODE_FUNCTIONS["single_decode"]


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIns]:
    """CPU tensors through the ops into stand-in modules: a GPU of 64 CTAs and 2 SMs, the
    schedule written into the CPU int workspace, no device checks."""
    record = StandIns()
    for module, loader in (
        (decode_api, "get_decode_module"),
        (prefill_api, "get_prefill_module"),
        (cascade_api, "get_cascade_module"),
    ):
        monkeypatch.setattr(module, loader, record.module)
    for module in (decode_api, prefill_api):
        monkeypatch.setattr(module, "_max_ctas", lambda *args: 64)
        monkeypatch.setattr(module, "get_device_sm_count", lambda device: 2)
    monkeypatch.setattr(
        WorkspaceOwner,
        "_upload",
        lambda self, words, target: target.copy_(torch.tensor(words, dtype=torch.int32)),
    )
    monkeypatch.setattr(checks, "check_cuda", lambda *args, **kwargs: None)
    with cpu_kernels():
        yield record


def _cpu(*shape: int, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype)
    return torch.zeros(*shape, dtype=dtype)


class _Recorder(TorchDispatchMode):
    """The flashinfer op calls (op, args, kwargs) made while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func.namespace == "flashinfer":
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def _recorded_calls(case: Case) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    with _Recorder() as recorder:
        case.fn(*case.inputs)
    assert [func._schema.name for func, _, _ in recorder.calls] == case.ops
    return recorder.calls


def _as_tuple(value: Any) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("name", CASES)
def test_opcheck_on_cpu_stand_ins(stand_ins: StandIns, name: str) -> None:
    """The schema, the fake implementation and the functionalized (AOT) call agree with the
    real call for each op the API launches (here into the stand-ins)."""
    for func, args, kwargs in _recorded_calls(CASES[name](_cpu)):
        torch.library.opcheck(func, args, kwargs)


@pytest.mark.parametrize("name", CASES)
def test_compiled_call_matches_eager_on_cpu_stand_ins(stand_ins: StandIns, name: str) -> None:
    torch._dynamo.reset()
    case = CASES[name](_cpu)
    inputs = case.inputs
    eager = [t.clone() for t in _as_tuple(case.fn(*[t.clone() for t in inputs]))]
    eager_launches = len(stand_ins.launches)
    compiled = torch.compile(case.fn, fullgraph=True, backend="aot_eager")
    got = _as_tuple(compiled(*[t.clone() for t in inputs]))
    assert len(stand_ins.launches) == 2 * eager_launches
    assert len(got) == len(eager)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["decode_cuda_graph", "paged_prefill_cuda_graph"])
def test_a_compiled_run_follows_a_later_plan_without_recompiling(
    stand_ins: StandIns, name: str
) -> None:
    """CUDA-graph wrappers keep their buffers and capacities, so a new plan() of the same
    batch size is read by the compiled run as is: same graph, the new page table."""
    torch._dynamo.reset()
    case = CASES[name](_cpu)
    wrapper = case.wrapper
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(case.fn, fullgraph=True, backend=counter)
    compiled(*case.inputs)
    names = DECODE_ARGS if name == "decode_cuda_graph" else BATCH_PREFILL_ARGS
    first_words = dict(zip(names, stand_ins.launches[-1][1]))["plan"].clone()
    replan(wrapper)
    out, lse = compiled(*case.inputs)
    assert counter.frame_count == 1
    args = dict(zip(names, stand_ins.launches[-1][1]))
    assert args["kv_indptr"].tolist() == KV_INDPTR_2
    assert args["kv_last_page_len"].tolist() == KV_LAST_2
    assert args["kv_indices"][: len(KV_INDICES_2)].tolist() == KV_INDICES_2
    plan = wrapper._plan_info
    assert args["plan"].data_ptr() == plan.plan_words.data_ptr()
    assert torch.equal(args["plan"], plan.plan_words)
    assert not torch.equal(args["plan"], first_words)  # the new schedule, read as it is now
    assert (args["grid_work"], args["grid_merge"]) == (plan.grid_work, plan.grid_merge)
    assert torch.equal(lse, torch.full_like(lse, float(plan.grid_work)))


@pytest.mark.parametrize(
    "name", ["decode", "decode_tensor_cores", "paged_prefill", "ragged_prefill"]
)
def test_a_compiled_run_after_a_replan_matches_eager_on_cpu_stand_ins(
    stand_ins: StandIns, name: str
) -> None:
    """Without CUDA-graph mode a new plan() changes the schedule's sizes: the compiled run
    recompiles where its guards say so and launches what eager run() launches."""
    torch._dynamo.reset()
    case = CASES[name](_cpu)
    compiled = torch.compile(case.fn, fullgraph=True, backend="aot_eager")

    def scalars() -> list[Any]:  # of the last launch
        return [x for x in stand_ins.launches[-1][1] if not isinstance(x, torch.Tensor)]

    compiled(*case.inputs)
    first = scalars()
    replan(case.wrapper)
    eager = case.fn(*case.inputs)
    replanned = scalars()
    got = compiled(*case.inputs)
    assert scalars() == replanned != first
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


# -- on a GPU ----------------------------------------------------------------------------------


def _cuda(*shape: int, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype, device="cuda")
    return torch.zeros(*shape, dtype=dtype, device="cuda")


def _cuda_case(name: str) -> Case:
    torch.manual_seed(0)
    case = CASES[name](_cuda)
    if name.startswith("merge"):  # LSEs of real states: finite, log2 of sums of exp
        case.inputs = tuple(t if t.dtype != torch.float32 else t.abs() * 4 for t in case.inputs)
    return case


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_opcheck_every_op(name: str) -> None:
    for func, args, kwargs in _recorded_calls(_cuda_case(name)):
        torch.library.opcheck(func, args, kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_compiled_call_matches_eager(name: str) -> None:
    torch._dynamo.reset()
    case = _cuda_case(name)
    eager = [t.clone() for t in _as_tuple(case.fn(*[t.clone() for t in case.inputs]))]
    compiled = torch.compile(case.fn, fullgraph=True)
    got = _as_tuple(compiled(*[t.clone() for t in case.inputs]))
    assert len(got) == len(eager)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["decode", "paged_prefill", "ragged_prefill"])
def test_compiled_run_after_a_replan_matches_eager(name: str) -> None:
    """A new plan() of other lengths (the same batch size) between two compiled runs: the
    compiled run reads the wrapper's state anew (recompiling where the shapes changed)."""
    torch._dynamo.reset()
    case = _cuda_case(name)
    compiled = torch.compile(case.fn, fullgraph=True)
    compiled(*case.inputs)
    replan(case.wrapper)
    eager = case.fn(*case.inputs)
    got = compiled(*case.inputs)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_graph_replay_of_decode_after_a_new_plan_matches_eager() -> None:
    torch.manual_seed(0)
    graph_case = decode_case(_cuda, cuda_graph=True)
    eager_case = decode_case(_cuda)
    wrapper, eager_wrapper = graph_case.wrapper, eager_case.wrapper
    q, k, v = graph_case.inputs
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, (k, v), out=out, lse=lse)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    wrapper.run(q, (k, v), out=out, lse=lse)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, (k, v), out=out, lse=lse)
    for tables in (
        (KV_INDPTR, KV_INDICES, KV_LAST),
        (KV_INDPTR_2, KV_INDICES_2, KV_LAST_2),
        ([0, 38, 39, 40], list(range(40)), [16, 3, 16]),
    ):
        args = (*map(_i32, tables), HEADS, KV_HEADS, HEAD_DIM, PAGE)
        wrapper.plan(*args, q_data_type=DTYPE)
        eager_wrapper.plan(*args, q_data_type=DTYPE)
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        want, want_lse = eager_wrapper.run(q, (k, v), return_lse=True)
        torch.testing.assert_close(out, want, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(lse, want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
def test_a_traced_run_leaves_the_alignment_check_to_the_op() -> None:
    """Eager run() reports a misaligned q itself; a compiled one cannot see addresses while
    tracing, and the launch refuses it with the same message."""
    torch._dynamo.reset()
    case = _cuda_case("paged_prefill")
    _, k, v = case.inputs
    base = torch.randn(7 * HEADS * HEAD_DIM + 8, dtype=DTYPE, device="cuda")
    q = base.narrow(0, 1, 7 * HEADS * HEAD_DIM).view(7, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        case.wrapper.run(q, (k, v))
    compiled = torch.compile(
        lambda q: case.wrapper.run(q, (k, v)), fullgraph=True, backend="aot_eager"
    )
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        compiled(q)
