"""A toy Llama run through this library's kernels, and the same model in plain torch.

It exists to show, and to test, that a real model's step traces, compiles and replays in a
CUDA graph through the kernel APIs: embedding (torch), ``rmsnorm`` / ``fused_add_rmsnorm``,
q/k/v and o projections (torch), RoPE from a cos/sin cache, ``append_paged_kv_cache``,
attention through the paged prefill and decode wrappers, a ``silu_and_mul`` MLP, the final
norm, a float32 lm head and ``top_k_top_p_sampling_from_logits`` (``top_k=1``: greedy).

- :class:`ToyLlama` holds the weights; :meth:`ToyLlama.decode_step` is the block that tests
  trace, compile and capture: one token per request, a paged cache, a planned wrapper,
  nothing read on the host.
- :class:`PageTable` is the host bookkeeping: which pages each request owns, and the plan
  and append arguments of a step (:class:`StepPlan`).
- :class:`PagedSession` drives a batch: the cache, the wrappers, the fixed device buffers
  a captured step reads, prefill and decode steps.
- :func:`reference_logits` is the same model in float32 torch with a dense causal KV: the
  check of the kernel path.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

import flashinfer

WORKSPACE_BYTES = 32 << 20
Step = Callable[[], tuple[torch.Tensor, torch.Tensor]]  # -> (next tokens, logits)


@dataclass(frozen=True)
class ToyLlamaConfig:
    num_layers: int = 2
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 512
    page_size: int = 16
    max_positions: int = 512  # rows of the cos/sin cache
    rope_theta: float = 1e4
    eps: float = 1e-5
    dtype: torch.dtype = torch.float16


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    q: torch.Tensor  # [hidden, heads * head_dim]
    k: torch.Tensor  # [hidden, kv_heads * head_dim]
    v: torch.Tensor  # [hidden, kv_heads * head_dim]
    o: torch.Tensor  # [heads * head_dim, hidden]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [hidden, 2 * intermediate]: gate, then up
    down: torch.Tensor  # [intermediate, hidden]


@dataclass
class ToyLlamaWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [hidden, vocab], float32
    cos_sin_cache: torch.Tensor  # [max_positions, head_dim], float32: cos half, sin half

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ToyLlamaWeights:
        """A copy with ``fn`` applied to every tensor (to move it, or to make it fake)."""
        layers = [
            LayerWeights(**{f.name: fn(getattr(layer, f.name)) for f in fields(LayerWeights)})
            for layer in self.layers
        ]
        return ToyLlamaWeights(
            fn(self.embed), layers, fn(self.final_norm), fn(self.lm_head), fn(self.cos_sin_cache)
        )


def random_weights(config: ToyLlamaConfig, seed: int = 0) -> ToyLlamaWeights:
    """Random CPU weights from ``seed`` (the same on every machine): projections scaled by
    1/sqrt(fan-in) so activations stay near unit scale, norm weights near 1."""
    generator = torch.Generator().manual_seed(seed)
    c = config

    def matrix(rows: int, cols: int, dtype: torch.dtype = c.dtype) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator) / math.sqrt(rows)).to(dtype)

    def norm() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(c.hidden_size, generator=generator)).to(c.dtype)

    layers = [
        LayerWeights(
            input_norm=norm(),
            q=matrix(c.hidden_size, c.num_heads * c.head_dim),
            k=matrix(c.hidden_size, c.num_kv_heads * c.head_dim),
            v=matrix(c.hidden_size, c.num_kv_heads * c.head_dim),
            o=matrix(c.num_heads * c.head_dim, c.hidden_size),
            post_norm=norm(),
            gate_up=matrix(c.hidden_size, 2 * c.intermediate_size),
            down=matrix(c.intermediate_size, c.hidden_size),
        )
        for _ in range(c.num_layers)
    ]
    half = c.head_dim // 2
    inv_freq = c.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(c.max_positions, dtype=torch.float64)[:, None] * inv_freq
    return ToyLlamaWeights(
        embed=torch.randn(c.vocab_size, c.hidden_size, generator=generator).to(c.dtype),
        layers=layers,
        final_norm=norm(),
        lm_head=matrix(c.hidden_size, c.vocab_size, torch.float32),
        cos_sin_cache=torch.cat([angles.cos(), angles.sin()], -1).float(),
    )


class ToyLlama:
    """The model on this library's kernels (weights and inputs on a CUDA device, real or
    fake). The KV cache is ``[num_layers, num_pages, 2, page_size, num_kv_heads, head_dim]``
    (a 5-D NHD cache per layer)."""

    def __init__(self, config: ToyLlamaConfig, weights: ToyLlamaWeights) -> None:
        self.config = config
        self.weights = weights

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        batch_indices: torch.Tensor,
        kv_caches: Sequence[torch.Tensor],
        kv_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        attention: Any,
    ) -> torch.Tensor:
        """float32 logits ``[n, vocab]`` of ``n`` tokens (token i of request
        ``batch_indices[i]`` at ``positions[i]``), their keys and values appended to the
        cache under the page table (which must cover them), ``attention`` a planned prefill
        or decode wrapper of that table."""
        c, w = self.config, self.weights
        n = tokens.shape[0]
        hidden = torch.nn.functional.embedding(tokens, w.embed)
        residual = hidden
        for i, layer in enumerate(w.layers):
            if i == 0:
                hidden = flashinfer.rmsnorm(residual, layer.input_norm, c.eps)
            else:
                flashinfer.fused_add_rmsnorm(hidden, residual, layer.input_norm, c.eps)
            q, k, v = hidden @ layer.q, hidden @ layer.k, hidden @ layer.v
            flashinfer.apply_rope_with_cos_sin_cache_inplace(
                positions, q, k, c.head_dim, w.cos_sin_cache
            )
            cache = kv_caches[i]
            k, v = (t.view(n, c.num_kv_heads, c.head_dim) for t in (k, v))
            flashinfer.append_paged_kv_cache(
                k, v, batch_indices, positions, cache, kv_indices, kv_indptr, kv_last_page_len
            )
            out = attention.run(q.view(n, c.num_heads, c.head_dim), cache)
            hidden = out.view(n, -1) @ layer.o
            flashinfer.fused_add_rmsnorm(hidden, residual, layer.post_norm, c.eps)
            hidden = flashinfer.silu_and_mul(hidden @ layer.gate_up) @ layer.down
        flashinfer.fused_add_rmsnorm(hidden, residual, w.final_norm, c.eps)
        return hidden.float() @ w.lm_head

    def decode_step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        batch_indices: torch.Tensor,
        kv_caches: Sequence[torch.Tensor],
        kv_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper,
        top_k: int = 1,
        top_p: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per request through a planned decode wrapper: (next tokens int32
        ``[batch]``, float32 logits ``[batch, vocab]``). Launches only: traceable,
        compilable with ``fullgraph=True`` and capturable in a CUDA graph."""
        logits = self.forward(
            tokens,
            positions,
            batch_indices,
            kv_caches,
            kv_indices,
            kv_indptr,
            kv_last_page_len,
            wrapper,
        )
        return self.sample(logits, top_k, top_p), logits

    @staticmethod
    def sample(logits: torch.Tensor, top_k: int = 1, top_p: float = 1.0) -> torch.Tensor:
        return flashinfer.top_k_top_p_sampling_from_logits(logits, top_k, top_p)


