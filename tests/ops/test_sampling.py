"""Sampling: argument checks, seeds and the Philox generator (CPU); renorm and mask ops
against exact references, sampled tokens' sets, distributions and determinism (GPU)."""

from __future__ import annotations

import math
import subprocess

import pytest
import torch

import flashinfer
from flashinfer import rng
from flashinfer import sampling as sampling_api
from flashinfer.testing import reference
from tests.conftest import REPO_ROOT, run_python

# -- CPU: checks before any launch ------------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(sampling_api, "get_sampling_module", refuse)


def _probs(batch: int = 4, vocab: int = 50) -> torch.Tensor:
    return torch.rand(batch, vocab) + 0.01


P = _probs()
I32 = torch.int32
BAD_CALLS = [
    # (message, error, api, args, kwargs)
    ("probs must be a torch.Tensor", TypeError, flashinfer.sampling_from_probs, ([0.5, 0.5],), {}),
    ("probs must be 2-D", ValueError, flashinfer.sampling_from_probs, (torch.rand(8),), {}),
    ("probs has dtype torch.float16; supported: float32", TypeError,
     flashinfer.sampling_from_probs, (P.half(),), {}),
    ("probs must be contiguous in its last dim", ValueError, flashinfer.sampling_from_probs,
     (_probs(50, 4).t(),), {}),
    ("probs has vocab_size 0", ValueError, flashinfer.sampling_from_probs,
     (torch.rand(2, 0),), {}),
    ("probs must be a CUDA tensor", ValueError, flashinfer.sampling_from_probs, (P,), {}),
    ("indices has dtype torch.float32", TypeError, flashinfer.sampling_from_probs, (P,),
     dict(indices=torch.zeros(3))),
    ("indices must be 1-D", ValueError, flashinfer.sampling_from_probs, (P,),
     dict(indices=torch.zeros(2, 2, dtype=I32))),
    ("pass either generator or seed/offset", ValueError, flashinfer.sampling_from_probs, (P,),
     dict(seed=1, generator=torch.Generator())),
    ("offset needs a seed", ValueError, flashinfer.sampling_from_probs, (P,), dict(offset=3)),
    ("seed must be in \\[0, 2\\^64\\)", ValueError, flashinfer.sampling_from_probs, (P,),
     dict(seed=-1)),
    ("generator must be a torch.Generator", TypeError, flashinfer.sampling_from_probs, (P,),
     dict(generator=7)),
    ("deterministic must be a bool", TypeError, flashinfer.sampling_from_probs, (P,),
     dict(deterministic=None)),
    ("top_p must be in \\(0, 1\\], got 0.0", ValueError, flashinfer.top_p_sampling_from_probs,
     (P, 0.0), {}),
    ("top_p must be in \\(0, 1\\], got 1.5", ValueError, flashinfer.top_p_sampling_from_probs,
     (P, 1.5), {}),
    ("top_p must be a float or a \\[batch\\] tensor", TypeError,
     flashinfer.top_p_sampling_from_probs, (P, "0.9"), {}),
    ("top_p has 3 elements, the batch has 4", ValueError, flashinfer.top_p_sampling_from_probs,
     (P, torch.full((3,), 0.9)), {}),
    ("top_k must be in \\[1, 50\\], got 0", ValueError, flashinfer.top_k_sampling_from_probs,
     (P, 0), {}),
    ("top_k must be in \\[1, 50\\], got 51", ValueError, flashinfer.top_k_sampling_from_probs,
     (P, 51), {}),
    ("top_k must be an int", TypeError, flashinfer.top_k_sampling_from_probs, (P, 2.0), {}),
    ("top_k has dtype torch.float32; expected an integer", TypeError,
     flashinfer.top_k_sampling_from_probs, (P, torch.ones(4)), {}),
    ("top_k has 2 elements, the batch has 6", ValueError, flashinfer.top_k_sampling_from_probs,
     (P, torch.ones(2, dtype=I32)), dict(indices=torch.zeros(6, dtype=I32))),
    ("min_p must be in \\[0, 1\\], got -0.1", ValueError, flashinfer.min_p_sampling_from_probs,
     (P, -0.1), {}),
    ("min_p must be in \\[0, 1\\], got nan", ValueError, flashinfer.min_p_sampling_from_probs,
     (P, math.nan), {}),
    ("filter_apply_order must be one of top_k_first, joint", ValueError,
     flashinfer.top_k_top_p_sampling_from_probs, (P, 3, 0.5), dict(filter_apply_order="k")),
    ("top_k must be in \\[1, 50\\], got 99", ValueError, flashinfer.top_k_top_p_sampling_from_probs,
     (P, 99, 0.5), {}),
    ("logits has dtype torch.int64", TypeError, flashinfer.sampling_from_logits,
     (torch.ones(2, 5, dtype=torch.int64),), {}),
    ("logits must be a CUDA tensor", ValueError, flashinfer.sampling_from_logits,
     (torch.randn(2, 5),), {}),
    ("top_p must be in \\(0, 1\\], got 2", ValueError, flashinfer.top_k_top_p_sampling_from_logits,
     (torch.randn(2, 5), 2, 2), {}),
    ("seed must be an int", TypeError, flashinfer.top_k_top_p_sampling_from_logits,
     (torch.randn(2, 5), 2, 0.5), dict(seed=1.5)),
    ("logits must be a CUDA tensor", ValueError, flashinfer.top_k_top_p_sampling_from_logits,
     (torch.randn(2, 5), 2, 0.5), {}),
    ("temperature must be in \\(0, inf\\), got 0", ValueError, flashinfer.softmax,
     (torch.randn(2, 5), 0), {}),
    ("temperature must be in \\(0, inf\\), got inf", ValueError, flashinfer.softmax,
     (torch.randn(2, 5), math.inf), {}),
    ("enable_pdl must be a bool or None", TypeError, flashinfer.softmax, (torch.randn(2, 5),),
     dict(enable_pdl=1)),
    ("logits must be 2-D", ValueError, flashinfer.softmax, (torch.randn(5),), {}),
    ("top_p must be in \\(0, 1\\], got -1", ValueError, flashinfer.top_p_renorm_probs,
     (P, -1), {}),
    ("probs must be a CUDA tensor", ValueError, flashinfer.top_p_renorm_probs, (P, 0.5), {}),
    ("top_k must be in \\[1, 50\\], got 0", ValueError, flashinfer.top_k_renorm_probs, (P, 0), {}),
    ("probs has dtype torch.bfloat16", TypeError, flashinfer.top_k_renorm_probs,
     (P.bfloat16(), 3), {}),
    ("top_k must be in \\[1, 5\\], got 6", ValueError, flashinfer.top_k_mask_logits,
     (torch.randn(2, 5), 6), {}),
    ("top_k has 3 elements, the batch has 2", ValueError, flashinfer.top_k_mask_logits,
     (torch.randn(2, 5), torch.ones(3, dtype=I32)), {}),
    ("logits must be a CUDA tensor", ValueError, flashinfer.top_k_mask_logits,
     (torch.randn(2, 5, dtype=torch.bfloat16), 2), {}),
]


