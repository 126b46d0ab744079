"""Tensors a kernel writes that share memory with what it reads, or that map two elements to
one address, are refused before any launch; the layouts engines pass (q and k sliced from one
fused qkv, an in-place norm) are not."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashinfer
from flashinfer import activation, checks, norm, page, rope


class Reached(Exception):
    """The call got past every check to the module."""


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors count as CUDA ones; a module request means the checks let the call by."""

    def reached(*args: object) -> None:
        raise Reached

    monkeypatch.setattr(checks, "check_cuda", lambda *a, **k: None)
    for module, getter in (
        (norm, "get_norm_module"),
        (norm, "get_norm_quant_module"),
        (activation, "get_act_and_mul_module"),
        (rope, "get_rope_module"),
        (page, "get_page_module"),
    ):
        monkeypatch.setattr(module, getter, reached)


def test_dense_views_that_overlap_are_refused() -> None:
    base = torch.randn(8, 64)
    checks.check_distinct("a", base[:4], "b", base[4:])  # adjacent, not overlapping
    with pytest.raises(ValueError, match="a and b overlap in memory"):
        checks.check_distinct("a", base[:5], "b", base[4:])
    with pytest.raises(ValueError, match="a and b must be different tensors"):
        checks.check_distinct("a", base, "b", base)
    checks.check_distinct("a", base, "b", base, same_allowed=True)
    row = base[:1, :32]  # stride (64, 1); view() resets the size-1 dim's stride to 32
    checks.check_distinct("a", row, "b", row.view(1, 32), same_allowed=True)
    with pytest.raises(ValueError, match="must be different tensors"):  # same start, other view
        checks.check_distinct("a", base, "b", base[:2], same_allowed=True)


def test_interleaved_views_are_not_judged() -> None:
    """q and k sliced from one fused qkv interleave row by row without sharing an element;
    strided views like these are left alone, as torch leaves them."""
    qkv = torch.randn(16, 3 * 128)
    checks.check_distinct("q", qkv[:, :128], "k", qkv[:, 128:256])
    cache = torch.randn(4, 2, 16, 8)
    checks.check_distinct("k", cache[:, 0], "v", cache[:, 1])


def test_fake_tensors_compare_storage_and_offsets() -> None:
    with FakeTensorMode():
        base = torch.empty(8, 64, device="cuda")
        # narrow, not indexing: indexing a fake CUDA tensor needs torch built with CUDA
        with pytest.raises(ValueError, match="overlap in memory"):
            checks.check_distinct("a", base.narrow(0, 0, 5), "b", base.narrow(0, 4, 4))
        checks.check_distinct("a", base.narrow(0, 0, 4), "b", base.narrow(0, 4, 4))
        checks.check_distinct("a", base, "b", torch.empty(8, 64, device="cuda"))


def test_expanded_outputs_are_refused() -> None:
    checks.check_writable("out", torch.randn(4, 64))
    checks.check_writable("out", torch.randn(1, 64).expand(1, 64))
    with pytest.raises(ValueError, match="out has stride 0 in a dim of size > 1"):
        checks.check_writable("out", torch.randn(1, 64).expand(4, 64))
    # no tokens: nothing is written (a heads-major view of no rows has a heads stride of 0)
    checks.check_writable("out", torch.empty(64).as_strided((0, 4, 16), (16, 0, 1)))