@dataclass
class StepPlan:
    """Host (CPU, int32) arguments of one step that appends ``counts[b]`` tokens to each
    request: the wrappers' plan arguments and the append's per-token request and position
    (tokens in request order)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor


@dataclass
class PageTable:
    """Which pages each request owns. Pages are handed out from the top of the pool down,
    as requests grow, so a request's pages are neither contiguous nor ascending."""

    batch_size: int
    page_size: int
    num_pages: int
    pages: list[list[int]] = field(init=False)
    lengths: list[int] = field(init=False)
    free: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.pages = [[] for _ in range(self.batch_size)]
        self.lengths = [0] * self.batch_size
        self.free = list(range(self.num_pages))

    def append(self, counts: list[int]) -> StepPlan:
        """Grow request b by ``counts[b]`` tokens (allocating pages) and plan that step."""
        if len(counts) != self.batch_size:
            raise ValueError(f"counts has {len(counts)} entries, batch_size is {self.batch_size}")
        before = list(self.lengths)
        for b, count in enumerate(counts):
            self.lengths[b] += count
            needed = -(-self.lengths[b] // self.page_size) - len(self.pages[b])
            if needed > len(self.free):
                raise RuntimeError(f"out of KV pages: request {b} needs {needed} more")
            for _ in range(needed):
                self.pages[b].append(self.free.pop())
        i32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
        return StepPlan(
            qo_indptr=i32([0, *itertools.accumulate(counts)]),
            kv_indptr=i32([0, *itertools.accumulate(len(p) for p in self.pages)]),
            kv_indices=i32([page for pages in self.pages for page in pages]),
            kv_last_page_len=i32([(n - 1) % self.page_size + 1 if n else 0 for n in self.lengths]),
            batch_indices=i32([b for b, count in enumerate(counts) for _ in range(count)]),
            positions=i32([p for b, n in enumerate(self.lengths) for p in range(before[b], n)]),
        )


class PagedSession:
    """One batch generating on a CUDA device: the paged cache, a prefill and a decode
    wrapper, and the fixed device buffers :meth:`step` reads (tokens, positions, page
    table), which :meth:`plan_decode` rewrites in place, so a captured step replays
    correctly after it. ``use_cuda_graph`` builds the decode wrapper in CUDA-graph mode
    over those buffers."""

    def __init__(
        self,
        model: ToyLlama,
        batch_size: int,
        num_pages: int,
        device: torch.device | str = "cuda",
        use_cuda_graph: bool = False,
    ) -> None:
        c = model.config
        self.model = model
        self.table = PageTable(batch_size, c.page_size, num_pages)
        # one tensor a layer, not views of one: a compiled graph with dynamic shapes loses
        # writes made through several select() views of one graph input (torch 2.11-2.13)
        shape = (num_pages, 2, c.page_size, c.num_kv_heads, c.head_dim)
        self.kv_caches = tuple(
            torch.zeros(shape, dtype=c.dtype, device=device) for _ in range(c.num_layers)
        )
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

        def i32(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.int32, device=device)

        self.tokens, self.positions = i32(batch_size), i32(batch_size)
        self.batch_indices = torch.arange(batch_size, dtype=torch.int32, device=device)
        self.kv_indptr, self.kv_indices = i32(batch_size + 1), i32(num_pages)
        self.kv_last_page_len = i32(batch_size)
        buffers = (
            dict(
                paged_kv_indptr_buffer=self.kv_indptr,
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len,
            )
            if use_cuda_graph
            else {}
        )
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, use_cuda_graph=use_cuda_graph, **buffers
        )
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace)

    def _upload(self, plan: StepPlan) -> None:
        self.kv_indptr.copy_(plan.kv_indptr)
        self.kv_indices.narrow(0, 0, plan.kv_indices.shape[0]).copy_(plan.kv_indices)
        self.kv_last_page_len.copy_(plan.kv_last_page_len)

    def _heads(self) -> tuple[int, int, int, int]:
        c = self.model.config
        return c.num_heads, c.num_kv_heads, c.head_dim, c.page_size

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Append the prompts (one per request, non-empty) and return the float32 logits of
        each one's last token, ``[batch, vocab]``."""
        plan = self.table.append([len(p) for p in prompts])
        self._upload(plan)
        self.prefill_wrapper.plan(
            plan.qo_indptr,
            plan.kv_indptr,
            plan.kv_indices,
            plan.kv_last_page_len,
            *self._heads(),
            causal=True,
            q_data_type=self.model.config.dtype,
        )
        device = self.kv_caches[0].device
        logits = self.model.forward(
            torch.tensor([t for p in prompts for t in p], dtype=torch.int32, device=device),
            plan.positions.to(device),
            plan.batch_indices.to(device),
            self.kv_caches,
            self.kv_indices,
            self.kv_indptr,
            self.kv_last_page_len,
            self.prefill_wrapper,
        )
        return logits.index_select(0, (plan.qo_indptr[1:] - 1).to(device))

    def plan_decode(self) -> StepPlan:
        """Host side of a decode step: one more token per request, page table and positions
        written into the fixed buffers, the decode wrapper planned."""
        plan = self.table.append([1] * self.table.batch_size)
        self._upload(plan)
        self.positions.copy_(plan.positions)
        self.decode_wrapper.plan(
            plan.kv_indptr,
            plan.kv_indices,
            plan.kv_last_page_len,
            *self._heads(),
            q_data_type=self.model.config.dtype,
        )
        return plan

    def step(
        self, decode_step: Callable[..., Any] | None = None, top_k: int = 1, top_p: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode_step`` (default the model's; or a compiled one) on the fixed buffers."""
        fn = decode_step or self.model.decode_step
        return fn(
            self.tokens,
            self.positions,
            self.batch_indices,
            self.kv_caches,
            self.kv_indices,
            self.kv_indptr,
            self.kv_last_page_len,
            self.decode_wrapper,
            top_k,
            top_p,
        )

    def capture(self, top_k: int = 1, top_p: float = 1.0) -> tuple[torch.cuda.CUDAGraph, Step]:
        """A CUDA graph of :meth:`step` (after :meth:`plan_decode`; it runs the planned step
        once outside the capture, on a side stream, so modules load there), and a callable
        that replays it and returns its output tensors."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.step(top_k=top_k, top_p=top_p)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.step(top_k=top_k, top_p=top_p)

        def replay() -> tuple[torch.Tensor, torch.Tensor]:
            graph.replay()
            return outputs

        return graph, replay

    def generate(
        self,
        prompts: list[list[int]],
        steps: int,
        decode_step: Callable[..., Any] | None = None,
        cuda_graph: bool = False,
    ) -> Generation:
        """Greedy: the prompts' prefill picks token 0, then ``steps`` decode steps pick one
        each, through ``decode_step`` (default the model's; or a compiled one), or through a
        CUDA graph of the step captured at the first step and replayed from then on."""
        logits = self.prefill(prompts)
        tokens = self.model.sample(logits)
        chosen, seen = [tokens.clone()], [logits.clone()]
        replay: Step | None = None
        start = 0.0
        for i in range(steps):
            if i == 1:  # time from the second step: the first compiles or captures
                torch.cuda.synchronize()
                start = time.perf_counter()
            self.tokens.copy_(tokens)
            self.plan_decode()
            if cuda_graph and replay is None:
                replay = self.capture()[1]
            tokens, logits = replay() if replay else self.step(decode_step)
            chosen.append(tokens.clone())
            seen.append(logits.clone())
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start if steps > 1 else 0.0
        return Generation(torch.stack(chosen, 1), torch.stack(seen, 1), seconds)


@dataclass
class Generation:
    """What :meth:`PagedSession.generate` produced: tokens ``[batch, steps + 1]`` (the
    prefill's, then one per decode step), the float32 logits that chose them ``[batch,
    steps + 1, vocab]``, and the seconds decode steps 2 to ``steps`` took."""

    tokens: torch.Tensor
    logits: torch.Tensor
    seconds: float

    def tokens_per_second(self) -> float:
        timed = self.tokens.shape[0] * (self.tokens.shape[1] - 2)
        return timed / self.seconds if self.seconds > 0 else math.nan


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE of ``x`` ``[n, heads, dim]`` (halves rotated together)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def reference_logits(model: ToyLlama, tokens: list[int]) -> torch.Tensor:
    """The plain-torch model: float32 logits ``[len(tokens), vocab]`` of one sequence, every
    position attending causally to a dense KV (same weights, float32 math throughout)."""
    c, w = model.config, model.weights
    device = w.embed.device
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    n, half = len(tokens), c.head_dim // 2
    rows = w.cos_sin_cache.index_select(0, torch.arange(n, device=device))[:, None, :]
    cos, sin = rows[..., :half], rows[..., half:]
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    group = c.num_heads // c.num_kv_heads
    residual = w.embed.float()[ids]
    for layer in w.layers:
        x = _rmsnorm(residual, layer.input_norm, c.eps)
        q, k, v = x @ layer.q.float(), x @ layer.k.float(), x @ layer.v.float()
        q = _rope(q.view(n, c.num_heads, c.head_dim), cos, sin)
        k = _rope(k.view(n, c.num_kv_heads, c.head_dim), cos, sin)
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v.view(k.shape)))
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim)
        probs = scores.masked_fill(~mask, -math.inf).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
        residual = residual + attn @ layer.o.float()
        x = _rmsnorm(residual, layer.post_norm, c.eps) @ layer.gate_up.float()
        gate, up = x.chunk(2, dim=-1)
        residual = residual + (torch.nn.functional.silu(gate) * up) @ layer.down.float()
    return _rmsnorm(residual, w.final_norm, c.eps) @ w.lm_head
