"""MultiLevelCascadeAttentionWrapper: argument checks (all raised before any launch), how the
levels are planned and run, and the result against flat attention over each request's
concatenated keys. On the CPU, stand-in prefill and cascade modules compute what the kernels
compute (float64, from the launch's arguments); the GPU tests run the real kernels against a
float64 torch reference and against one BatchPrefillWithPagedKVCacheWrapper over the
concatenated pages."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from flashinfer import cascade as cascade_api
from flashinfer import prefill as prefill_api
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper as Cascade
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.testing import reference
from tests.ops.attention_error import assert_output_close
from tests.ops.test_prefill import BATCH_ARGS, cpu_prefill  # noqa: F401 - the fixture

LN2 = math.log(2)
NAN = float("nan")

# -- building a cascade batch -------------------------------------------------------------------

# A level is a list of nodes ``(requests, kv_len)``: the next ``requests`` requests (in order)
# share ``kv_len`` keys at that level; the top level has one node over the whole batch.
Level = list[tuple[int, int]]


@dataclass(frozen=True)
class CascadeBatch:
    """Each level's page table (CPU int32 ``qo_indptr, kv_indptr, indices, last_page_len``)
    over one pool of shuffled pages, and each request's ``(page ids, kv_len)`` per level."""

    qo_lens: list[int]
    tables: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    segments: list[list[tuple[torch.Tensor, int]]]

    @property
    def total_q(self) -> int:
        return sum(self.qo_lens)

    def used_pages(self) -> torch.Tensor:
        return torch.cat([table[2] for table in self.tables]).long()

    def flat_table(self, page_size: int) -> tuple[torch.Tensor, ...]:
        """One page table of each request's pages of every level, in level order (every
        level but the last fills its pages, so the pages concatenate to the keys)."""
        indptr, indices, last = [0], [], []
        for segments in self.segments:
            assert all(n % page_size == 0 for _, n in segments[:-1])
            ids = torch.cat([ids for ids, _ in segments])
            indptr.append(indptr[-1] + ids.numel())
            indices.append(ids)
            last.append(segments[-1][1] - (segments[-1][0].numel() - 1) * page_size)
        return (_i32(_offsets(self.qo_lens)), _i32(indptr), torch.cat(indices), _i32(last))


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def build_cascade(
    qo_lens: list[int], levels: list[Level], page_size: int, num_pages: int, seed: int = 0
) -> CascadeBatch:
    pool = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    pool = pool.to(torch.int32)
    used = 0
    tables = []
    segments: list[list[tuple[torch.Tensor, int]]] = [[] for _ in qo_lens]
    for level in levels:
        assert sum(requests for requests, _ in level) == len(qo_lens)
        node_qo, kv_indptr, indices, last = [], [0], [], []
        first = 0
        for requests, kv_len in level:
            pages = math.ceil(kv_len / page_size)
            ids = pool[used : used + pages]
            used += pages
            assert ids.numel() == pages, "the page pool is too small"
            node_qo.append(sum(qo_lens[first : first + requests]))
            kv_indptr.append(kv_indptr[-1] + pages)
            indices.append(ids)
            last.append(kv_len - (pages - 1) * page_size if pages else 0)
            for r in range(first, first + requests):
                segments[r].append((ids, kv_len))
            first += requests
        tables.append((_i32(_offsets(node_qo)), _i32(kv_indptr), torch.cat(indices), _i32(last)))
    return CascadeBatch(qo_lens, tables, segments)


