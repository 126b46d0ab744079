"""RoPE: argument checks (CPU) and numerics against a complex-number reference (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import rope as rope_api
from flashinfer.testing import reference


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(rope_api, "get_rope_module", refuse)


def _qk(nnz: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 64,
        dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(nnz, heads, head_dim, dtype=dtype),
            torch.randn(nnz, kv_heads, head_dim, dtype=dtype))


def _ids(n: int = 4, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.arange(n, dtype=dtype)


POS_IDS_BAD = [
    ("q must be 3-D", ValueError, lambda: dict(q=_qk()[0][0], k=_qk()[1], pos_ids=_ids())),
    ("q has 4 tokens, k has 3", ValueError, lambda: dict(q=_qk()[0], k=_qk(3)[1], pos_ids=_ids())),
    ("q's head_dim is 64, k's is 32", ValueError,
     lambda: dict(q=_qk()[0], k=_qk(head_dim=32)[1], pos_ids=_ids())),
    ("k has dtype torch.bfloat16, but q has torch.float16", TypeError,
     lambda: dict(q=_qk()[0], k=_qk(dtype=torch.bfloat16)[1], pos_ids=_ids())),
    ("rotary_dim must be even", ValueError,
     lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rotary_dim=63)),
    (r"rotary_dim must be even and in \(0, head_dim=64\], got 128", ValueError,
     lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rotary_dim=128)),
    ("pos_ids has 3 elements, expected 4", ValueError,
     lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(3))),
    ("pos_ids has dtype torch.float32", TypeError,
     lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids().float())),
    ("rope_theta must be finite and > 0", ValueError,
     lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rope_theta=0.0)),
    ("q must be contiguous in its last dim", ValueError,
     lambda: dict(q=torch.randn(4, 64, 8, dtype=torch.float16).transpose(1, 2), k=_qk()[1],
                  pos_ids=_ids())),
    ("q must be a CUDA tensor", ValueError, lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids())),
]


@pytest.mark.parametrize("api", [flashinfer.apply_rope_pos_ids, flashinfer.apply_rope_pos_ids_inplace,
                                 flashinfer.apply_llama31_rope_pos_ids,
                                 flashinfer.apply_llama31_rope_pos_ids_inplace])
@pytest.mark.parametrize("message,error,make", POS_IDS_BAD, ids=[c[0][:40] for c in POS_IDS_BAD])
def test_pos_ids_variants_check_arguments(no_launch, api, message, error, make) -> None:
    kwargs = make()
    if "llama31" in api.__name__ and "rope_theta" in kwargs:
        kwargs["rope_theta"] = -1.0
    with pytest.raises(error, match=message):
        api(**kwargs)


@pytest.mark.parametrize("api", [flashinfer.apply_rope, flashinfer.apply_llama31_rope_inplace])
def test_indptr_variants_check_arguments(no_launch, api) -> None:
    q, k = _qk()
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        api(q, k, torch.tensor([0, 4], dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        api(q, k, torch.tensor([0, 4]), torch.zeros(1, dtype=torch.int64), rotary_dim=3)
    with pytest.raises(TypeError, match="rotary_dim must be an int"):
        api(q, k, torch.tensor([0, 4]), torch.zeros(1, dtype=torch.int64), rotary_dim=32.0)


def test_llama31_frequency_factors_are_checked(no_launch) -> None:
    q, k = _qk()
    with pytest.raises(ValueError, match="high_freq_factor .* must exceed low_freq_factor"):
        flashinfer.apply_llama31_rope_pos_ids(q, k, _ids(), low_freq_factor=4.0,
                                              high_freq_factor=1.0)


COS_SIN_BAD = [
    ("query must be 2-D", ValueError, lambda: dict(query=_qk()[0])),
    ("query's last dim 512 is not a multiple of head_size=60", ValueError,
     lambda: dict(head_size=60)),
    ("head_size must be a positive int", ValueError, lambda: dict(head_size=0)),
    ("cos_sin_cache has dtype torch.float16", TypeError,
     lambda: dict(cos_sin_cache=torch.ones(16, 64, dtype=torch.float16))),
    (r"rotary_dim must be even and in \(0, head_dim=64\], got 80", ValueError,
     lambda: dict(cos_sin_cache=torch.ones(16, 80))),
    ("positions has 3 elements, expected 4", ValueError, lambda: dict(positions=_ids(3))),
    ("query must be a CUDA tensor", ValueError, lambda: dict()),
]


@pytest.mark.parametrize("api", [flashinfer.apply_rope_with_cos_sin_cache,
                                 flashinfer.apply_rope_with_cos_sin_cache_inplace])
@pytest.mark.parametrize("message,error,make", COS_SIN_BAD, ids=[c[0][:40] for c in COS_SIN_BAD])
def test_cos_sin_cache_variants_check_arguments(no_launch, api, message, error, make) -> None:
    q, k = _qk()
    kwargs = dict(positions=_ids(), query=q.reshape(4, -1), key=k.reshape(4, -1), head_size=64,
                  cos_sin_cache=torch.ones(16, 64))
    kwargs.update(make())
    with pytest.raises(error, match=message):
        api(**kwargs)


def test_the_module_exports_every_variant_and_checks_in_the_binding() -> None:
    module = rope_api.get_rope_module(torch.float16)
    q, k = _qk()
    ids = _ids()
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        module.apply_rope_pos_ids(q, k, q, k, ids, 64, False, 1.0, 1e4)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        module.apply_llama31_rope_pos_ids(q, k, q, k, ids, 64, False, 8.0, 5e5, 1.0, 4.0, 8192.0)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        module.apply_rope_cos_sin_cache(q, k, q, k, ids, torch.ones(8, 64), False)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        module.apply_rope_pos_ids(q, k, q, k, ids, 7, False, 1.0, 1e4)


# -- numerics on a GPU ----------------------------------------------------------------------

# fp32: angles agree only to float32 precision (a 1-ulp frequency difference is ~5e-4 rad at
# position 8000), hence the looser tolerance than elsewhere.
TOLERANCE = {
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float32: dict(atol=2e-3, rtol=2e-3),
}


def _gpu_qk(nnz: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):  # noqa: ANN202
    torch.manual_seed(seed)
    return (torch.randn(nnz, heads, head_dim, dtype=dtype, device="cuda"),
            torch.randn(nnz, kv_heads, head_dim, dtype=dtype, device="cuda"))


def _angles(pos: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    return pos.float().cpu()[:, None] * freq[None, :]  # float32, as in the kernel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (128, 64), (256, 96)])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope_pos_ids_matches_the_complex_reference(dtype, interleave, head_dim, rotary_dim,
                                                    inplace) -> None:
    q, k = _gpu_qk(37, 8, 2, head_dim, dtype, head_dim + rotary_dim)
    pos = torch.randint(0, 8192, (37,), device="cuda", dtype=torch.int64)
    freq = reference.rope_frequencies(rotary_dim, rope_scale=2.0, rope_theta=1e4)
    angles = _angles(pos, freq)
    expected_q = reference.rope(q.cpu(), angles, interleave)
    expected_k = reference.rope(k.cpu(), angles, interleave)
    args = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=2.0, rope_theta=1e4)
    if inplace:
        assert flashinfer.apply_rope_pos_ids_inplace(q, k, pos, **args) is None
        q_out, k_out = q, k
    else:
        q_out, k_out = flashinfer.apply_rope_pos_ids(q, k, pos, **args)
    torch.testing.assert_close(q_out.double().cpu(), expected_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k_out.double().cpu(), expected_k, **TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("interleave", [False, True])
def test_ragged_batches_and_llama31(interleave: bool) -> None:
    lengths, offsets = [5, 1, 12], [0, 100, 7000]
    nnz = sum(lengths)
    q, k = _gpu_qk(nnz, 4, 1, 128, torch.bfloat16, 3)
    indptr = torch.tensor([0, 5, 6, 18], dtype=torch.int32, device="cuda")
    offs = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    pos = torch.cat([torch.arange(o, o + n) for o, n in zip(offsets, lengths)])
    freq = reference.rope_frequencies(128, rope_theta=1e4)
    q_out, k_out = flashinfer.apply_rope(q, k, indptr, offs, interleave=interleave)
    torch.testing.assert_close(q_out.double().cpu(), reference.rope(q.cpu(), _angles(pos, freq),
                                                                    interleave),
                               **TOLERANCE[torch.bfloat16])
    llama_freq = reference.rope_frequencies(128, rope_scale=8.0, rope_theta=5e5,
                                            llama31=(1.0, 4.0, 8192.0))
    q_l, k_l = flashinfer.apply_llama31_rope(q, k, indptr, offs, interleave=interleave)
    torch.testing.assert_close(k_l.double().cpu(),
                               reference.rope(k.cpu(), _angles(pos, llama_freq), interleave),
                               **TOLERANCE[torch.bfloat16])
    with pytest.raises(ValueError, match="indptr\\[-1\\] is 18, but q and k have 17 tokens"):
        flashinfer.apply_rope(q[:17], k[:17], indptr, offs)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_and_out_of_range_positions(is_neox: bool) -> None:
    nnz, heads, kv_heads, head_size, rotary = 9, 4, 2, 128, 64
    q, k = _gpu_qk(nnz, heads, kv_heads, head_size, torch.float16, 5)
    freq = reference.rope_frequencies(rotary, rope_theta=1e4)
    table = torch.arange(4096, dtype=torch.float32)[:, None] * freq[None, :]
    cache = torch.cat([table.cos(), table.sin()], dim=1).cuda()
    pos = torch.randint(0, 4096, (nnz,), device="cuda", dtype=torch.int32)
    query, key = q.reshape(nnz, -1), k.reshape(nnz, -1)
    q_out, k_out = flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, head_size, cache,
                                                            is_neox=is_neox)
    assert q_out.shape == query.shape
    angles = table[pos.cpu().long()]
    torch.testing.assert_close(q_out.view(nnz, heads, head_size).double().cpu(),
                               reference.rope(q.cpu(), angles, not is_neox),
                               **TOLERANCE[torch.float16])
    flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, head_size, cache,
                                                     is_neox=is_neox)
    assert torch.equal(key, k_out)
    bad = pos.clone()
    bad[3] = 10_000  # outside the cache: NaN for that token's rotary dims, no bad read
    q_bad, _ = flashinfer.apply_rope_with_cos_sin_cache(bad, q_out, k_out, head_size, cache)
    rows = q_bad.view(nnz, heads, head_size)
    assert bool(rows[3, :, :rotary].isnan().all()) and not bool(rows[2].isnan().any())