def test_norms_refuse_outputs_over_their_inputs(host) -> None:  # noqa: ANN001
    rows, weight = torch.randn(8, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
    with pytest.raises(ValueError, match="out and input overlap in memory"):
        flashinfer.rmsnorm(rows[:6], weight, out=rows[1:7])
    with pytest.raises(ValueError, match="input and residual overlap in memory"):
        flashinfer.fused_add_rmsnorm(rows[:6], rows[1:7], weight)
    with pytest.raises(ValueError, match="residual has stride 0"):
        flashinfer.fused_add_rmsnorm(rows[:4], rows[7:8].expand(4, 64), weight)
    with pytest.raises(Reached):  # in place: each element is read before it is written
        flashinfer.rmsnorm(rows, weight, out=rows)
    one = torch.randn(4, 128, dtype=torch.float16)[:1, :64]  # a batch-1 row, re-viewed
    with pytest.raises(Reached):
        flashinfer.rmsnorm(one, weight, out=one.view(1, 64))
    # fused_add_rmsnorm_quant only reads input: an expanded one is fine there
    with pytest.raises(Reached):
        flashinfer.fused_add_rmsnorm_quant(
            torch.empty(4, 64, dtype=torch.float8_e4m3fn),
            rows[7:8].expand(4, 64),
            rows[:4].clone(),
            weight,
            1.0,
        )


def test_activations_refuse_expanded_or_overlapping_outputs(host) -> None:  # noqa: ANN001
    x = torch.randn(4, 256, dtype=torch.float16)
    with pytest.raises(ValueError, match="out has stride 0"):
        flashinfer.silu_and_mul(x, out=torch.empty(1, 128, dtype=torch.float16).expand(4, 128))
    flat = torch.empty(4 * 256, dtype=torch.float16)
    with pytest.raises(ValueError, match="out and input overlap in memory"):
        flashinfer.silu_and_mul(flat.view(4, 256), out=flat[256:768].view(4, 128))


def test_rope_in_place_refuses_one_tensor_as_q_and_k(host) -> None:  # noqa: ANN001
    q = torch.randn(6, 4, 64, dtype=torch.float16)
    pos = torch.arange(6, dtype=torch.int32)
    with pytest.raises(ValueError, match="q and k must be different tensors"):
        flashinfer.apply_rope_pos_ids_inplace(q, q, pos)
    with pytest.raises(ValueError, match="k has stride 0"):
        flashinfer.apply_rope_pos_ids_inplace(q, q[:, :1].expand(6, 4, 64), pos)
    query = torch.randn(6, 4 * 64, dtype=torch.float16)
    cache = torch.randn(16, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="query and key must be different tensors"):
        flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, query, 64, cache)
    qkv = torch.randn(6, 12, 64, dtype=torch.float16)  # q, k and v heads of one projection
    with pytest.raises(Reached):
        flashinfer.apply_rope_pos_ids_inplace(qkv[:, :4], qkv[:, 4:8], pos)
    one = qkv[:1]  # one token: q and k are dense, adjacent blocks
    with pytest.raises(Reached):
        flashinfer.apply_rope_pos_ids_inplace(one[:, :4], one[:, 4:8], pos[:1])
    flat = qkv[:1].reshape(1, 12 * 64)
    with pytest.raises(Reached):
        flashinfer.apply_rope_with_cos_sin_cache_inplace(
            pos[:1], flat[:, : 4 * 64], flat[:, 4 * 64 : 8 * 64], 64, cache
        )


def test_append_refuses_one_tensor_as_both_caches(host) -> None:  # noqa: ANN001
    cache = torch.zeros(4, 8, 2, 16, dtype=torch.float16)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    args = dict(
        append_key=torch.randn(3, 2, 16, dtype=torch.float16),
        append_value=torch.randn(3, 2, 16, dtype=torch.float16),
        batch_indices=i32([0, 0, 1]),
        positions=i32([0, 1, 0]),
        kv_indices=i32([0, 1]),
        kv_indptr=i32([0, 1, 2]),
        kv_last_page_len=i32([2, 1]),
    )
    with pytest.raises(ValueError, match=r"paged_kv_cache\[0\] and paged_kv_cache\[1\] must be"):
        flashinfer.append_paged_kv_cache(paged_kv_cache=(cache, cache), **args)
    with pytest.raises(Reached):
        flashinfer.append_paged_kv_cache(paged_kv_cache=(cache, cache.clone()), **args)
    one_page = torch.zeros(1, 2, 8, 2, 16, dtype=torch.float16)  # k and v: adjacent blocks
    one_page_args = dict(args, kv_indices=i32([0, 0]))
    with pytest.raises(Reached):
        flashinfer.append_paged_kv_cache(paged_kv_cache=one_page, **one_page_args)


def test_ids_past_int32_clamp_to_ids_the_kernels_skip() -> None:
    ids = torch.tensor([0, 5, 2**31 - 1, 2**31, 2**32 + 1, -1, -(2**40)])
    assert flashinfer.ragged.int32_ids(ids).tolist() == [
        0,
        5,
        2**31 - 1,
        2**31 - 1,
        2**31 - 1,
        -1,
        -1,
    ]
    same = torch.tensor([3, -1], dtype=torch.int32)
    assert flashinfer.ragged.int32_ids(same) is same