@pytest.mark.parametrize("message,error,api,args,kwargs", BAD_CALLS,
                         ids=[f"{b[2].__name__}:{b[0][:40]}" for b in BAD_CALLS])
def test_bad_arguments_raise_before_launch(no_launch, message, error, api, args, kwargs) -> None:
    with pytest.raises(error, match=message):
        api(*args, **kwargs)


def test_the_binding_checks_too() -> None:
    module = sampling_api.get_sampling_module(torch.float32)
    out = torch.empty(4, dtype=I32)
    call = [out, P, None, None, None, None, 1, 1.0, 0.0, 0, True, 1, 0]
    with pytest.raises(ValueError, match="probs must be a CUDA tensor"):
        module.sampling_from_probs(*call)
    with pytest.raises(TypeError, match="probs has dtype float64, expected float32"):
        module.sampling_from_probs(out, P.double(), *call[2:])
    with pytest.raises(ValueError, match="out has 3 rows, probs 4 \\(and no indices\\)"):
        module.sampling_from_probs(torch.empty(3, dtype=I32), *call[1:])
    with pytest.raises(ValueError, match="out has the wrong shape"):
        module.softmax(torch.empty(4, 49), P, None, 1.0, False)
    with pytest.raises(ValueError, match="renorm takes top_k or top_p"):
        module.renorm_probs(torch.empty_like(P), P, None, None, 1, 1.0, 4)
    assert module.dtype() == "float32"


