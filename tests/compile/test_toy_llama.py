"""A toy Llama (flashinfer/testing/toy_llama.py) through the kernels as custom ops.

On the CPU, with fake CUDA tensors: a decode step of the model (norms, RoPE from a cos/sin
cache, paged append, the decode wrapper's run, MLP, softmax and sampling) traces into a graph
whose kernel calls are exactly the expected ``torch.ops.flashinfer.*`` nodes, with no module
built or loaded, and dynamo captures it in one graph (``fullgraph=True``). The host
bookkeeping (pages, plan and append arguments) is checked against hand-worked values and the
library's own index helpers.

On a GPU: prefill plus 16 greedy decode steps against the plain-torch model (teacher
forced), torch.compile(fullgraph=True) and a CUDA-graph replay of the step against eager,
and sampling under a CUDA graph drawing anew at each replay.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import flashinfer
from flashinfer.testing.toy_llama import (
    WORKSPACE_BYTES,
    PagedSession,
    PageTable,
    StepPlan,
    ToyLlama,
    ToyLlamaConfig,
    random_weights,
    reference_logits,
)
from tests.compile.test_function_ops import no_modules  # noqa: F401 - a fixture
from tests.compile.test_wrapper_ops import New, fake  # noqa: F401 - a fixture
from tests.conftest import REPO_ROOT

CONFIG = ToyLlamaConfig()
LAYERS = CONFIG.num_layers
# The kernel launches of one decode step: the first layer's input norm is a plain rmsnorm
# (no residual yet); the other input norms, every post-attention norm and the final norm add
# the residual.
STEP_OPS = Counter(
    {
        "flashinfer::rmsnorm": 1,
        "flashinfer::fused_add_rmsnorm": 2 * LAYERS,
        "flashinfer::apply_rope_with_cos_sin_cache_inplace": LAYERS,
        "flashinfer::append_paged_kv_cache": LAYERS,
        "flashinfer::batch_decode_with_paged_kv_cache": LAYERS,
        "flashinfer::silu_and_mul": LAYERS,
        "flashinfer::softmax": 1,
        "flashinfer::sampling_from_probs": 1,
    }
)
# Prompts of the GPU tests: lengths below, at and across the page size (16).
PROMPTS = [[(7 * i + 3) % CONFIG.vocab_size for i in range(n)] for n in (5, 16, 17, 30)]
STEPS = 16
NUM_PAGES = 24  # 4 requests of at most 46 tokens: 3 pages each, and spare pages
# Logits are float32 of unit scale; the kernel path runs in float16 (activations and KV).
LOGITS_ATOL, LOGITS_RTOL = 5e-2, 2e-2
CLEAR_MARGIN = 0.1  # a top-2 logit gap the float16 path cannot flip


def _flashinfer_ops(graph: torch.fx.Graph) -> Counter[str]:
    return Counter(
        node.target._schema.name
        for node in graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.namespace == "flashinfer"
    )


def _fake_step(new: New) -> tuple[Any, tuple[Any, ...]]:
    """The model's decode step over fake CUDA weights, cache and buffers, for three requests
    after prompts of 5, 16 and 17 tokens, with a decode wrapper planned from the page
    table's plan (host tensors) on a fake workspace."""
    model = ToyLlama(CONFIG, random_weights(CONFIG).apply(lambda t: new(*t.shape, dtype=t.dtype)))
    table = PageTable(3, CONFIG.page_size, 8)
    table.append([5, 16, 17])
    plan = table.append([1, 1, 1])
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(new(WORKSPACE_BYTES, dtype=torch.uint8))
    wrapper.plan(
        plan.kv_indptr,
        plan.kv_indices,
        plan.kv_last_page_len,
        CONFIG.num_heads,
        CONFIG.num_kv_heads,
        CONFIG.head_dim,
        CONFIG.page_size,
        q_data_type=CONFIG.dtype,
    )
    c = CONFIG
    caches = tuple(
        new(8, 2, c.page_size, c.num_kv_heads, c.head_dim, dtype=c.dtype)
        for _ in range(c.num_layers)
    )
    i32 = torch.int32
    inputs = (
        new(3, dtype=i32),  # tokens
        new(3, dtype=i32),  # positions
        new(3, dtype=i32),  # batch_indices
        caches,  # one a layer
        new(8, dtype=i32),  # kv_indices
        new(4, dtype=i32),  # kv_indptr
        new(3, dtype=i32),  # kv_last_page_len
    )

    def step(*tensors: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return model.decode_step(*tensors, wrapper)

    return step, inputs


def test_a_decode_step_traces_into_flashinfer_ops_with_nothing_built(
    fake: New,  # noqa: F811
    no_modules: None,  # noqa: F811
) -> None:
    step, inputs = _fake_step(fake)
    graph = make_fx(step, tracing_mode="fake")(*inputs).graph
    assert _flashinfer_ops(graph) == STEP_OPS
    (output,) = [node for node in graph.nodes if node.op == "output"]
    tokens, logits = (node.meta["val"] for node in output.args[0])
    assert (tuple(tokens.shape), tokens.dtype) == ((3,), torch.int32)
    assert (tuple(logits.shape), logits.dtype) == ((3, CONFIG.vocab_size), torch.float32)


def test_dynamo_captures_a_decode_step_in_one_graph(
    fake: New,  # noqa: F811
    no_modules: None,  # noqa: F811
) -> None:
    """fullgraph=True: a graph break would raise. The backend only records the graph and
    runs it on the fake tensors."""
    torch._dynamo.reset()
    step, inputs = _fake_step(fake)
    mode = torch._guards.detect_fake_mode(inputs)
    graphs: list[torch.fx.GraphModule] = []

    def record(module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(module)

        def run(*args: Any) -> Any:
            with mode:
                return module(*args)

        return run

    torch.compile(step, fullgraph=True, backend=record)(*inputs)
    (graph,) = graphs
    assert _flashinfer_ops(graph.graph) == STEP_OPS


def test_the_quickstart_demo_traces_the_model_with_nothing_built(
    no_modules: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scripts/quickstart_demo.py's no-GPU path traces a prefill and a decode step over fake
    CUDA tensors into the ops whose modules it then builds: the README's first command."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import quickstart_demo

    ops = quickstart_demo._traced_ops(CONFIG)
    decode_ops = {op.removeprefix("flashinfer::") for op in STEP_OPS}
    assert sorted(ops) == sorted(decode_ops | {"batch_prefill_with_kv_cache"})


# -- host bookkeeping -----------------------------------------------------------------------


def _lists(plan: StepPlan) -> dict[str, list[int]]:
    return {name: getattr(plan, name).tolist() for name in plan.__dataclass_fields__}


def test_the_page_table_plans_a_prefill_and_decode_steps() -> None:
    """Pages of 4 from a pool of 8, handed out from the top: prompts of 3, 4 and 5 tokens,
    then two decode steps (request 1 opens a page at the first, request 0 at the second)."""
    table = PageTable(3, 4, 8)
    assert _lists(table.append([3, 4, 5])) == {
        "qo_indptr": [0, 3, 7, 12],
        "kv_indptr": [0, 1, 2, 4],
        "kv_indices": [7, 6, 5, 4],
        "kv_last_page_len": [3, 4, 1],
        "batch_indices": [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2],
        "positions": [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4],
    }
    assert _lists(table.append([1, 1, 1])) == {
        "qo_indptr": [0, 1, 2, 3],
        "kv_indptr": [0, 1, 3, 5],
        "kv_indices": [7, 6, 3, 5, 4],
        "kv_last_page_len": [4, 1, 2],
        "batch_indices": [0, 1, 2],
        "positions": [3, 4, 5],
    }
    assert _lists(table.append([1, 1, 1]))["kv_indices"] == [7, 2, 6, 3, 5, 4]
    assert table.lengths == [5, 6, 7] and table.free == [0, 1]


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_the_page_table_agrees_with_the_library_index_helpers(page_size: int) -> None:
    """Over a prefill and decode steps, the lengths the plan's page table encodes and the
    append's (request, position) per token are those get_seq_lens and
    get_batch_indices_positions compute from it."""
    table = PageTable(4, page_size, 64)
    for counts in ([9, 1, 16, 4], [1, 1, 1, 1], [2, 0, 5, 1], [1, 1, 1, 1]):
        plan = table.append(counts)
        seq_lens = flashinfer.get_seq_lens(plan.kv_indptr, plan.kv_last_page_len, page_size)
        assert seq_lens.tolist() == table.lengths
        batch_indices, positions = flashinfer.get_batch_indices_positions(
            plan.qo_indptr, seq_lens, sum(counts)
        )
        assert batch_indices.tolist() == plan.batch_indices.tolist()
        assert positions.tolist() == plan.positions.tolist()
        pages = plan.kv_indices.tolist()
        assert len(set(pages)) == len(pages)  # no page owned twice


def test_the_page_table_refuses_to_run_out_of_pages() -> None:
    table = PageTable(2, 4, 3)
    table.append([8, 4])
    with pytest.raises(RuntimeError, match="out of KV pages: request 1 needs 1 more"):
        table.append([0, 1])
    with pytest.raises(ValueError, match="counts has 1 entries, batch_size is 2"):
        table.append([1])


def test_the_decode_wrapper_accepts_the_plan_of_every_step(fake: New) -> None:  # noqa: F811
    """Each step's plan arguments pass plan()'s checks (page-table shapes, last page lengths
    within the page size) for a CUDA-graph wrapper of the batch's fixed buffers."""
    i32 = torch.int32
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        fake(WORKSPACE_BYTES, dtype=torch.uint8),
        use_cuda_graph=True,
        paged_kv_indptr_buffer=fake(5, dtype=i32),
        paged_kv_indices_buffer=fake(NUM_PAGES, dtype=i32),
        paged_kv_last_page_len_buffer=fake(4, dtype=i32),
    )
    table = PageTable(4, CONFIG.page_size, NUM_PAGES)
    table.append([len(p) for p in PROMPTS])
    for _ in range(STEPS):
        plan = table.append([1] * 4)
        wrapper.plan(
            plan.kv_indptr,
            plan.kv_indices,
            plan.kv_last_page_len,
            CONFIG.num_heads,
            CONFIG.num_kv_heads,
            CONFIG.head_dim,
            CONFIG.page_size,
            q_data_type=CONFIG.dtype,
        )
        assert wrapper._plan_info.batch == 4


# -- GPU ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> ToyLlama:
    return ToyLlama(CONFIG, random_weights(CONFIG, seed=0).apply(lambda t: t.to("cuda")))


def _session(model: ToyLlama, use_cuda_graph: bool = True) -> PagedSession:
    return PagedSession(model, len(PROMPTS), NUM_PAGES, use_cuda_graph=use_cuda_graph)


def _top2_margin(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


@pytest.mark.gpu
def test_greedy_generation_matches_the_plain_torch_model(model: ToyLlama) -> None:
    """Teacher forced: the torch model reads each prompt and the tokens our path chose; at
    every step the logits agree, and our token is the torch argmax wherever the torch top-2
    gap is clear."""
    out = _session(model, use_cuda_graph=False).generate(PROMPTS, STEPS)
    assert out.tokens.shape == (len(PROMPTS), STEPS + 1)
    clear = 0
    for b, prompt in enumerate(PROMPTS):
        chosen = out.tokens[b].tolist()
        want = reference_logits(model, prompt + chosen[:-1])[len(prompt) - 1 :]
        torch.testing.assert_close(out.logits[b], want, atol=LOGITS_ATOL, rtol=LOGITS_RTOL)
        decisive = _top2_margin(want) > CLEAR_MARGIN
        assert torch.equal(out.tokens[b][decisive], want.argmax(-1).int()[decisive])
        clear += int(decisive.sum())
    assert clear >= len(PROMPTS) * (STEPS + 1) // 4  # not vacuous (about 70% expected)


def _lockstep(model: ToyLlama, step: Any, cuda_graph: bool) -> None:
    """Two sessions over the same prompts, fed the same tokens (eager's) at every step: one
    eager, one through ``step`` (compiled) or a CUDA graph; same logits and tokens."""
    eager, other = _session(model), _session(model)
    torch.testing.assert_close(other.prefill(PROMPTS), eager.prefill(PROMPTS), atol=1e-5, rtol=1e-5)
    tokens = torch.tensor([p[-1] for p in PROMPTS], dtype=torch.int32, device="cuda")
    replay = None
    for _ in range(STEPS):
        for session in (eager, other):
            session.tokens.copy_(tokens)
            session.plan_decode()
        if cuda_graph and replay is None:
            replay = other.capture()[1]
        want_tokens, want = eager.step()
        got_tokens, got = replay() if replay else other.step(step)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        decisive = _top2_margin(want) > 1e-2
        assert torch.equal(got_tokens[decisive], want_tokens[decisive])
        assert torch.equal(want_tokens[decisive], want.argmax(-1).int()[decisive])  # greedy
        tokens = want_tokens.clone()


@pytest.mark.gpu
def test_a_compiled_decode_step_matches_eager(model: ToyLlama) -> None:
    torch._dynamo.reset()
    _lockstep(model, torch.compile(model.decode_step, fullgraph=True), cuda_graph=False)


@pytest.mark.gpu
def test_a_cuda_graph_of_the_decode_step_replays_like_eager(model: ToyLlama) -> None:
    _lockstep(model, None, cuda_graph=True)


@pytest.mark.gpu
def test_sampling_in_a_captured_step_draws_anew_at_each_replay(model: ToyLlama) -> None:
    """top_k = vocab: a real draw. Replays of the same step give the same logits and, from
    nearly flat distributions over 512 tokens, new tokens."""
    session = _session(model)
    session.prefill(PROMPTS)
    session.tokens.copy_(torch.tensor([p[-1] for p in PROMPTS], dtype=torch.int32))
    session.plan_decode()
    _, replay = session.capture(top_k=CONFIG.vocab_size)
    draws, logits = [], []
    for _ in range(3):
        tokens, step_logits = replay()
        draws.append(tokens.clone())
        logits.append(step_logits.clone())
    torch.cuda.synchronize()
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[1], logits[2])
    assert all(((d >= 0) & (d < CONFIG.vocab_size)).all() for d in draws)
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
