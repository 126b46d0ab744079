"""RoPE: argument checks (CPU) and numerics against a complex-number reference (GPU)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import ragged
from flashinfer import rope as rope_api
from flashinfer.testing import reference
from tests.conftest import run_python


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(rope_api, "get_rope_module", refuse)


def _qk(
    nnz: int = 4,
    heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float16,
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randn(nnz, heads, head_dim, dtype=dtype),
        torch.randn(nnz, kv_heads, head_dim, dtype=dtype),
    )


def _ids(n: int = 4, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.arange(n, dtype=dtype)


POS_IDS_BAD = [
    ("q must be 3-D", ValueError, lambda: dict(q=_qk()[0][0], k=_qk()[1], pos_ids=_ids())),
    ("q has 4 tokens, k has 3", ValueError, lambda: dict(q=_qk()[0], k=_qk(3)[1], pos_ids=_ids())),
    (
        "q's head_dim is 64, k's is 32",
        ValueError,
        lambda: dict(q=_qk()[0], k=_qk(head_dim=32)[1], pos_ids=_ids()),
    ),
    (
        "k has dtype torch.bfloat16, but q has torch.float16",
        TypeError,
        lambda: dict(q=_qk()[0], k=_qk(dtype=torch.bfloat16)[1], pos_ids=_ids()),
    ),
    (
        "rotary_dim must be even",
        ValueError,
        lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rotary_dim=63),
    ),
    (
        r"rotary_dim must be even and in \(0, head_dim=64\], got 128",
        ValueError,
        lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rotary_dim=128),
    ),
    (
        "pos_ids has 3 elements, expected 4",
        ValueError,
        lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(3)),
    ),
    (
        "pos_ids has dtype torch.float32",
        TypeError,
        lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids().float()),
    ),
    (
        "rope_theta must be > 0",
        ValueError,
        lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids(), rope_theta=0.0),
    ),
    (
        "q must be contiguous in its last dim",
        ValueError,
        lambda: dict(
            q=torch.randn(4, 64, 8, dtype=torch.float16).transpose(1, 2), k=_qk()[1], pos_ids=_ids()
        ),
    ),
    ("q must be a CUDA tensor", ValueError, lambda: dict(q=_qk()[0], k=_qk()[1], pos_ids=_ids())),
]


@pytest.mark.parametrize(
    "api",
    [
        flashinfer.apply_rope_pos_ids,
        flashinfer.apply_rope_pos_ids_inplace,
        flashinfer.apply_llama31_rope_pos_ids,
        flashinfer.apply_llama31_rope_pos_ids_inplace,
    ],
)
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


INDPTR_BAD = [
    (
        r"indptr must be non-decreasing, but indptr\[2\] = 1 < indptr\[1\] = 3",
        ValueError,
        [0, 3, 1, 4],
        [0, 0, 0],
    ),
    (r"indptr must start at 0, got indptr\[0\] = 1", ValueError, [1, 4], [0]),
    (r"indptr\[-1\] must be at most the number of tokens in q = 4, got 5", ValueError, [0, 5], [0]),
    ("indptr needs batch_size \\+ 1 elements", ValueError, [], []),
    ("offsets has 2 elements, expected 1", ValueError, [0, 4], [0, 0]),
    ("indptr must be a torch.Tensor", TypeError, None, [0]),
]


@pytest.mark.parametrize(
    "api",
    [
        flashinfer.apply_rope,
        flashinfer.apply_rope_inplace,
        flashinfer.apply_llama31_rope,
        flashinfer.apply_llama31_rope_inplace,
    ],
)
@pytest.mark.parametrize(
    "message,error,indptr,offsets", INDPTR_BAD, ids=[c[0][:40] for c in INDPTR_BAD]
)
def test_indptr_values_are_checked_on_the_host(
    no_launch, api, message, error, indptr, offsets
) -> None:
    q, k = _qk()
    indptr = None if indptr is None else torch.tensor(indptr, dtype=torch.int32)
    with pytest.raises(error, match=message):
        api(q, k, indptr, torch.tensor(offsets, dtype=torch.int32))


@pytest.mark.parametrize(
    "api",
    [
        flashinfer.apply_rope_pos_ids,
        flashinfer.apply_rope_pos_ids_inplace,
        flashinfer.apply_llama31_rope_pos_ids,
        flashinfer.apply_llama31_rope_pos_ids_inplace,
    ],
)
def test_errors_name_a_parameter_of_the_function_called(no_launch, api) -> None:
    q, k = _qk()
    with pytest.raises(TypeError, match="^pos_ids must be a torch.Tensor"):
        api(q, k, None)


def test_decreasing_indptr_no_longer_corrupts_the_heap() -> None:
    """Issue 16: apply_rope with a decreasing indptr reached repeat_interleave with an
    output_size its counts exceed. In a fresh process it must now raise cleanly."""
    code = (
        "import torch, flashinfer\n"
        "q, k = torch.randn(2, 4, 64, dtype=torch.half), torch.randn(2, 1, 64, dtype=torch.half)\n"
        "indptr = torch.tensor([0, 4096, 2], dtype=torch.int32)\n"
        "for api in (flashinfer.apply_rope, flashinfer.apply_llama31_rope_inplace):\n"
        "    try:\n"
        "        api(q, k, indptr, torch.zeros(2, dtype=torch.int32))\n"
        "    except ValueError as e:\n"
        "        print('raised:', e)\n"
    )
    proc = run_python(code)
    assert proc.stdout.count("raised: indptr must be non-decreasing") == 2, proc.stdout


def test_llama31_frequency_factors_are_checked(no_launch) -> None:
    q, k = _qk()
    with pytest.raises(ValueError, match="high_freq_factor .* must exceed low_freq_factor"):
        flashinfer.apply_llama31_rope_pos_ids(
            q, k, _ids(), low_freq_factor=4.0, high_freq_factor=1.0
        )


COS_SIN_BAD = [
    (
        "query must be \\[nnz, num_heads \\* head_size\\], got 1-D",
        ValueError,
        lambda: dict(query=torch.randn(512, dtype=torch.float16)),
    ),
    (
        "query has 512 elements per token, not a multiple of head_size=60",
        ValueError,
        lambda: dict(head_size=60),
    ),
    ("head_size must be >= 1", ValueError, lambda: dict(head_size=0)),
    ("head_size must be an int", TypeError, lambda: dict(head_size=64.0)),
    ("query has 4 tokens, key has 3", ValueError, lambda: dict(key=_qk(3)[1].reshape(3, -1))),
    (
        "key has dtype torch.bfloat16, but query has torch.float16",
        TypeError,
        lambda: dict(key=_qk(dtype=torch.bfloat16)[1].reshape(4, -1)),
    ),
    (
        "key's strides do not allow",
        ValueError,
        lambda: dict(
            head_size=32,
            cos_sin_cache=torch.ones(16, 32),
            key=torch.randn(2, 4, 64, dtype=torch.float16).transpose(0, 1),
        ),
    ),
    (
        "cos_sin_cache has dtype torch.float16",
        TypeError,
        lambda: dict(cos_sin_cache=torch.ones(16, 64, dtype=torch.float16)),
    ),
    (
        r"cos_sin_cache's rotary_dim \(dim 1\) must be even and in \(0, head_dim=64\], got 80",
        ValueError,
        lambda: dict(cos_sin_cache=torch.ones(16, 80)),
    ),
    ("positions has 3 elements, expected 4", ValueError, lambda: dict(positions=_ids(3))),
    ("query must be a CUDA tensor", ValueError, lambda: dict()),
    ("query must be a CUDA tensor", ValueError, lambda: dict(query=_qk()[0])),  # 3-D: accepted
]


@pytest.mark.parametrize(
    "api",
    [flashinfer.apply_rope_with_cos_sin_cache, flashinfer.apply_rope_with_cos_sin_cache_inplace],
)
@pytest.mark.parametrize("message,error,make", COS_SIN_BAD, ids=[c[0][:40] for c in COS_SIN_BAD])
def test_cos_sin_cache_variants_check_arguments(no_launch, api, message, error, make) -> None:
    q, k = _qk()
    kwargs = dict(
        positions=_ids(),
        query=q.reshape(4, -1),
        key=k.reshape(4, -1),
        head_size=64,
        cos_sin_cache=torch.ones(16, 64),
    )
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

# fp32: angles agree only to float32 precision: CUDA's powf is within a few ulp of torch's
# pow, and 4 ulp of a frequency near 1 is ~2e-3 rad at position 8000, ~6e-3 on an element of
# 3; hence the looser tolerance than a float32 op would need (a wrong position is off by O(1)).
TOLERANCE = {
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float32: dict(atol=5e-3, rtol=5e-3),
}


def random_qk(
    nnz: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    return (
        torch.randn(nnz, heads, head_dim, dtype=dtype, device=device),
        torch.randn(nnz, kv_heads, head_dim, dtype=dtype, device=device),
    )


def _angles(pos: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    return pos.float().cpu()[:, None] * freq[None, :]  # float32, as in the kernel


# The checks below take the device their tensors live on: "cuda" in the GPU tests here, "cpu"
# in tests/ops/test_rope_emulated.py, where the kernel's own source runs on the emulator.


def check_rope_pos_ids(
    device: str,
    dtype: torch.dtype,
    interleave: bool,
    head_dim: int,
    rotary_dim: int,
    inplace: bool,
    pos_dtype: torch.dtype = torch.int64,
) -> None:
    q, k = random_qk(37, 8, 2, head_dim, dtype, head_dim + rotary_dim, device)
    pos = torch.randint(0, 8192, (37,), device=device, dtype=pos_dtype)
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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (128, 64), (256, 96)])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope_pos_ids_matches_the_complex_reference(
    dtype, interleave, head_dim, rotary_dim, inplace
) -> None:
    check_rope_pos_ids("cuda", dtype, interleave, head_dim, rotary_dim, inplace)


def check_ragged_batches_and_llama31(device: str, interleave: bool) -> None:
    lengths, offsets = [5, 1, 12], [0, 100, 7000]
    nnz = sum(lengths)
    q, k = random_qk(nnz, 4, 1, 128, torch.bfloat16, 3, device)
    indptr = torch.tensor([0, 5, 6, 18], dtype=torch.int32, device=device)
    offs = torch.tensor(offsets, dtype=torch.int32, device=device)
    pos = torch.cat([torch.arange(o, o + n) for o, n in zip(offsets, lengths)])
    freq = reference.rope_frequencies(128, rope_theta=1e4)
    q_out, k_out = flashinfer.apply_rope(q, k, indptr, offs, interleave=interleave)
    torch.testing.assert_close(
        q_out.double().cpu(),
        reference.rope(q.cpu(), _angles(pos, freq), interleave),
        **TOLERANCE[torch.bfloat16],
    )
    llama_freq = reference.rope_frequencies(
        128, rope_scale=8.0, rope_theta=5e5, llama31=(1.0, 4.0, 8192.0)
    )
    q_l, k_l = flashinfer.apply_llama31_rope(q, k, indptr, offs, interleave=interleave)
    torch.testing.assert_close(
        k_l.double().cpu(),
        reference.rope(k.cpu(), _angles(pos, llama_freq), interleave),
        **TOLERANCE[torch.bfloat16],
    )


@pytest.mark.gpu
@pytest.mark.parametrize("interleave", [False, True])
def test_ragged_batches_and_llama31(interleave: bool) -> None:
    check_ragged_batches_and_llama31("cuda", interleave)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_cuda_indptr_is_not_validated_but_is_harmless(index_dtype: torch.dtype) -> None:
    """A CUDA indptr is not read on the host (that would sync). A bad one (decreasing, ending
    before the last token) may leave tokens to no request: those are copied unrotated, as the
    reference leaves them alone; every other token (owned by the request the binary search
    of ragged.token_requests finds: here tokens 0 to 14) is rotated at a position a request
    whose range holds it gives it."""
    indptr, offsets, nnz = [0, 5, 3, 15], [10, 200, 3000], 17
    q, k = random_qk(nnz, 4, 1, 64, torch.float16, 9, "cuda")
    q_out, _ = flashinfer.apply_rope(
        q,
        k,
        torch.tensor(indptr, dtype=index_dtype, device="cuda"),
        torch.tensor(offsets, dtype=index_dtype, device="cuda"),
    )
    q_cpu, out = q.cpu(), q_out.cpu()
    freq = reference.rope_frequencies(64, rope_theta=1e4)
    owned = ragged.token_requests(torch.tensor(indptr), nnz).owned
    assert owned.tolist() == [True] * 15 + [False] * 2
    for t in range(nnz):
        candidates = [
            offsets[b] + t - indptr[b] for b in range(3) if indptr[b] <= t < indptr[b + 1]
        ]
        if not owned[t]:
            assert torch.equal(out[t], q_cpu[t]), t  # tokens 15, 16: in no request
            continue
        matches = [
            torch.allclose(
                out[t].double(),
                reference.rope(q_cpu[t : t + 1], _angles(torch.tensor([p]), freq), False)[0],
                **TOLERANCE[torch.float16],
            )
            for p in candidates
        ]
        assert any(matches), (t, candidates)


def check_cos_sin_cache(device: str, is_neox: bool) -> None:
    """The cos/sin cache variants (2-D and 3-D q/k, in place) and a position past the
    cache's rows: NaN in that token's rotary dims, never a read past the cache."""
    nnz, heads, kv_heads, head_size, rotary = 9, 4, 2, 128, 64
    q, k = random_qk(nnz, heads, kv_heads, head_size, torch.float16, 5, device)
    freq = reference.rope_frequencies(rotary, rope_theta=1e4)
    table = torch.arange(4096, dtype=torch.float32)[:, None] * freq[None, :]
    cache = torch.cat([table.cos(), table.sin()], dim=1).to(device)
    pos = torch.randint(0, 4096, (nnz,), device=device, dtype=torch.int32)
    query, key = q.reshape(nnz, -1), k.reshape(nnz, -1)
    q_out, k_out = flashinfer.apply_rope_with_cos_sin_cache(
        pos, query, key, head_size, cache, is_neox=is_neox
    )
    assert q_out.shape == query.shape
    angles = table[pos.cpu().long()]
    torch.testing.assert_close(
        q_out.view(nnz, heads, head_size).double().cpu(),
        reference.rope(q.cpu(), angles, not is_neox),
        **TOLERANCE[torch.float16],
    )
    q3, _ = flashinfer.apply_rope_with_cos_sin_cache(pos, q, k, head_size, cache, is_neox)
    assert q3.shape == q.shape and torch.equal(q3.reshape(nnz, -1), q_out)  # [nnz, heads, d]
    flashinfer.apply_rope_with_cos_sin_cache_inplace(
        pos, query, key, head_size, cache, is_neox=is_neox
    )
    assert torch.equal(key, k_out)
    bad = pos.clone()
    bad[3] = 10_000  # outside the cache: NaN for that token's rotary dims, no bad read
    q_bad, _ = flashinfer.apply_rope_with_cos_sin_cache(bad, q_out, k_out, head_size, cache)
    rows = q_bad.view(nnz, heads, head_size)
    assert bool(rows[3, :, :rotary].isnan().all()) and not bool(rows[2].isnan().any())


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_and_out_of_range_positions(is_neox: bool) -> None:
    check_cos_sin_cache("cuda", is_neox)