def test_seed_and_offset_sources() -> None:
    cpu = torch.device("cpu")
    assert rng.philox_seed_offset(cpu, seed=5) == (5, 0)
    assert rng.philox_seed_offset(cpu, seed=2**64 - 1, offset=9) == (2**64 - 1, 9)
    a = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(3))
    b = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(3))
    c = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(4))
    assert a == b != c and a[1] == 0 and 0 <= a[0] < 2**64
    assert rng.as_int64(2**64 - 1) == -1 and rng.as_int64(5) == 5
    with pytest.raises(ValueError, match="offset must be in"):
        rng.philox_seed_offset(cpu, seed=1, offset=2**64)


def test_philox_matches_the_published_known_answers(tmp_path) -> None:
    """The kernels' generator is plain C++ on the host: compile it with the host compiler
    and compare with the Philox4x32-10 known-answer vectors of Salmon et al."""
    source = tmp_path / "kat.cc"
    source.write_text(
        '#include <cstdio>\n#include "flashinfer/philox.h"\n'
        "int main() { using flashinfer::philox4x32_10;\n"
        "  const flashinfer::PhiloxBlock r[3] = {philox4x32_10({0, 0, 0, 0}, 0, 0),\n"
        "    philox4x32_10({~0u, ~0u, ~0u, ~0u}, ~0u, ~0u),\n"
        "    philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},\n"
        "                  0xa4093822u, 0x299f31d0u)};\n"
        '  for (const auto& b : r) std::printf("%08x %08x %08x %08x\\n", b.x, b.y, b.z, b.w);\n'
        "}\n")
    from flashinfer.jit.toolchain import current_toolchain

    binary = tmp_path / "kat"
    subprocess.run([str(current_toolchain().cxx), "-std=c++17", f"-I{REPO_ROOT / 'include'}", str(source),
                    "-o", str(binary)], check=True)
    lines = subprocess.run([str(binary)], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    assert lines[:3] == ["6627e8d5 e169c58d bc57ac4c 9b00dbd8",
                         "408f276d 41c83b0e a20bc7c6 6d5451fd",
                         "d16cfe09 94fdcceb 5001e420 24126ea1"]


# -- GPU ---------------------------------------------------------------------------------------

# Chi-square bound: Wilson-Hilferty quantile at z = 5 (one-sided false-failure rate ~3e-7
# per test when the sampler is exact).
Z_FALSE_FAILURE = 5.0


def chi_square_bound(df: int, z: float = Z_FALSE_FAILURE) -> float:
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def assert_distribution(tokens: torch.Tensor, expected: torch.Tensor) -> None:
    """tokens: draws from one distribution; expected: its float64 probabilities. Tokens of
    probability 0 must never appear; the rest pass a chi-square test (bins with fewer than
    20 expected draws are pooled)."""
    n = tokens.numel()
    counts = torch.bincount(tokens.long().cpu(), minlength=expected.numel()).double()
    expected = expected.cpu()
    zero = expected == 0
    assert counts[zero].sum() == 0, f"drew tokens of probability 0: {zero.nonzero()[:5]}"
    want = expected * n
    big = want >= 20
    obs = torch.cat([counts[big], counts[~big & ~zero].sum().reshape(1)])
    exp = torch.cat([want[big], want[~big & ~zero].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = max(int(obs.numel()) - 1, 1)
    assert stat < chi_square_bound(df), f"chi2 {stat:.1f} over {df} dof"


def _random_probs(batch: int, vocab: int, seed: int, spread: float = 2.0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(batch, vocab, device="cuda", generator=gen) * spread
    return torch.softmax(logits, dim=-1)


def _near_boundary(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Elements whose top-p membership is within fixed-point/rounding reach (1e-5 of mass)."""
    p = probs.double()
    top = torch.as_tensor(top_p, device=p.device, dtype=torch.float64).reshape(-1, 1)
    return (reference.mass_above(p) - top * p.sum(-1, keepdim=True)).abs() < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 4097, 32000, 128256])
def test_softmax_matches_torch(dtype, vocab) -> None:
    torch.manual_seed(vocab)
    logits = (torch.randn(5, vocab + 3, device="cuda") * 4).to(dtype)[:, 3:]  # unaligned rows
    temps = torch.rand(5, device="cuda") + 0.3
    for temperature in (None, 0.7, temps):
        t = 1.0 if temperature is None else temperature
        t = t.reshape(-1, 1).double() if isinstance(t, torch.Tensor) else t
        want = torch.softmax(logits.double() / t, dim=-1)
        got = flashinfer.softmax(logits, temperature)
        assert got.dtype == torch.float32 and got.shape == logits.shape
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [10, 1000, 32000, 128256])
def test_top_k_renorm_and_mask_match_the_reference(vocab) -> None:
    probs = _random_probs(6, vocab, vocab)
    ks = torch.tensor([1, 2, 5, vocab // 2 + 1, vocab - 1, vocab], device="cuda").clamp(1, vocab)
    for top_k in (3 if vocab > 3 else 1, ks):
        keep = reference.top_k_set(probs, top_k)
        got = flashinfer.top_k_renorm_probs(probs, top_k)
        torch.testing.assert_close(got.double(), reference.renormalize(probs, keep), atol=1e-6,
                                   rtol=1e-5)
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.log(probs).to(dtype)
            lkeep = reference.top_k_set(logits.float(), top_k)
            masked = flashinfer.top_k_mask_logits(logits, top_k)
            assert masked.dtype == dtype
            assert torch.equal(masked, torch.where(lkeep, logits, float("-inf")).to(dtype))


@pytest.mark.gpu
def test_top_k_keeps_ties_with_the_kth() -> None:
    probs = torch.tensor([[0.1, 0.3, 0.2, 0.2, 0.2]], device="cuda")
    got = flashinfer.top_k_renorm_probs(probs, 2)
    torch.testing.assert_close(got.cpu(), torch.tensor([[0.0, 0.3, 0.2, 0.2, 0.2]]) / 0.9)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [10, 1000, 32000, 128256])
def test_top_p_renorm_matches_the_reference(vocab) -> None:
    probs = _random_probs(6, vocab, vocab + 1)
    ps = torch.tensor([0.01, 0.1, 0.5, 0.9, 0.999, 1.0], device="cuda")
    for top_p in (0.7, ps):
        keep = reference.top_p_set(probs, top_p)
        got = flashinfer.top_p_renorm_probs(probs, top_p)
        kept = got > 0
        free = _near_boundary(probs, top_p)
        assert torch.equal(kept[~free], keep[~free])
        torch.testing.assert_close(got.double(), reference.renormalize(probs, kept), atol=1e-6,
                                   rtol=1e-5)


def _draws(api, probs: torch.Tensor, n: int, **kwargs) -> torch.Tensor:  # noqa: ANN001
    """n draws from row 0 of probs in one call (indices repeat the row)."""
    indices = torch.zeros(n, dtype=I32, device="cuda")
    return api(probs, indices=indices, seed=1234, offset=0, **kwargs)


SAMPLERS = [
    ("plain", flashinfer.sampling_from_probs, {}, lambda p: torch.ones_like(p, dtype=torch.bool)),
    ("top_k", flashinfer.top_k_sampling_from_probs, dict(top_k=7),
     lambda p: reference.top_k_set(p, 7)),
    ("top_p", flashinfer.top_p_sampling_from_probs, dict(top_p=0.6),
     lambda p: reference.top_p_set(p, 0.6)),
    ("min_p", flashinfer.min_p_sampling_from_probs, dict(min_p=0.2),
     lambda p: reference.min_p_set(p, 0.2)),
    ("joint", flashinfer.top_k_top_p_sampling_from_probs,
     dict(top_k=10, top_p=0.5, filter_apply_order="joint"),
     lambda p: reference.top_k_set(p, 10) & reference.top_p_set(p, 0.5)),
    ("top_k_first", flashinfer.top_k_top_p_sampling_from_probs,
     dict(top_k=10, top_p=0.5, filter_apply_order="top_k_first"),
     lambda p: reference.top_p_set(reference.renormalize(p, reference.top_k_set(p, 10)), 0.5)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=[s[0] for s in SAMPLERS])
def test_sampled_distribution_matches_the_renormalized_reference(name, api, kwargs,
                                                                 allowed) -> None:
    probs = _random_probs(1, 64, 7, spread=1.0)
    keep = allowed(probs)
    tokens = _draws(api, probs, 200_000, **kwargs)
    assert tokens.dtype == I32 and tokens.shape == (200_000,)
    assert_distribution(tokens, reference.renormalize(probs, keep)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=[s[0] for s in SAMPLERS])
@pytest.mark.parametrize("vocab", [3, 4097, 128256, 262144])
def test_every_token_lies_in_the_allowed_set(name, api, kwargs, allowed, vocab) -> None:
    probs = _random_probs(64, vocab, vocab)
    kwargs = {k: (min(v, vocab) if k == "top_k" else v) for k, v in kwargs.items()}
    keep = allowed(probs)
    if "top_p" in kwargs:  # membership at the boundary is decided in fixed point
        keep |= _near_boundary(probs, kwargs["top_p"])
    for draw in range(8):
        tokens = api(probs, seed=99, offset=draw, **kwargs).long()
        assert ((tokens >= 0) & (tokens < vocab)).all()
        assert keep.gather(1, tokens[:, None]).all(), name


@pytest.mark.gpu
def test_per_request_parameters_apply_row_by_row() -> None:
    probs = _random_probs(4, 5000, 3)
    top_k = torch.tensor([1, 5, 50, 5000], device="cuda")
    top_p = torch.tensor([0.05, 0.3, 0.8, 1.0], device="cuda")
    keep = reference.top_k_set(probs, top_k) & (reference.top_p_set(probs, top_p)
                                               | _near_boundary(probs, top_p))
    for draw in range(20):
        tokens = flashinfer.top_k_top_p_sampling_from_probs(
            probs, top_k, top_p, filter_apply_order="joint", seed=5, offset=draw).long()
        assert keep.gather(1, tokens[:, None]).all()
        assert tokens[0] == probs[0].argmax()


@pytest.mark.gpu
def test_large_batch_and_vocab() -> None:
    probs = _random_probs(1024, 262144, 11, spread=3.0)
    tokens = flashinfer.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=1).long()
    keep = reference.top_k_set(probs, 50) & (reference.top_p_set(probs, 0.9)
                                            | _near_boundary(probs, 0.9))
    assert keep.gather(1, tokens[:, None]).all()


@pytest.mark.gpu
def test_sampling_from_logits_matches_softmax() -> None:
    logits = torch.randn(1, 64, device="cuda") * 1.5
    logits[0, 5] = float("-inf")
    tokens = _draws(flashinfer.sampling_from_logits, logits, 200_000)
    assert_distribution(tokens, torch.softmax(logits.double(), -1)[0])
    for dtype in (torch.float16, torch.bfloat16):
        half = _draws(flashinfer.sampling_from_logits, logits.to(dtype), 200_000)
        assert_distribution(half, torch.softmax(logits.to(dtype).double(), -1)[0])


@pytest.mark.gpu
def test_top_k_top_p_from_logits_is_softmax_then_probs() -> None:
    logits = torch.randn(16, 3000, device="cuda", dtype=torch.bfloat16) * 3
    for order in ("top_k_first", "joint"):
        a = flashinfer.top_k_top_p_sampling_from_logits(logits, 20, 0.8, filter_apply_order=order,
                                                        seed=3, offset=4)
        b = flashinfer.top_k_top_p_sampling_from_probs(flashinfer.softmax(logits), 20, 0.8,
                                                       filter_apply_order=order, seed=3, offset=4)
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_same_seed_same_tokens_and_generators_advance() -> None:
    probs = _random_probs(256, 32000, 21)
    a = flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=8)
    assert torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=8))
    assert not torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=12))
    assert not torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=43, offset=8))
    g = torch.Generator(device="cuda").manual_seed(7)
    first = flashinfer.sampling_from_probs(probs, generator=g)
    second = flashinfer.sampling_from_probs(probs, generator=g)
    assert not torch.equal(first, second)
    again = flashinfer.sampling_from_probs(probs, generator=torch.Generator(device="cuda").manual_seed(7))
    assert torch.equal(first, again)
    torch.manual_seed(0)
    x = flashinfer.sampling_from_probs(probs)
    torch.manual_seed(0)
    assert torch.equal(x, flashinfer.sampling_from_probs(probs))


@pytest.mark.gpu
def test_same_seed_same_tokens_in_a_fresh_process() -> None:
    code = ("import torch, flashinfer\n"
            "g = torch.Generator(device='cuda').manual_seed(5)\n"
            "p = torch.softmax(torch.randn(64, 50000, device='cuda', generator=g) * 2, -1)\n"
            "t = flashinfer.top_k_top_p_sampling_from_probs(p, 40, 0.9, seed=77, offset=3)\n"
            "print(','.join(map(str, t.tolist())))\n")
    here = run_python(code).stdout.strip().splitlines()[-1]
    there = run_python(code).stdout.strip().splitlines()[-1]
    assert here == there and len(here.split(",")) == 64


@pytest.mark.gpu
def test_degenerate_rows() -> None:
    vocab = 1000
    one_hot = torch.zeros(3, vocab, device="cuda")
    one_hot[torch.arange(3), torch.tensor([0, 517, 999])] = 1.0
    for api, kwargs in ((flashinfer.sampling_from_probs, {}),
                        (flashinfer.top_k_sampling_from_probs, dict(top_k=5)),
                        (flashinfer.top_p_sampling_from_probs, dict(top_p=0.3)),
                        (flashinfer.min_p_sampling_from_probs, dict(min_p=0.5))):
        assert api(one_hot, seed=1, **kwargs).tolist() == [0, 517, 999]
    probs = _random_probs(32, vocab, 4)
    assert torch.equal(flashinfer.top_k_sampling_from_probs(probs, 1, seed=2).long(),
                       probs.argmax(-1))
    plain = flashinfer.sampling_from_probs(probs, seed=9, offset=1)
    assert torch.equal(flashinfer.top_p_sampling_from_probs(probs, 1.0, seed=9, offset=1), plain)
    assert torch.equal(flashinfer.top_k_sampling_from_probs(probs, vocab, seed=9, offset=1), plain)
    assert torch.equal(flashinfer.min_p_sampling_from_probs(probs, 0.0, seed=9, offset=1), plain)
    logits = torch.full((4, vocab), float("-inf"), device="cuda")
    logits[torch.arange(4), torch.tensor([3, 0, 999, 400])] = torch.randn(4, device="cuda")
    assert flashinfer.sampling_from_logits(logits, seed=3).tolist() == [3, 0, 999, 400]
    assert flashinfer.top_k_top_p_sampling_from_logits(logits, 10, 0.5, seed=3).tolist() == [
        3, 0, 999, 400]


@pytest.mark.gpu
def test_indices_map_outputs_to_rows_and_out_of_range_yields_minus_one() -> None:
    probs = torch.zeros(3, 100, device="cuda")
    probs[0, 10] = probs[1, 20] = probs[2, 30] = 1.0
    indices = torch.tensor([2, 0, 0, 1, 3, -1], dtype=I32, device="cuda")
    assert flashinfer.sampling_from_probs(probs, indices=indices, seed=0).tolist() == [
        30, 10, 10, 20, -1, -1]
    assert flashinfer.sampling_from_logits(probs.log(), indices=indices.long(), seed=0).tolist() == [
        30, 10, 10, 20, -1, -1]
    zero_row = torch.zeros(1, 100, device="cuda")
    assert flashinfer.sampling_from_probs(zero_row, seed=0).tolist() == [0]


@pytest.mark.gpu
def test_check_nan_raises() -> None:
    probs = _random_probs(2, 100, 0)
    probs[1, 3] = float("nan")
    with pytest.raises(ValueError, match="probs contains NaN"):
        flashinfer.sampling_from_probs(probs, check_nan=True)


@pytest.mark.gpu
def test_softmax_with_pdl_after_another_kernel() -> None:
    logits = torch.randn(64, 32000, device="cuda")
    for _ in range(3):
        logits.mul_(1.01)  # a kernel right before: PDL must still see its result
        got = flashinfer.softmax(logits, enable_pdl=True)
        torch.testing.assert_close(got, torch.softmax(logits, -1), atol=1e-6, rtol=1e-4)


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_sampling_specialization_compiles(dtype: str) -> None:
    from flashinfer.jit.sampling import gen_sampling_module

    assert gen_sampling_module(dtype).build_and_load().dtype() == dtype