def request_kv(cache: torch.Tensor, segments: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """A request's keys (or values) of every level, concatenated: ``[kv_len, Hk, D]`` from
    an NHD ``[num_pages, page_size, Hk, D]`` cache."""
    parts = [
        cache[ids.long().to(cache.device)].reshape(-1, *cache.shape[2:])[:n] for ids, n in segments
    ]
    return torch.cat(parts)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """The output of :func:`flashinfer.testing.reference.attention` (the one reference)."""
    return reference.attention(q, k, v, causal, sm_scale, soft_cap=logits_soft_cap)[0]


def expected_output(
    batch: CascadeBatch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    causal: bool,
    **options: float,
) -> torch.Tensor:
    """Flat attention of every request over its keys of all levels (NHD caches)."""
    rows = _offsets(batch.qo_lens)
    return torch.cat(
        [
            reference_attention(
                q[rows[b] : rows[b + 1]],
                request_kv(k_cache, segments),
                request_kv(v_cache, segments),
                causal,
                **options,
            )
            for b, segments in enumerate(batch.segments)
        ]
    )


def _to_layout(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """An NHD ``[num_pages, page_size, Hk, D]`` cache as ``layout`` stores it."""
    return cache.transpose(1, 2).contiguous() if layout == "HND" else cache


# -- stand-in modules ---------------------------------------------------------------------------


def _attend_log2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    window_left: int,
    scale: float,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernel computes for one request, in its log2 units: ``s = q.k * scale`` or
    ``cap * tanh(q.k * scale)``; returns (out, base-2 lse), 0 / -inf for a row without keys."""
    qo_len, kv_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1)
    vd = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kd) * scale
    if cap:
        scores = cap * torch.tanh(scores)
    rows = torch.arange(qo_len)[:, None] + (kv_len - qo_len)
    cols = torch.arange(kv_len)[None, :]
    visible = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if causal:
        visible &= cols <= rows
    if window_left >= 0:
        visible &= cols >= rows - window_left
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores * LN2, dim=-1) / LN2
    probs = torch.exp2(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, vd), lse.transpose(0, 1)


class CpuAttention:
    """The prefill module's ``batch_prefill`` (paged KV) and the cascade module's
    ``merge_state``, computed in float64 on the CPU; launches and merges are recorded."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.merges = 0

    def batch_prefill(self, *args) -> None:  # noqa: ANN002
        launch = dict(zip(BATCH_ARGS, args, strict=True))
        self.launches.append(launch)
        k, v = launch["k"], launch["v"]
        if launch["hnd"]:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        page_size = k.shape[1]
        qo = launch["qo_indptr"].tolist()
        kv = launch["kv_indptr"].tolist()
        ids = launch["kv_indices"].long()
        last = launch["kv_last_page_len"].tolist()
        for b in range(len(qo) - 1):
            pages = ids[kv[b] : kv[b + 1]]
            kv_len = (pages.numel() - 1) * page_size + last[b] if pages.numel() else 0
            out, lse = _attend_log2(
                launch["q"][qo[b] : qo[b + 1]],
                k[pages].reshape(-1, *k.shape[2:])[:kv_len],
                v[pages].reshape(-1, *v.shape[2:])[:kv_len],
                launch["causal"],
                launch["window_left"],
                launch["score_scale"],
                launch["score_cap"],
            )
            launch["out"][qo[b] : qo[b + 1]] = out.to(launch["out"].dtype)
            if launch["lse"] is not None:
                launch["lse"][qo[b] : qo[b + 1]] = lse.float()

    def merge_state(
        self,
        v_a: torch.Tensor,
        s_a: torch.Tensor,
        v_b: torch.Tensor,
        s_b: torch.Tensor,
        v_out: torch.Tensor,
        s_out: torch.Tensor,
        mask: torch.Tensor | None,
        in_place: bool,
    ) -> None:
        assert mask is None and in_place
        self.merges += 1
        s = torch.logaddexp2(s_a.double(), s_b.double())
        w_a = torch.exp2(s_a.double() - s).nan_to_num(0.0)[..., None]
        w_b = torch.exp2(s_b.double() - s).nan_to_num(0.0)[..., None]
        v_out.copy_((w_a * v_a.double() + w_b * v_b.double()).to(v_out.dtype))
        s_out.copy_(s.float())


@pytest.fixture
def cpu_attention(cpu_prefill, monkeypatch: pytest.MonkeyPatch) -> CpuAttention:  # noqa: F811
    """cpu_prefill's CPU setup (no device checks, recorded uploads) with modules that
    compute."""
    record = CpuAttention()
    monkeypatch.setattr(prefill_api, "get_prefill_module", lambda dtype, head_dim, *build: record)
    monkeypatch.setattr(cascade_api, "get_cascade_module", lambda dtype: record)
    return record


# -- CPU: a small two-level batch for the argument checks ----------------------------------------

HEADS, KV_HEADS, DIM, PAGE = 8, 2, 64, 4
QO_LENS = [3, 1, 5]
LEVELS = [[(3, 10)], [(1, 6), (1, 1), (1, 9)]]


def _workspace() -> torch.Tensor:
    return torch.empty(1 << 20, dtype=torch.uint8)


def _cache(num_pages: int = 16, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """An NHD ``[num_pages, 2, page_size, Hk, D]`` cache."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_pages, 2, PAGE, KV_HEADS, DIM, generator=gen).to(dtype)


def _plan_args(batch: CascadeBatch) -> list:
    return [[t[i] for t in batch.tables] for i in range(4)] + [HEADS, KV_HEADS, DIM, PAGE]


def _planned(batch: CascadeBatch, **options) -> Cascade:
    wrapper = Cascade(2, _workspace())
    wrapper.plan(*_plan_args(batch), q_data_type=torch.bfloat16, **options)
    return wrapper


def _q(total: int = sum(QO_LENS), dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(total, HEADS, DIM).to(dtype)


CONSTRUCTOR_BAD = [
    ("num_levels must be >= 1, got 0", ValueError, dict(num_levels=0)),
    ("num_levels must be an int, got float", TypeError, dict(num_levels=2.0)),
    ("num_levels must be <= 64, got 1000000", ValueError, dict(num_levels=10**6)),
    (
        "float_workspace_buffer must be a contiguous 1-D tensor",
        ValueError,
        dict(float_workspace_buffer=torch.empty(2, 512, dtype=torch.uint8)),
    ),
    ("kv_layout must be 'NHD' or 'HND', got 'NDH'", ValueError, dict(kv_layout="NDH")),
    ("use_cuda_graph must be a bool", TypeError, dict(use_cuda_graph=1)),
    (
        "use_cuda_graph=True needs paged_kv_indices_buf_arr",
        ValueError,
        dict(use_cuda_graph=True, paged_kv_indices_buf_arr=None),
    ),
    (
        "paged_kv_indptr_buf_arr has 1 entries; num_levels is 2",
        ValueError,
        dict(use_cuda_graph=True, paged_kv_indptr_buf_arr=[_i32([0] * 4)]),
    ),
    (
        "qo_indptr_buf_arr must be a list with one entry per level, got Tensor",
        TypeError,
        dict(use_cuda_graph=True, qo_indptr_buf_arr=_i32([0] * 4)),
    ),
    (
        "level 1: paged_kv_last_page_len_buf has 2 elements; qo_indptr_buf's batch size 3 needs 3",
        ValueError,
        dict(use_cuda_graph=True, paged_kv_last_page_len_buf_arr=[_i32([0] * 1), _i32([0] * 2)]),
    ),
    (
        "level 0: use_cuda_graph=True needs paged_kv_indptr_buf",
        ValueError,
        dict(use_cuda_graph=True, paged_kv_indptr_buf_arr=[None, _i32([0] * 4)]),
    ),
]


@pytest.mark.parametrize(
    "message,error,overrides", CONSTRUCTOR_BAD, ids=[c[0][:40] for c in CONSTRUCTOR_BAD]
)
def test_constructor_bad_arguments(cpu_attention, message, error, overrides) -> None:
    # level 0 is the shared prefix (one request), level 1 three requests
    args = dict(
        num_levels=2,
        float_workspace_buffer=_workspace(),
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf_arr=[_i32([0] * 2), _i32([0] * 4)],
        paged_kv_indptr_buf_arr=[_i32([0] * 2), _i32([0] * 4)],
        paged_kv_indices_buf_arr=[_i32([0] * 64)] * 2,
        paged_kv_last_page_len_buf_arr=[_i32([0] * 1), _i32([0] * 3)],
    )
    args.update(overrides)
    with pytest.raises(error, match=message):
        Cascade(**args)


SMALL = build_cascade(QO_LENS, LEVELS, PAGE, 16)
_QO, _INDPTR, _INDICES, _LAST = (list(t) for t in zip(*SMALL.tables))

PLAN_BAD = [  # found before any level is planned
    ("qo_indptr_arr has 1 entries; num_levels is 2", ValueError, dict(qo_indptr_arr=_QO[:1])),
    (
        "paged_kv_indices_arr has 3 entries; num_levels is 2",
        ValueError,
        dict(paged_kv_indices_arr=_INDICES + _INDICES[:1]),
    ),
    (
        "paged_kv_last_page_len must be a list with one entry per level, got Tensor",
        TypeError,
        dict(paged_kv_last_page_len=_LAST[1]),
    ),
    ("pos_encoding_mode 'XPOS' is not supported", ValueError, dict(pos_encoding_mode="XPOS")),
    (
        "pos_encoding_mode 'ALIBI' does not combine with logits_soft_cap",
        ValueError,
        dict(pos_encoding_mode="ALIBI", logits_soft_cap=30.0),
    ),
    ("use_fp16_qk_reduction=True is not supported", ValueError, dict(use_fp16_qk_reduction=True)),
    ("head_dim must be one of 64, 128, 256, got 96", ValueError, dict(head_dim=96)),
    (
        "num_qo_heads \\(8\\) must be a multiple of num_kv_heads \\(3\\)",
        ValueError,
        dict(num_kv_heads=3),
    ),
    (
        "kv_data_type torch.float16 differs from q_data_type torch.bfloat16",
        TypeError,
        dict(kv_data_type=torch.float16),
    ),
    ("causal must be a bool", TypeError, dict(causal=1)),
    ("window_left must be >= -1", ValueError, dict(window_left=-2)),
    ("sm_scale must be > 0.0", ValueError, dict(sm_scale=0.0)),
    ("page_size must be >= 1, got 0", ValueError, dict(page_size=0)),
    (
        "qo_indptr_arr\\[1\\] must start at 0",
        ValueError,
        dict(qo_indptr_arr=[_QO[0], _i32([1, 3, 4, 9])]),
    ),
    (
        "qo_indptr_arr\\[1\\]\\[-1\\] is 8, qo_indptr_arr\\[0\\]\\[-1\\] is 9: every level "
        "covers the same rows of q",
        ValueError,
        dict(qo_indptr_arr=[_QO[0], _i32([0, 3, 4, 8])]),
    ),
    (
        "qo_indptr_arr\\[0\\] must be a torch.Tensor, got list",
        TypeError,
        dict(qo_indptr_arr=[[0, 9], _QO[1]]),
    ),
]

LEVEL_BAD = [  # found by a level's plan: they name the level
    (
        "level 1: paged_kv_last_page_len\\[0\\] is 5, must be in \\[1, page_size=4\\]",
        ValueError,
        dict(paged_kv_last_page_len=[_LAST[0], _i32([5, 1, 1])]),
    ),
    (
        "level 0: paged_kv_indptr has 3 elements, expected 2",
        ValueError,
        dict(paged_kv_indptr_arr=[_i32([0, 1, 3]), _INDPTR[1]]),
    ),
    (
        "level 1: paged_kv_indices has dtype torch.float32",
        TypeError,
        dict(paged_kv_indices_arr=[_INDICES[0], _INDICES[1].float()]),
    ),
]


def _plan_with(wrapper: Cascade, overrides: dict, batch: CascadeBatch = SMALL) -> None:
    names = (
        "qo_indptr_arr",
        "paged_kv_indptr_arr",
        "paged_kv_indices_arr",
        "paged_kv_last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim",
        "page_size",
    )
    args = dict(zip(names, _plan_args(batch)), q_data_type=torch.bfloat16)
    args.update(overrides)
    wrapper.plan(**args)


@pytest.mark.parametrize("message,error,overrides", PLAN_BAD, ids=[c[0][:40] for c in PLAN_BAD])
def test_plan_bad_arguments_keep_the_previous_plan(
    cpu_attention, cpu_prefill, message, error, overrides
) -> None:
    wrapper = _planned(SMALL)
    uploads = len(cpu_prefill.uploads)
    with pytest.raises(error, match=message):
        _plan_with(wrapper, overrides)
    assert cpu_attention.launches == [] and len(cpu_prefill.uploads) == uploads
    wrapper.run(_q(), _cache())  # nothing was planned anew: the previous plan stands
    assert len(cpu_attention.launches) == 2


@pytest.mark.parametrize("message,error,overrides", LEVEL_BAD, ids=[c[0][:40] for c in LEVEL_BAD])
def test_a_level_that_fails_to_plan_is_named_and_unplans(
    cpu_attention, message, error, overrides
) -> None:
    wrapper = _planned(SMALL)
    with pytest.raises(error, match=message):
        _plan_with(wrapper, overrides)
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        wrapper.run(_q(), _cache())
    assert cpu_attention.launches == [] and "not planned" in repr(wrapper)


def test_run_before_plan_and_bad_inputs_raise_before_any_launch(cpu_attention) -> None:
    wrapper = Cascade(2, _workspace())
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        wrapper.run(_q(), _cache())
    wrapper.plan(*_plan_args(SMALL), q_data_type=torch.bfloat16)
    with pytest.raises(
        ValueError, match="q has shape \\(8, 8, 64\\); plan\\(\\) was for \\(9, 8, 64\\)"
    ):
        wrapper.run(_q(8), _cache())
    with pytest.raises(TypeError, match="q has dtype torch.float16"):
        wrapper.run(_q(dtype=torch.float16), _cache())
    with pytest.raises(ValueError, match="paged_kv_cache has shape"):
        wrapper.run(_q(), _cache()[:, :, :, :1])
    assert cpu_attention.launches == [] and cpu_attention.merges == 0


def test_causal_applies_to_the_last_level_and_options_to_every_level(cpu_attention) -> None:
    wrapper = _planned(SMALL, causal=True, sm_scale=0.3, window_left=5, logits_soft_cap=20.0)
    levels = wrapper._batch_prefill_wrappers
    assert [w._causal for w in levels] == [False, True]
    assert all((w._sm_scale, w._window_left, w._logits_soft_cap) == (0.3, 5, 20.0) for w in levels)
    wrapper.run(_q(), _cache())
    # the reference's order: the last level first, then each other level merged into it
    first, second = cpu_attention.launches
    assert torch.equal(first["qo_indptr"], SMALL.tables[1][0].to(first["qo_indptr"].dtype))
    assert (first["causal"], second["causal"]) == (True, False)
    assert first["window_left"] == second["window_left"] == 5
    assert (first["score_scale"], first["score_cap"]) == (
        second["score_scale"],
        second["score_cap"],
    )
    assert first["lse"] is not None and second["lse"] is not None
    assert cpu_attention.merges == 1


def test_levels_share_the_float_workspace_and_keep_their_own_schedules(cpu_attention) -> None:
    workspace = _workspace()
    wrapper = Cascade(3, workspace, "HND")
    assert wrapper._num_levels == 3 and wrapper._kv_layout == "HND"
    assert not wrapper.is_cuda_graph_enabled
    levels = wrapper._batch_prefill_wrappers
    assert len(levels) == 3 and all(w._kv_layout == "HND" for w in levels)
    assert all(w._float_workspace_buffer is workspace for w in levels)
    ints = {w._int_workspace_buffer.data_ptr() for w in levels}
    assert len(ints) == 3


def test_reset_workspace_buffer(cpu_attention) -> None:
    wrapper = _planned(SMALL)
    ints = torch.empty(2, 8 << 20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="int_workspace_buffers has 1 entries; num_levels is 2"):
        wrapper.reset_workspace_buffer(_workspace(), [ints[0]])
    with pytest.raises(
        ValueError, match="int_workspace_buffers\\[0\\] and int_workspace_buffers\\[1\\] overlap"
    ):
        wrapper.reset_workspace_buffer(_workspace(), [ints[0], ints[0, 1024:]])
    with pytest.raises(
        ValueError, match="int_workspace_buffers\\[1\\] must be a contiguous 1-D tensor"
    ):
        wrapper.reset_workspace_buffer(_workspace(), [ints[0], ints])
    wrapper.run(_q(), _cache())  # rejected resets change nothing
    workspace = _workspace()
    wrapper.reset_workspace_buffer(workspace, [ints[0], ints[1]])
    levels = wrapper._batch_prefill_wrappers
    assert [w._int_workspace_buffer.data_ptr() for w in levels] == [t.data_ptr() for t in ints]
    assert all(w._float_workspace_buffer is workspace for w in levels)
    with pytest.raises(RuntimeError, match="call plan\\(\\) before run\\(\\)"):
        wrapper.run(_q(), _cache())
    _plan_with(wrapper, {})
    wrapper.run(_q(), _cache())


def test_prewarm_checks_the_call(cpu_attention) -> None:
    wrapper = Cascade(2, _workspace())
    with pytest.raises(
        RuntimeError, match="call plan\\(\\) before prewarm_paged_kv_stride_variant\\(\\)"
    ):
        wrapper.prewarm_paged_kv_stride_variant()
    _plan_with(wrapper, {})
    with pytest.raises(ValueError, match="variant must be 'independent'"):
        wrapper.prewarm_paged_kv_stride_variant("shared")
    wrapper.prewarm_paged_kv_stride_variant("independent")


def test_cuda_graph_mode_gives_each_level_its_buffers(cpu_attention) -> None:
    qo_bufs = [torch.zeros(2, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)]
    indptr_bufs = [torch.zeros(2, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)]
    indices_bufs = [torch.zeros(32, dtype=torch.int32) for _ in range(2)]
    last_bufs = [torch.zeros(1, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)]
    wrapper = Cascade(2, _workspace(), "NHD", True, qo_bufs, indptr_bufs, indices_bufs, last_bufs)
    assert wrapper.is_cuda_graph_enabled
    _plan_with(wrapper, {})
    for level, table in enumerate(SMALL.tables):
        w = wrapper._batch_prefill_wrappers[level]
        assert w.is_cuda_graph_enabled and w._qo_indptr_buf is qo_bufs[level]
        assert w._paged_kv_indices_buf is indices_bufs[level]
        assert torch.equal(qo_bufs[level], table[0])
        assert torch.equal(indptr_bufs[level], table[1])
        assert torch.equal(indices_bufs[level][: table[2].numel()], table[2])
        assert torch.equal(last_bufs[level], table[3])
    with pytest.raises(
        ValueError,
        match="level 1: in CUDA-graph mode the batch size is fixed "
        "to the buffers' 3; plan\\(\\) got 2",
    ):
        other = build_cascade([4, 5], [[(2, 10)], [(1, 6), (1, 9)]], PAGE, 16)
        _plan_with(wrapper, {}, other)


def test_one_level_is_one_batch_prefill(cpu_attention) -> None:
    batch = build_cascade(QO_LENS, [[(1, 7), (1, 2), (1, 12)]], PAGE, 16)
    wrapper = Cascade(1, _workspace())
    wrapper.plan(*_plan_args(batch), causal=True, q_data_type=torch.bfloat16)
    q, cache = _q(), _cache()
    out = wrapper.forward(q, cache)
    assert len(cpu_attention.launches) == 1 and cpu_attention.merges == 0
    assert cpu_attention.launches[0]["causal"] is True
    expected = expected_output(batch, q, cache[:, 0], cache[:, 1], causal=True)
    assert_output_close(out, expected, atol=2e-2, rtol=2e-2)


CPU_CASES = [  # (qo_lens, levels, layout, dtype, causal, options)
    ([3, 1, 5, 2], [[(4, 13)], [(1, 6), (1, 1), (1, 9), (1, 2)]], "NHD", torch.bfloat16, True, {}),
    (
        [3, 1, 5, 2],
        [[(4, 16)], [(1, 6), (1, 1), (1, 9), (1, 2)]],
        "HND",
        torch.float16,
        False,
        dict(sm_scale=0.2, logits_soft_cap=3.0),
    ),
    (
        [2, 4, 1, 3, 2],
        [[(5, 11)], [(2, 8), (1, 0), (2, 5)], [(1, 2), (1, 7), (1, 3), (1, 3), (1, 4)]],
        "HND",
        torch.bfloat16,
        True,
        {},
    ),
    (
        [6, 1, 2],
        [[(3, 0)], [(1, 4), (2, 9)], [(1, 3), (1, 0), (1, 5)]],
        "NHD",
        torch.float16,
        False,
        {},
    ),
]


@pytest.mark.parametrize("qo_lens,levels,layout,dtype,causal,options", CPU_CASES)
def test_cascade_equals_flat_attention_on_the_cpu(
    cpu_attention, qo_lens, levels, layout, dtype, causal, options
) -> None:
    """The levels' states merged equal attention over each request's concatenated keys
    (causal on the last level is causal over all of them: a request's queries are its
    newest keys). Empty levels and nodes contribute nothing."""
    num_pages = 40
    batch = build_cascade(qo_lens, levels, PAGE, num_pages, seed=len(levels))
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache = (
        torch.randn(num_pages, PAGE, KV_HEADS, DIM, generator=gen).to(dtype) for _ in range(2)
    )
    q = torch.randn(batch.total_q, HEADS, DIM, generator=gen).to(dtype)
    wrapper = Cascade(len(levels), _workspace(), layout)
    wrapper.plan(
        *_plan_args(batch), causal=causal, q_data_type=dtype, kv_data_type=dtype, **options
    )
    out = wrapper.run(q, (_to_layout(k_cache, layout), _to_layout(v_cache, layout)))
    assert out.dtype == dtype and out.shape == q.shape
    assert cpu_attention.merges == len(levels) - 1
    expected = expected_output(batch, q, k_cache, v_cache, causal, **options)
    assert_output_close(out, expected, atol=2e-2, rtol=2e-2)


# -- GPU ----------------------------------------------------------------------------------------


def _nan_pool(
    num_pages: int, heads: int, dim: int, dtype: torch.dtype, batch: CascadeBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """NHD key and value pages on the GPU, NaN in every page no level owns."""
    k, v = (torch.randn(num_pages, 16, heads, dim, dtype=dtype, device="cuda") for _ in range(2))
    unused = torch.ones(num_pages, dtype=torch.bool)
    unused[batch.used_pages()] = False
    k[unused.cuda()] = NAN
    v[unused.cuda()] = NAN
    return k, v


def _nan_workspace() -> torch.Tensor:
    """A float workspace of NaN (all bits set), so a partial state read before it is
    written shows up."""
    return torch.full((128 << 20,), 255, dtype=torch.uint8, device="cuda")


def _leave_nan_in_freed_blocks(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """run() allocates its output: free NaN blocks of that size first, so torch's caching
    allocator (best effort) hands one out and a row the kernels miss reads NaN."""
    blocks = [torch.full(shape, NAN, dtype=dtype, device="cuda") for _ in range(2)]
    del blocks


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-2, rtol=1e-2)


GPU_BATCHES = {
    # a prefix shared by all, then each request's own keys (at least its queries)
    2: ([17, 1, 64, 5, 130], [[(5, 1024)], [(1, 40), (1, 1), (1, 100), (1, 5), (1, 300)]]),
    # a prefix shared by all, prefixes shared by pairs, then each request's own keys
    3: ([7, 33, 1, 20], [[(4, 2048)], [(2, 512), (2, 160)], [(1, 7), (1, 50), (1, 9), (1, 200)]]),
}

GPU_CASES = [  # (levels, dtype, layout, causal, qo_heads, kv_heads, head_dim)
    (2, torch.float16, "NHD", True, 32, 8, 128),
    (2, torch.bfloat16, "HND", False, 16, 4, 128),
    (3, torch.bfloat16, "NHD", True, 8, 1, 64),
    (3, torch.float16, "HND", True, 16, 16, 256),
    (3, torch.bfloat16, "HND", False, 32, 4, 128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("levels,dtype,layout,causal,qo_heads,kv_heads,head_dim", GPU_CASES)
def test_cascade_matches_flat_attention(
    levels, dtype, layout, causal, qo_heads, kv_heads, head_dim
) -> None:
    qo_lens, spec = GPU_BATCHES[levels]
    num_pages = 600
    batch = build_cascade(qo_lens, spec, 16, num_pages, seed=levels)
    torch.manual_seed(levels)
    k_cache, v_cache = _nan_pool(num_pages, kv_heads, head_dim, dtype, batch)
    q = torch.randn(batch.total_q, qo_heads, head_dim, dtype=dtype, device="cuda")
    cache = (_to_layout(k_cache, layout), _to_layout(v_cache, layout))
    wrapper = Cascade(levels, _nan_workspace(), layout)
    wrapper.plan(
        *[[t[i] for t in batch.tables] for i in range(4)],
        qo_heads,
        kv_heads,
        head_dim,
        16,
        causal=causal,
        q_data_type=dtype,
    )
    _leave_nan_in_freed_blocks(q.shape, dtype)
    out = wrapper.run(q, cache)
    assert out.shape == q.shape and out.dtype == dtype and not out.isnan().any()
    expected = expected_output(batch, q, k_cache, v_cache, causal)
    assert_output_close(out, expected, **_tolerance(dtype))

    flat = BatchPrefillWithPagedKVCacheWrapper(_nan_workspace(), layout)
    flat.plan(
        *batch.flat_table(16), qo_heads, kv_heads, head_dim, 16, causal=causal, q_data_type=dtype
    )
    torch.testing.assert_close(out.float(), flat.run(q, cache).float(), **_tolerance(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_level_splits_through_the_shared_float_workspace(dtype) -> None:
    """Few queries over long keys at every level: each level's schedule splits its KV and
    merges through the one float workspace, level after level, with partial last pages."""
    qo_lens = [3, 1, 2]
    spec = [[(3, 30001)], [(2, 9000), (1, 4100)], [(1, 6000), (1, 7), (1, 8191)]]
    num_pages = 4000
    batch = build_cascade(qo_lens, spec, 16, num_pages, seed=5)
    torch.manual_seed(5)
    k_cache, v_cache = _nan_pool(num_pages, 2, 128, dtype, batch)
    q = torch.randn(batch.total_q, 16, 128, dtype=dtype, device="cuda")
    wrapper = Cascade(3, _nan_workspace())
    wrapper.plan(
        *[[t[i] for t in batch.tables] for i in range(4)],
        16,
        2,
        128,
        16,
        causal=True,
        q_data_type=dtype,
    )
    assert all(w._plan_info.schedule.num_merge > 0 for w in wrapper._batch_prefill_wrappers)
    _leave_nan_in_freed_blocks(q.shape, dtype)
    out = wrapper.run(q, (k_cache, v_cache))
    expected = expected_output(batch, q, k_cache, v_cache, causal=True)
    assert_output_close(out, expected, **_tolerance(dtype))


@pytest.mark.gpu
def test_one_level_is_bitwise_batch_prefill() -> None:
    batch = build_cascade([5, 70, 1], [[(1, 300), (1, 80), (1, 4000)]], 16, 400, seed=1)
    torch.manual_seed(1)
    k_cache, v_cache = _nan_pool(400, 4, 128, torch.bfloat16, batch)
    q = torch.randn(batch.total_q, 32, 128, dtype=torch.bfloat16, device="cuda")
    table = batch.tables[0]
    wrapper = Cascade(1, _nan_workspace())
    wrapper.plan(
        [table[0]],
        [table[1]],
        [table[2]],
        [table[3]],
        32,
        4,
        128,
        16,
        causal=True,
        q_data_type=torch.bfloat16,
    )
    flat = BatchPrefillWithPagedKVCacheWrapper(_nan_workspace())
    flat.plan(*table, 32, 4, 128, 16, causal=True, q_data_type=torch.bfloat16)
    assert torch.equal(wrapper.run(q, (k_cache, v_cache)), flat.run(q, (k_cache, v_cache)))


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_after_replanning() -> None:
    """Each level in CUDA-graph mode on its own buffers: a captured run() replays a later
    plan() of other key lengths (same queries) correctly."""
    dtype, heads, kv_heads, dim, num_pages = torch.bfloat16, 32, 8, 128, 1500
    qo_lens = [4, 1, 9, 2]
    specs = [
        [[(4, 1024)], [(1, 30), (1, 1), (1, 200), (1, 2)]],
        [[(4, 9000)], [(1, 4), (1, 3000), (1, 9), (1, 70)]],
        [[(4, 16)], [(1, 4), (1, 1), (1, 9), (1, 2)]],
    ]

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int32, device="cuda")

    wrapper = Cascade(
        2,
        _nan_workspace(),
        "NHD",
        True,
        [zeros(2), zeros(5)],
        [zeros(2), zeros(5)],
        [zeros(num_pages), zeros(num_pages)],
        [zeros(1), zeros(4)],
    )
    torch.manual_seed(3)
    k_cache = torch.randn(num_pages, 16, kv_heads, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(sum(qo_lens), heads, dim, dtype=dtype, device="cuda")

    def plan(step: int) -> CascadeBatch:
        batch = build_cascade(qo_lens, specs[step], 16, num_pages, seed=step)
        wrapper.plan(
            *[[t[i] for t in batch.tables] for i in range(4)],
            heads,
            kv_heads,
            dim,
            16,
            causal=True,
            q_data_type=dtype,
        )
        return batch

    batch = plan(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, (k_cache, v_cache))  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = wrapper.run(q, (k_cache, v_cache))
    for step in range(len(specs)):
        if step:
            batch = plan(step)
        q.copy_(torch.randn_like(q))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        expected = expected_output(batch, q, k_cache, v_cache, causal=True)
        assert_output_close(out, expected, **_tolerance(dtype))
