"""Sampling: argument checks, seeds and the Philox generator (CPU); renorm and mask ops
against exact references, sampled tokens' sets, distributions, determinism and the random
streams' layout (GPU)."""

from __future__ import annotations

import math
import struct
from typing import Any, Callable

import pytest
import torch

import flashinfer
from flashinfer import rng
from flashinfer import sampling as sampling_api
from flashinfer.testing import reference
from tests.conftest import REPO_ROOT, run_host_program, run_python

# -- CPU: checks before any launch ------------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dtype):  # noqa: ANN001, ANN202
        raise AssertionError("a bad argument reached the module")

    monkeypatch.setattr(sampling_api, "get_sampling_module", refuse)


def _probs(batch: int = 4, vocab: int = 50) -> torch.Tensor:
    return torch.rand(batch, vocab) + 0.01


P = _probs()
L = torch.randn(2, 5)
I32 = torch.int32
I64 = torch.int64
NOT_CUDA = ("must be a CUDA tensor", ValueError)
BAD_CALLS = [
    # (message, error, api, args, kwargs)
    ("probs must be a torch.Tensor", TypeError, flashinfer.sampling_from_probs, ([0.5, 0.5],), {}),
    ("probs must be 2-D", ValueError, flashinfer.sampling_from_probs, (torch.rand(8),), {}),
    (
        "probs has dtype torch.int64; supported: float16, bfloat16, float32, float64",
        TypeError,
        flashinfer.sampling_from_probs,
        (P.long(),),
        {},
    ),
    (
        "probs must be contiguous in its last dim",
        ValueError,
        flashinfer.sampling_from_probs,
        (_probs(50, 4).t(),),
        {},
    ),
    ("probs has vocab_size 0", ValueError, flashinfer.sampling_from_probs, (torch.rand(2, 0),), {}),
    ("probs must be a CUDA tensor", ValueError, flashinfer.sampling_from_probs, (P,), {}),
    (
        "indices has dtype torch.float32",
        TypeError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(indices=torch.zeros(3)),
    ),
    (
        "indices must be 1-D",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(indices=torch.zeros(2, 2, dtype=I32)),
    ),
    (
        "pass either generator or seed",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=1, generator=torch.Generator()),
    ),
    ("offset needs a seed", ValueError, flashinfer.sampling_from_probs, (P,), dict(offset=3)),
    (
        "seed must be in \\[0, 2\\^64\\)",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=-1),
    ),
    (
        "offset must be in \\[0, 2\\^64\\)",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=1, offset=2**64),
    ),
    (
        "generator must be a torch.Generator",
        TypeError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(generator=7),
    ),
    (
        "generator must be a torch.Generator",
        TypeError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(generator=7, seed=1, offset=2),
    ),
    (
        "seed and offset must both be tensors or both be ints",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=torch.tensor([1])),
    ),
    (
        "seed and offset must both be tensors or both be ints",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=torch.tensor([1]), offset=0),
    ),
    (
        "seed has dtype torch.int32; expected int64 or uint64",
        TypeError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=torch.tensor([1], dtype=I32), offset=torch.tensor([0])),
    ),
    (
        "offset must be a 1-D tensor, got 0-D",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=torch.tensor([1]), offset=torch.tensor(0)),
    ),
    (
        "offset has 3 elements; expected 1 or 4",
        ValueError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(seed=torch.tensor([1]), offset=torch.zeros(3, dtype=I64)),
    ),
    (
        "deterministic must be a bool",
        TypeError,
        flashinfer.sampling_from_probs,
        (P,),
        dict(deterministic=None),
    ),
    (
        "return_valid must be a bool",
        TypeError,
        flashinfer.top_k_sampling_from_probs,
        (P, 3),
        dict(return_valid=1),
    ),
    (
        "top_p must be > 0 \\(values >= 1 keep every token\\), got 0.0",
        ValueError,
        flashinfer.top_p_sampling_from_probs,
        (P, 0.0),
        {},
    ),
    ("top_p must be > 0", ValueError, flashinfer.top_p_sampling_from_probs, (P, -0.5), {}),
    ("top_p must not be NaN", ValueError, flashinfer.top_p_sampling_from_probs, (P, math.nan), {}),
    (
        "top_p must be a float or a \\[batch\\] tensor",
        TypeError,
        flashinfer.top_p_sampling_from_probs,
        (P, "0.9"),
        {},
    ),
    (
        "top_p has 3 elements, the batch has 4",
        ValueError,
        flashinfer.top_p_sampling_from_probs,
        (P, torch.full((3,), 0.9)),
        {},
    ),
    (
        "top_p has dtype torch.int64; expected a floating-point tensor",
        TypeError,
        flashinfer.top_p_sampling_from_probs,
        (P, torch.ones(4, dtype=I64)),
        {},
    ),
    (
        "top_k must be >= 1 \\(values >= vocab_size keep every token\\), got 0",
        ValueError,
        flashinfer.top_k_sampling_from_probs,
        (P, 0),
        {},
    ),
    ("top_k must be >= 1", ValueError, flashinfer.top_k_sampling_from_probs, (P, -1), {}),
    ("top_k must be an int", TypeError, flashinfer.top_k_sampling_from_probs, (P, 2.0), {}),
    (
        "top_k has dtype torch.float32",
        TypeError,
        flashinfer.top_k_sampling_from_probs,
        (P, torch.ones(4)),
        {},
    ),
    (
        "top_k has dtype torch.bool",
        TypeError,
        flashinfer.top_k_sampling_from_probs,
        (P, torch.ones(4, dtype=torch.bool)),
        {},
    ),
    (
        "top_k has 2 elements, the batch has 6",
        ValueError,
        flashinfer.top_k_sampling_from_probs,
        (P, torch.ones(2, dtype=I32)),
        dict(indices=torch.zeros(6, dtype=I32)),
    ),
    (
        "min_p must be <= 1 \\(values <= 0 keep every token\\), got 1.5",
        ValueError,
        flashinfer.min_p_sampling_from_probs,
        (P, 1.5),
        {},
    ),
    ("min_p must not be NaN", ValueError, flashinfer.min_p_sampling_from_probs, (P, math.nan), {}),
    (
        "filter_apply_order must be one of top_k_first, joint",
        ValueError,
        flashinfer.top_k_top_p_sampling_from_probs,
        (P, 3, 0.5),
        dict(filter_apply_order="k"),
    ),
    ("top_k must be >= 1", ValueError, flashinfer.top_k_top_p_sampling_from_probs, (P, 0, 0.5), {}),
    (
        "logits has dtype torch.int64",
        TypeError,
        flashinfer.sampling_from_logits,
        (torch.ones(2, 5, dtype=I64),),
        {},
    ),
    ("logits must be a CUDA tensor", ValueError, flashinfer.sampling_from_logits, (L,), {}),
    ("top_p must be > 0", ValueError, flashinfer.top_k_top_p_sampling_from_logits, (L, 2, 0), {}),
    (
        "seed must be an int",
        TypeError,
        flashinfer.top_k_top_p_sampling_from_logits,
        (L, 2, 0.5),
        dict(seed=1.5),
    ),
    (
        "logits must be a CUDA tensor",
        ValueError,
        flashinfer.top_k_top_p_sampling_from_logits,
        (L, 2, 0.5),
        {},
    ),
    ("temperature must not be NaN", ValueError, flashinfer.softmax, (L, math.nan), {}),
    (
        "temperature has dtype torch.int32",
        TypeError,
        flashinfer.softmax,
        (L, torch.ones(2, dtype=I32)),
        {},
    ),
    ("enable_pdl must be a bool or None", TypeError, flashinfer.softmax, (L,), dict(enable_pdl=1)),
    ("logits must be 2-D", ValueError, flashinfer.softmax, (torch.randn(5),), {}),
    ("top_p must be > 0", ValueError, flashinfer.top_p_renorm_probs, (P, -1), {}),
    (
        "is_deterministic must be a bool",
        TypeError,
        flashinfer.top_p_renorm_probs,
        (P, 0.5),
        dict(is_deterministic="yes"),
    ),
    ("probs must be a CUDA tensor", ValueError, flashinfer.top_p_renorm_probs, (P, 0.5), {}),
    ("top_k must be >= 1", ValueError, flashinfer.top_k_renorm_probs, (P, 0), {}),
    (
        "probs has dtype torch.float64; supported: float16, bfloat16, float32",
        TypeError,
        flashinfer.top_k_renorm_probs,
        (P.double(), 3),
        {},
    ),
    ("top_k must be >= 1", ValueError, flashinfer.top_k_mask_logits, (L, -1), {}),
    (
        "top_k has 3 elements, the batch has 2",
        ValueError,
        flashinfer.top_k_mask_logits,
        (L, torch.ones(3, dtype=I32)),
        {},
    ),
    (
        "logits must be a CUDA tensor",
        ValueError,
        flashinfer.top_k_mask_logits,
        (L.bfloat16(), 2),
        {},
    ),
]


@pytest.mark.parametrize(
    "message,error,api,args,kwargs",
    BAD_CALLS,
    ids=[f"{b[2].__name__}:{b[0][:40]}" for b in BAD_CALLS],
)
def test_bad_arguments_raise_before_launch(no_launch, message, error, api, args, kwargs) -> None:
    with pytest.raises(error, match=message):
        api(*args, **kwargs)


# A required filter given as None names the argument; it never samples without the filter.
NONE_FILTERS = [
    ("top_p", flashinfer.top_p_sampling_from_probs, (P, None)),
    ("top_k", flashinfer.top_k_sampling_from_probs, (P, None)),
    ("min_p", flashinfer.min_p_sampling_from_probs, (P, None)),
    ("top_k", flashinfer.top_k_top_p_sampling_from_probs, (P, None, 0.5)),
    ("top_p", flashinfer.top_k_top_p_sampling_from_probs, (P, 5, None)),
    ("top_k", flashinfer.top_k_top_p_sampling_from_logits, (L, None, 0.5)),
    ("top_p", flashinfer.top_k_top_p_sampling_from_logits, (L, 2, None)),
    ("top_p", flashinfer.top_p_renorm_probs, (P, None)),
    ("top_k", flashinfer.top_k_renorm_probs, (P, None)),
    ("top_k", flashinfer.top_k_mask_logits, (L, None)),
]


@pytest.mark.parametrize(
    "name,api,args", NONE_FILTERS, ids=[f"{f[1].__name__}:{f[0]}" for f in NONE_FILTERS]
)
def test_a_required_filter_of_none_is_a_type_error(no_launch, name, api, args) -> None:
    with pytest.raises(
        TypeError, match=f"^{name} must be an? (int|float) or a \\[batch\\] tensor, got NoneType$"
    ):
        api(*args)


# Scalars the reference accepts and gives a meaning: accepted here (they reach the device check).
ACCEPTED_SCALARS = [
    (flashinfer.top_k_sampling_from_probs, (P, 10**9)),
    (flashinfer.top_k_top_p_sampling_from_probs, (P, 51, 1.0)),
    (flashinfer.top_p_sampling_from_probs, (P, 1.5)),
    (flashinfer.top_p_sampling_from_probs, (P, math.inf)),
    (flashinfer.min_p_sampling_from_probs, (P, -0.5)),
    (flashinfer.min_p_sampling_from_probs, (P, 1)),
    (flashinfer.top_k_mask_logits, (L, 6)),
    (flashinfer.top_k_renorm_probs, (P.bfloat16(), 2**40)),
    (flashinfer.softmax, (L, 0.0)),
    (flashinfer.softmax, (L, -2.0)),
    (flashinfer.softmax, (L, math.inf)),
    (flashinfer.sampling_from_probs, (P.half(),)),
    (flashinfer.sampling_from_probs, (P.double(),)),
    (flashinfer.sampling_from_logits, (L.double(),)),
]


@pytest.mark.parametrize(
    "api,args", ACCEPTED_SCALARS, ids=[f"{a[0].__name__}:{a[1][1:]}" for a in ACCEPTED_SCALARS]
)
def test_out_of_range_scalars_the_reference_accepts_are_accepted(no_launch, api, args) -> None:
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        api(*args)


def test_the_binding_checks_too() -> None:
    module = sampling_api.get_sampling_module(torch.float32)
    out = torch.empty(4, dtype=I32)
    call = [out, None, P, None, None, None, None, 1, 1.0, 0.0, 0, True, None, None, 1, 0]
    with pytest.raises(ValueError, match="probs must be a CUDA tensor"):
        module.sampling_from_probs(*call)
    with pytest.raises(TypeError, match="probs has dtype float64, expected float32"):
        module.sampling_from_probs(*call[:2], P.double(), *call[3:])
    with pytest.raises(ValueError, match="out has 3 rows, probs 4 \\(and no indices\\)"):
        module.sampling_from_probs(torch.empty(3, dtype=I32), *call[1:])
    with pytest.raises(TypeError, match="out has dtype int64, expected int32"):
        module.sampling_from_probs(torch.empty(4, dtype=I64), *call[1:])
    wide = [torch.empty(2, dtype=I64), None, P, torch.zeros(2, dtype=I64)]
    with pytest.raises(ValueError, match="probs must be a CUDA tensor"):  # int64 out and indices
        module.sampling_from_probs(*wide, *call[4:])
    with pytest.raises(TypeError, match="valid has dtype int32, expected bool"):
        module.sampling_from_probs(out, torch.empty(4, dtype=I32), *call[2:])
    with pytest.raises(ValueError, match="seed and offset must both be tensors or both be ints"):
        module.sampling_from_probs(*call[:12], torch.ones(1, dtype=I64), None, 1, 0)
    with pytest.raises(ValueError, match="offset must be 1-D with 1 or 4 elements"):
        module.sampling_from_probs(
            *call[:12], torch.ones(4, dtype=I64), torch.ones(2, dtype=I64), 1, 0
        )
    with pytest.raises(TypeError, match="seed has dtype int32, expected int64 or uint64"):
        module.sampling_from_logits(
            out, P, None, torch.ones(1, dtype=I32), torch.ones(1, dtype=I64), 1, 0
        )
    with pytest.raises(ValueError, match="logits must be a CUDA tensor"):  # uint64 seeds pass
        module.sampling_from_logits(
            out, P, None, torch.ones(1, dtype=torch.uint64), torch.ones(4, dtype=torch.uint64), 1, 0
        )
    with pytest.raises(ValueError, match="out has the wrong shape"):
        module.softmax(torch.empty(4, 49), P, None, 1.0, False)
    with pytest.raises(ValueError, match="renorm takes top_k or top_p"):
        module.renorm_probs(torch.empty_like(P), P, None, None, 1, 1.0, 4)
    assert module.dtype() == "float32"


def test_seed_and_offset_sources() -> None:
    cpu = torch.device("cpu")
    assert rng.philox_seed_offset(cpu, seed=5) == (5, 0)
    assert rng.philox_seed_offset(cpu, seed=2**64 - 1, offset=9) == (2**64 - 1, 9)
    # both given: they win over a generator, which is left untouched (as in the reference)
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert rng.philox_seed_offset(cpu, g, seed=5, offset=6) == (5, 6)
    assert torch.equal(g.get_state(), state)
    seeds, offsets = torch.ones(1, dtype=I64), torch.zeros(4, dtype=torch.uint64)
    got = rng.philox_seed_offset(cpu, seed=seeds, offset=offsets)
    assert got[0] is seeds and got[1] is offsets
    a = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(3))
    b = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(3))
    c = rng.philox_seed_offset(cpu, torch.Generator().manual_seed(4))
    assert a == b != c and a[1] == 0 and 0 <= a[0] < 2**64
    assert rng.as_int64(2**64 - 1) == -1 and rng.as_int64(5) == 5
    with pytest.raises(ValueError, match="offset must be in"):
        rng.philox_seed_offset(cpu, seed=1, offset=2**64)


class _StandInCudaGenerator(torch.Generator):
    """A torch.Generator reporting a CUDA device, its state a CUDA generator's (seed and
    offset), so the device match runs without a GPU."""

    def __new__(cls, device: str, seed: int, offset: int) -> "_StandInCudaGenerator":
        return super().__new__(cls)

    def __init__(self, device: str, seed: int, offset: int) -> None:
        self._device = torch.device(device)
        self.state = torch.tensor([seed, offset], dtype=I64).view(torch.uint8)

    @property
    def device(self) -> torch.device:
        return self._device

    def get_state(self) -> torch.Tensor:
        return self.state.clone()

    def set_state(self, state: torch.Tensor) -> None:
        self.state = state.clone()


def test_an_index_less_cuda_generator_is_the_current_devices(monkeypatch) -> None:
    """torch.Generator(device="cuda") reports device "cuda": it matches an input on the
    current device and no other."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    g = _StandInCudaGenerator("cuda", seed=11, offset=8)
    assert rng.philox_seed_offset(torch.device("cuda:1"), g) == (11, 8)
    assert g.get_state().view(I64).tolist() == [11, 8 + rng.OFFSET_INCREMENT]
    assert rng.philox_seed_offset(torch.device("cuda"), g) == (11, 12)
    with pytest.raises(ValueError, match="generator is on cuda, the input on cuda:0"):
        rng.philox_seed_offset(torch.device("cuda:0"), g)
    with pytest.raises(ValueError, match="generator is on cuda:0, the input on cuda:1"):
        rng.philox_seed_offset(torch.device("cuda:1"), _StandInCudaGenerator("cuda:0", 1, 0))


def test_a_call_consumes_whole_philox_blocks_of_words_per_row() -> None:
    assert [sampling_api._words_per_row(v) for v in (1, 4, 5, 128256)] == [4, 4, 8, 128256]


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
        "}\n"
    )
    lines = run_host_program(source, tmp_path / "kat")
    assert lines[:3] == [" ".join(f"{w:08x}" for w in block) for block in KNOWN_ANSWERS]


KNOWN_ANSWERS = [
    (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
]


def test_the_python_philox_model_matches_the_known_answers() -> None:
    m = 0xFFFFFFFF
    got = [
        reference.philox4x32_10((0, 0, 0, 0), (0, 0)),
        reference.philox4x32_10((m, m, m, m), (m, m)),
        reference.philox4x32_10(
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)
        ),
    ]
    assert got == KNOWN_ANSWERS


def _float_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def test_host_harness_counter_layout_uniforms_and_key_order(tmp_path) -> None:
    """tests/ops/sampling_harness.cc runs philox.h on the host. Its Philox words must be
    those of an independent model of the curand/torch layout (word p of a subsequence is lane
    p % 4 of block p // 4), its uniforms lie in (0, 1) (never 1.0f, over a sweep of the
    32-bit inputs), and -0.0 ties +0.0 in the key order."""
    lines = run_host_program(
        REPO_ROOT / "tests" / "ops" / "sampling_harness.cc", tmp_path / "harness"
    )
    rows = [line.split() for line in lines if line]
    words = [list(map(int, r[1:])) for r in rows if r[0] == "words"]
    assert len(words) == 8
    for seed, subsequence, offset, group, *got in words:
        assert got == reference.philox_words(seed, subsequence, offset + 4 * group, 4)
    uniforms = {int(r[1]): int(r[2]) for r in rows if r[0] == "uniform"}
    for bits, got in uniforms.items():
        assert got == _float_bits(reference.uniform_open01(bits)), bits
    assert uniforms[0] == _float_bits(2.0**-33)
    assert uniforms[0xFFFFFFFF] == _float_bits(1 - 2.0**-24)  # the largest float below 1
    assert reference.curand_uniform(0xFFFFFFFF) == 0.0  # curand's mapping reached 1.0 there
    keys = [int(r[2]) for r in rows if r[0] == "key"]  # -inf -1 -tiny -0 +0 tiny 1 inf
    assert keys[3] == keys[4]
    distinct = keys[:4] + keys[5:]
    assert all(a < b for a, b in zip(distinct, distinct[1:]))
    assert any(line.startswith("sweep ok") for line in lines), [r for r in lines if "sweep" in r]


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


def random_probs(
    batch: int, vocab: int, seed: int, device: str = "cuda", spread: float = 2.0
) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(batch, vocab, device=device, generator=gen) * spread
    return torch.softmax(logits, dim=-1)


def near_boundary(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Elements whose top-p membership is within fixed-point/rounding reach (1e-5 of the
    row's mass)."""
    p = probs.double()
    top = torch.as_tensor(top_p, device=p.device, dtype=torch.float64).reshape(-1, 1)
    total = p.sum(-1, keepdim=True)
    return (reference.mass_above(p) - top * total).abs() < 1e-5 * total


# The checks below take the device their tensors live on: "cuda" in the GPU tests here, "cpu"
# in tests/ops/test_sampling_emulated.py, where the kernels' own source runs on the emulator.


def check_softmax(device: str, dtype: torch.dtype, vocab: int) -> None:
    torch.manual_seed(vocab)
    logits = (torch.randn(5, vocab + 3, device=device) * 4).to(dtype)[:, 3:]  # unaligned rows
    temps = torch.rand(5, device=device) + 0.3
    for temperature in (None, 0.7, temps):
        t = 1.0 if temperature is None else temperature
        t = t.reshape(-1, 1).double() if isinstance(t, torch.Tensor) else t
        want = torch.softmax(logits.double() / t, dim=-1)
        got = flashinfer.softmax(logits, temperature)
        assert got.dtype == torch.float32 and got.shape == logits.shape
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 4097, 32000, 128256])
def test_softmax_matches_torch(dtype, vocab) -> None:
    check_softmax("cuda", dtype, vocab)


def check_top_k_renorm_and_mask(device: str, vocab: int) -> None:
    probs = random_probs(6, vocab, vocab, device)
    ks = torch.tensor([1, 2, 5, vocab // 2 + 1, vocab - 1, vocab], device=device).clamp(1, vocab)
    for top_k in (3 if vocab > 3 else 1, ks):
        keep = reference.top_k_set(probs, top_k)
        got = flashinfer.top_k_renorm_probs(probs, top_k)
        torch.testing.assert_close(
            got.double(), reference.renormalize(probs, keep), atol=1e-6, rtol=1e-5
        )
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.log(probs).to(dtype)
            lkeep = reference.top_k_set(logits.float(), top_k)
            masked = flashinfer.top_k_mask_logits(logits, top_k)
            assert masked.dtype == dtype
            assert torch.equal(masked, torch.where(lkeep, logits, float("-inf")).to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [10, 1000, 32000, 128256])
def test_top_k_renorm_and_mask_match_the_reference(vocab) -> None:
    check_top_k_renorm_and_mask("cuda", vocab)


def check_top_k_keeps_ties(device: str) -> None:
    probs = torch.tensor([[0.1, 0.3, 0.2, 0.2, 0.2]], device=device)
    got = flashinfer.top_k_renorm_probs(probs, 2)
    torch.testing.assert_close(got.cpu(), torch.tensor([[0.0, 0.3, 0.2, 0.2, 0.2]]) / 0.9)


@pytest.mark.gpu
def test_top_k_keeps_ties_with_the_kth() -> None:
    check_top_k_keeps_ties("cuda")


def check_top_p_renorm(device: str, vocab: int) -> None:
    probs = random_probs(6, vocab, vocab + 1, device)
    ps = torch.tensor([0.01, 0.1, 0.5, 0.9, 0.999, 1.0], device=device)
    for top_p in (0.7, ps):
        keep = reference.top_p_set(probs, top_p)
        got = flashinfer.top_p_renorm_probs(probs, top_p)
        kept = got > 0
        free = near_boundary(probs, top_p)
        assert torch.equal(kept[~free], keep[~free])
        torch.testing.assert_close(
            got.double(), reference.renormalize(probs, kept), atol=1e-6, rtol=1e-5
        )


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [10, 1000, 32000, 128256])
def test_top_p_renorm_matches_the_reference(vocab) -> None:
    check_top_p_renorm("cuda", vocab)


def _draws(api, probs: torch.Tensor, n: int, **kwargs) -> torch.Tensor:  # noqa: ANN001
    """n draws from row 0 of probs in one call (indices repeat the row)."""
    indices = torch.zeros(n, dtype=I32, device=probs.device)
    return api(probs, indices=indices, seed=1234, offset=0, **kwargs)


def top_p_set(probs: torch.Tensor, top_p: float, wide: bool) -> torch.Tensor:
    """The top-p set; ``wide``: with the elements whose membership is decided in fixed point
    (see near_boundary) added."""
    keep = reference.top_p_set(probs, top_p)
    return keep | (near_boundary(probs, top_p) & (probs > 0)) if wide else keep


# (name, api, kwargs, allowed(probs, wide): the set a row's token may come from)
Api = Callable[..., Any]
Allowed = Callable[[torch.Tensor, bool], torch.Tensor]
SAMPLERS = [
    (
        "plain",
        flashinfer.sampling_from_probs,
        {},
        lambda p, wide: torch.ones_like(p, dtype=torch.bool),
    ),
    (
        "top_k",
        flashinfer.top_k_sampling_from_probs,
        dict(top_k=7),
        lambda p, wide: reference.top_k_set(p, 7),
    ),
    (
        "top_p",
        flashinfer.top_p_sampling_from_probs,
        dict(top_p=0.6),
        lambda p, wide: top_p_set(p, 0.6, wide),
    ),
    (
        "min_p",
        flashinfer.min_p_sampling_from_probs,
        dict(min_p=0.2),
        lambda p, wide: reference.min_p_set(p, 0.2),
    ),
    (
        "joint",
        flashinfer.top_k_top_p_sampling_from_probs,
        dict(top_k=10, top_p=0.5, filter_apply_order="joint"),
        lambda p, wide: reference.top_k_set(p, 10) & top_p_set(p, 0.5, wide),
    ),
    (
        "top_k_first",
        flashinfer.top_k_top_p_sampling_from_probs,
        dict(top_k=10, top_p=0.5, filter_apply_order="top_k_first"),
        lambda p, wide: top_p_set(reference.renormalize(p, reference.top_k_set(p, 10)), 0.5, wide),
    ),
]
SAMPLER_IDS = [s[0] for s in SAMPLERS]


@pytest.mark.gpu
@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=SAMPLER_IDS)
def test_sampled_distribution_matches_the_renormalized_reference(
    name, api, kwargs, allowed
) -> None:
    probs = random_probs(1, 64, 7, spread=1.0)
    keep = allowed(probs, False)
    tokens = _draws(api, probs, 200_000, **kwargs)
    assert tokens.dtype == I32 and tokens.shape == (200_000,)
    assert_distribution(tokens, reference.renormalize(probs, keep)[0])


def check_tokens_in_allowed_set(
    device: str, api: Api, kwargs: dict, allowed: Allowed, vocab: int, batch: int, draws: int
) -> None:
    probs = random_probs(batch, vocab, vocab, device)
    keep = allowed(probs, True)
    for draw in range(draws):
        tokens = api(probs, seed=99, offset=draw, **kwargs).long()
        assert ((tokens >= 0) & (tokens < vocab)).all()
        assert keep.gather(1, tokens[:, None]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=SAMPLER_IDS)
@pytest.mark.parametrize("vocab", [3, 4097, 128256, 262144])
def test_every_token_lies_in_the_allowed_set(name, api, kwargs, allowed, vocab) -> None:
    check_tokens_in_allowed_set("cuda", api, kwargs, allowed, vocab, batch=64, draws=8)


def race_checks(
    tokens: torch.Tensor,
    probs: torch.Tensor,
    seeds: list[int],
    offsets: list[int],
    keep: torch.Tensor | None = None,
) -> int:
    """Compares each row's token with the host model of the kernel's race (subsequence =
    output row); rows whose winner is within 1e-4 of the runner-up (where float rounding of
    log1p may differ between host and device) are skipped. Returns the rows compared."""
    compared = 0
    for row, (seed, offset) in enumerate(zip(seeds, offsets)):
        want, margin = reference.exponential_race(
            probs[row], seed % 2**64, offset % 2**64, row, None if keep is None else keep[row]
        )
        if margin > 1e-4:
            assert int(tokens[row]) == want, (row, seed, offset)
            compared += 1
    return compared


def check_filtered_tokens_follow_the_race(
    device: str, api: Api, kwargs: dict, allowed: Allowed, offset: int
) -> None:
    """Every sampler's token is the race's winner over its allowed set: the row's own
    (top-p's boundary elements decided either way give the same winner, else the row is
    skipped)."""
    probs = random_probs(16, 300, 17, device, spread=1.0)
    seed = 0xFEDCBA9876543210
    tokens = api(probs, seed=seed, offset=offset, **kwargs)
    exact, wide = allowed(probs, False), allowed(probs, True)
    compared = 0
    for row in range(16):
        want, margin = reference.exponential_race(probs[row], seed, offset, row, exact[row])
        widened, _ = reference.exponential_race(probs[row], seed, offset, row, wide[row])
        if margin > 1e-4 and want == widened:
            assert int(tokens[row]) == want, row
            compared += 1
    assert compared >= 10


@pytest.mark.gpu
@pytest.mark.parametrize("name,api,kwargs,allowed", SAMPLERS, ids=SAMPLER_IDS)
def test_filtered_tokens_follow_the_race(name, api, kwargs, allowed) -> None:
    check_filtered_tokens_follow_the_race("cuda", api, kwargs, allowed, offset=6)


def check_per_request_parameters(device: str, draws: int) -> None:
    probs = random_probs(4, 5000, 3, device)
    top_k = torch.tensor([1, 5, 50, 5000], device=device)
    top_p = torch.tensor([0.05, 0.3, 0.8, 1.0], device=device)
    keep = reference.top_k_set(probs, top_k) & (
        reference.top_p_set(probs, top_p) | near_boundary(probs, top_p)
    )
    for draw in range(draws):
        tokens = flashinfer.top_k_top_p_sampling_from_probs(
            probs, top_k, top_p, filter_apply_order="joint", seed=5, offset=draw
        ).long()
        assert keep.gather(1, tokens[:, None]).all()
        assert tokens[0] == probs[0].argmax()


@pytest.mark.gpu
def test_per_request_parameters_apply_row_by_row() -> None:
    check_per_request_parameters("cuda", draws=20)


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_large_batch_and_vocab(order: str) -> None:
    """Each order's own set (top_k_first's top-p of the renormalized top-k is a subset of the
    joint set, so checking both against the joint one could not tell them apart). The
    float64 reference runs 128 rows at a time: whole, it holds ~20 GiB at once, past a
    share of a GPU that several test processes use."""
    probs = random_probs(1024, 262144, 11, spread=3.0)
    tokens = flashinfer.top_k_top_p_sampling_from_probs(
        probs, 50, 0.9, filter_apply_order=order, seed=1
    ).long()
    for rows, drawn in zip(probs.split(128), tokens.split(128)):
        top_k = reference.top_k_set(rows, 50)
        if order == "joint":
            keep = top_k & top_p_set(rows, 0.9, True)
        else:
            keep = top_p_set(reference.renormalize(rows, top_k), 0.9, True)
        assert keep.gather(1, drawn[:, None]).all()


def check_crowded_histogram_bins(device: str, vocab: int, shift: int) -> None:
    """Rows of four distinct values send whole warps into one histogram bin at every radix
    level (warp-aggregated adds; a bin's mass carries between its two 32-bit words). shift 1
    starts rows off the 4-element boundary (scalar loads); odd vocabularies end mid-warp."""
    gen = torch.Generator(device=device).manual_seed(vocab + shift)
    levels = torch.tensor([1.0, 3.0, 9.0, 27.0], device=device)
    raw = levels[torch.randint(0, 4, (5, vocab + shift), device=device, generator=gen)]
    probs = (raw / raw.sum(-1, keepdim=True))[:, shift:]
    for top_k in (1, vocab // 3, vocab - 1):
        keep = reference.top_k_set(probs, top_k)
        assert torch.equal(flashinfer.top_k_renorm_probs(probs, top_k) > 0, keep)
        logits = probs.log()
        masked = flashinfer.top_k_mask_logits(logits, top_k)
        lkeep = reference.top_k_set(logits, top_k)
        assert torch.equal(masked, torch.where(lkeep, logits, float("-inf")))
    for top_p in (0.3, 0.8):
        keep = reference.top_p_set(probs, top_p)
        free = near_boundary(probs, top_p)
        kept = flashinfer.top_p_renorm_probs(probs, top_p) > 0
        assert torch.equal(kept[~free], keep[~free])
    top_k_set = reference.top_k_set(probs, vocab // 2)
    in_top_k = reference.renormalize(probs, top_k_set)
    allowed = top_k_set & (reference.top_p_set(in_top_k, 0.5) | near_boundary(in_top_k, 0.5))
    for draw in range(4):
        tokens = flashinfer.top_k_top_p_sampling_from_probs(
            probs, vocab // 2, 0.5, filter_apply_order="top_k_first", seed=3, offset=draw
        ).long()
        assert allowed.gather(1, tokens[:, None]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [33, 4099, 128257])
@pytest.mark.parametrize("shift", [0, 1])
def test_crowded_histogram_bins_select_exact_sets(vocab, shift) -> None:
    check_crowded_histogram_bins("cuda", vocab, shift)


@pytest.mark.gpu
def test_sampling_from_logits_matches_softmax() -> None:
    logits = torch.randn(1, 64, device="cuda") * 1.5
    logits[0, 5] = float("-inf")
    tokens = _draws(flashinfer.sampling_from_logits, logits, 200_000)
    assert_distribution(tokens, torch.softmax(logits.double(), -1)[0])
    for dtype in (torch.float16, torch.bfloat16):
        half = _draws(flashinfer.sampling_from_logits, logits.to(dtype), 200_000)
        assert_distribution(half, torch.softmax(logits.to(dtype).double(), -1)[0])


def check_logits_tokens_follow_the_race(device: str, dtype: torch.dtype) -> None:
    """argmax(logit - log E) is argmax(softmax / E) on the same variates: the host model of
    the race over the softmax names each token (near ties skipped)."""
    logits = (torch.randn(16, 200, device=device) * 1.5).to(dtype)
    logits[3, :150] = float("-inf")
    seed, offset = 0x0123456789ABCDEF, 9
    tokens = flashinfer.sampling_from_logits(logits, seed=seed, offset=offset)
    probs = torch.softmax(logits.float(), -1)
    assert race_checks(tokens, probs, [seed] * 16, [offset] * 16) >= 12


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_tokens_follow_the_race(dtype) -> None:
    check_logits_tokens_follow_the_race("cuda", dtype)


def check_logits_filters_are_softmax_then_probs(device: str, batch: int) -> None:
    logits = torch.randn(batch, 3000, device=device, dtype=torch.bfloat16) * 3
    for order in ("top_k_first", "joint"):
        a = flashinfer.top_k_top_p_sampling_from_logits(
            logits, 20, 0.8, filter_apply_order=order, seed=3, offset=4
        )
        b = flashinfer.top_k_top_p_sampling_from_probs(
            flashinfer.softmax(logits), 20, 0.8, filter_apply_order=order, seed=3, offset=4
        )
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_top_k_top_p_from_logits_is_softmax_then_probs() -> None:
    check_logits_filters_are_softmax_then_probs("cuda", batch=16)


def check_same_seed_same_tokens(device: str, batch: int, vocab: int) -> None:
    probs = random_probs(batch, vocab, 21, device)
    a = flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=8)
    assert torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=8))
    assert not torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=42, offset=12))
    assert not torch.equal(a, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=43, offset=8))
    g = torch.Generator(device=device).manual_seed(7)
    first = flashinfer.sampling_from_probs(probs, generator=g)
    second = flashinfer.sampling_from_probs(probs, generator=g)
    assert not torch.equal(first, second)
    again = flashinfer.sampling_from_probs(
        probs, generator=torch.Generator(device=device).manual_seed(7)
    )
    assert torch.equal(first, again)


@pytest.mark.gpu
def test_same_seed_same_tokens_and_generators_advance() -> None:
    check_same_seed_same_tokens("cuda", batch=256, vocab=32000)
    probs = random_probs(256, 32000, 21)
    torch.manual_seed(0)
    x = flashinfer.sampling_from_probs(probs)
    torch.manual_seed(0)
    assert torch.equal(x, flashinfer.sampling_from_probs(probs))


@pytest.mark.gpu
def test_same_seed_same_tokens_in_a_fresh_process() -> None:
    code = (
        "import torch, flashinfer\n"
        "g = torch.Generator(device='cuda').manual_seed(5)\n"
        "p = torch.softmax(torch.randn(64, 50000, device='cuda', generator=g) * 2, -1)\n"
        "t = flashinfer.top_k_top_p_sampling_from_probs(p, 40, 0.9, seed=77, offset=3)\n"
        "print(','.join(map(str, t.tolist())))\n"
    )
    here = run_python(code).stdout.strip().splitlines()[-1]
    there = run_python(code).stdout.strip().splitlines()[-1]
    assert here == there and len(here.split(",")) == 64


def check_degenerate_rows(device: str) -> None:
    vocab = 1000
    one_hot = torch.zeros(3, vocab, device=device)
    one_hot[torch.arange(3), torch.tensor([0, 517, 999])] = 1.0
    for api, kwargs in (
        (flashinfer.sampling_from_probs, {}),
        (flashinfer.top_k_sampling_from_probs, dict(top_k=5)),
        (flashinfer.top_p_sampling_from_probs, dict(top_p=0.3)),
        (flashinfer.min_p_sampling_from_probs, dict(min_p=0.5)),
    ):
        assert api(one_hot, seed=1, **kwargs).tolist() == [0, 517, 999]
    probs = random_probs(32, vocab, 4, device)
    assert torch.equal(
        flashinfer.top_k_sampling_from_probs(probs, 1, seed=2).long(), probs.argmax(-1)
    )
    plain = flashinfer.sampling_from_probs(probs, seed=9, offset=1)
    assert torch.equal(flashinfer.top_p_sampling_from_probs(probs, 1.0, seed=9, offset=1), plain)
    assert torch.equal(flashinfer.top_k_sampling_from_probs(probs, vocab, seed=9, offset=1), plain)
    assert torch.equal(flashinfer.min_p_sampling_from_probs(probs, 0.0, seed=9, offset=1), plain)
    logits = torch.full((4, vocab), float("-inf"), device=device)
    logits[torch.arange(4), torch.tensor([3, 0, 999, 400])] = torch.randn(4, device=device)
    assert flashinfer.sampling_from_logits(logits, seed=3).tolist() == [3, 0, 999, 400]
    assert flashinfer.top_k_top_p_sampling_from_logits(logits, 10, 0.5, seed=3).tolist() == [
        3,
        0,
        999,
        400,
    ]


@pytest.mark.gpu
def test_degenerate_rows() -> None:
    check_degenerate_rows("cuda")


def check_indices_map_outputs_to_rows(device: str) -> None:
    probs = torch.zeros(3, 100, device=device)
    probs[0, 10] = probs[1, 20] = probs[2, 30] = 1.0
    indices = torch.tensor([2, 0, 0, 1, 3, -1], dtype=I32, device=device)
    assert flashinfer.sampling_from_probs(probs, indices=indices, seed=0).tolist() == [
        30,
        10,
        10,
        20,
        -1,
        -1,
    ]
    from_logits = flashinfer.sampling_from_logits(probs.log(), indices=indices.long(), seed=0)
    assert from_logits.tolist() == [30, 10, 10, 20, -1, -1]
    zero_row = torch.zeros(1, 100, device=device)
    assert flashinfer.sampling_from_probs(zero_row, seed=0).tolist() == [0]


@pytest.mark.gpu
def test_indices_map_outputs_to_rows_and_out_of_range_yields_minus_one() -> None:
    check_indices_map_outputs_to_rows("cuda")


def check_nan_raises(device: str) -> None:
    probs = random_probs(2, 100, 0, device)
    probs[1, 3] = float("nan")
    with pytest.raises(ValueError, match="probs contains NaN"):
        flashinfer.sampling_from_probs(probs, check_nan=True, seed=0)


@pytest.mark.gpu
def test_check_nan_raises() -> None:
    check_nan_raises("cuda")


@pytest.mark.gpu
def test_softmax_with_pdl_after_another_kernel() -> None:
    logits = torch.randn(64, 32000, device="cuda")
    for _ in range(3):
        logits.mul_(1.01)  # a kernel right before: PDL must still see its result
        got = flashinfer.softmax(logits, enable_pdl=True)
        torch.testing.assert_close(got, torch.softmax(logits, -1), atol=1e-6, rtol=1e-4)


def check_counter_layout(device: str, offset: int) -> None:
    """Element j of output row r races with E = -log1p(-u), u from word offset + j of Philox
    subsequence r (the curand/torch layout), for offsets in and across Philox blocks."""
    probs = random_probs(16, 100, 3, device, spread=1.0)
    seed = 0x123456789ABCDEF0
    tokens = flashinfer.sampling_from_probs(probs, seed=seed, offset=offset)
    assert race_checks(tokens, probs, [seed] * 16, [offset] * 16) >= 12
    keep = reference.top_k_set(probs, 10)
    tokens = flashinfer.top_k_sampling_from_probs(probs, 10, seed=seed, offset=offset)
    assert race_checks(tokens, probs, [seed] * 16, [offset] * 16, keep) >= 12


OFFSETS = [0, 1, 2, 3, 4, 7, 2**40 + 5, 2**64 - 3]


@pytest.mark.gpu
@pytest.mark.parametrize("offset", OFFSETS)
def test_tokens_follow_the_documented_counter_layout(offset) -> None:
    check_counter_layout("cuda", offset)


def check_seed_and_offset_tensors(device: str, dtype: torch.dtype) -> None:
    probs = random_probs(8, 300, 12, device, spread=1.0)
    seeds = [2**63 + 11 * r for r in range(8)]  # beyond int64: stored in two's complement
    offsets = [4 * r + (r % 3) for r in range(8)]
    as_tensor = [s if dtype == torch.uint64 else rng.as_int64(s) for s in seeds]
    seed_t = torch.tensor(as_tensor, dtype=dtype, device=device)
    offset_t = torch.tensor(offsets, dtype=dtype, device=device)
    tokens = flashinfer.sampling_from_probs(probs, seed=seed_t, offset=offset_t)
    assert race_checks(tokens, probs, seeds, offsets) >= 6
    one_seed, one_offset = seed_t[:1].clone(), offset_t[:1].clone()
    shared = flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=one_seed, offset=one_offset)
    assert torch.equal(
        shared, flashinfer.top_p_sampling_from_probs(probs, 0.9, seed=seeds[0], offset=offsets[0])
    )
    logits = torch.log(probs)
    assert torch.equal(
        flashinfer.sampling_from_logits(logits, seed=one_seed, offset=one_offset),
        flashinfer.sampling_from_logits(logits, seed=seeds[0], offset=offsets[0]),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_seed_and_offset_tensors_per_row_and_shared(dtype) -> None:
    check_seed_and_offset_tensors("cuda", dtype)


@pytest.mark.gpu
def test_seed_tensors_make_cuda_graph_replays_draw_fresh_tokens() -> None:
    probs = random_probs(32, 4000, 13)
    seed = torch.tensor([7], dtype=torch.int64, device="cuda")
    offset = torch.tensor([0], dtype=torch.int64, device="cuda")
    flashinfer.top_k_top_p_sampling_from_probs(probs, 50, 0.9, seed=seed, offset=offset)  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = flashinfer.top_k_top_p_sampling_from_probs(
            probs, 50, 0.9, seed=seed, offset=offset
        )
    replays = []
    for step in (1, 2):
        offset.fill_(4000 * step)
        graph.replay()
        torch.cuda.synchronize()
        want = flashinfer.top_k_top_p_sampling_from_probs(
            probs, 50, 0.9, seed=7, offset=4000 * step
        )
        assert torch.equal(tokens, want)
        replays.append(tokens.clone())
    assert not torch.equal(replays[0], replays[1])


@pytest.mark.gpu
def test_generator_draws_do_not_overlap_torch_streams() -> None:
    """A call with a generator draws words [offset, offset + 4 * ceil(vocab / 4)) of
    subsequences 0 .. batch - 1 (what torch.rand would have drawn there) and advances the
    generator past them, so torch's next draw is fresh."""
    vocab = 1001  # 251 Philox blocks per row: the call consumes 1004 offsets
    probs = random_probs(4, vocab, 5, spread=1.0)
    g = torch.Generator(device="cuda").manual_seed(2024)
    start = g.get_state()
    seed, offset = (int(v) % 2**64 for v in start.view(torch.int64).tolist())
    twin = torch.Generator(device="cuda")
    twin.set_state(start)
    at_start = torch.rand(4, generator=twin, device="cuda").cpu()
    # torch's layout: element i of torch.rand(4) is word `offset` of subsequence i
    model = [
        reference.curand_uniform(reference.philox_words(seed, i, offset, 1)[0]) for i in range(4)
    ]
    assert at_start.tolist() == model
    tokens = flashinfer.sampling_from_probs(probs, generator=g)
    assert race_checks(tokens, probs, [seed] * 4, [offset] * 4) >= 3
    assert int(g.get_state().view(torch.int64)[1]) == offset + 1004
    after = torch.rand(4, generator=g, device="cuda").cpu()
    assert after.tolist() != at_start.tolist()
    assert after.tolist() == [
        reference.curand_uniform(reference.philox_words(seed, i, offset + 1004, 1)[0])
        for i in range(4)
    ]


def check_top_p_set_is_scale_free(device: str, scale: float, batch: int, vocab: int) -> None:
    """Top-p's fixed point is relative to the row's total: p * 2^a keeps the same set, with
    the same renormalized values, as p."""
    probs = random_probs(batch, vocab, 9, device)
    base = flashinfer.top_p_renorm_probs(probs, 0.5)
    got = flashinfer.top_p_renorm_probs(probs * scale, 0.5)
    assert torch.equal(got > 0, base > 0)
    assert torch.equal(got, base)
    tokens = flashinfer.top_p_sampling_from_probs(probs * scale, 0.5, seed=1)
    assert torch.equal(tokens, flashinfer.top_p_sampling_from_probs(probs, 0.5, seed=1))


POWER_SCALES = [2.0**-23, 2.0**-10, 2.0**10, 2.0**27]  # 1.2e-7 .. 1.3e8


@pytest.mark.gpu
@pytest.mark.parametrize("scale", POWER_SCALES)
def test_top_p_set_does_not_depend_on_the_rows_scale(scale) -> None:
    check_top_p_set_is_scale_free("cuda", scale, batch=8, vocab=32000)


def check_top_p_at_any_scale(device: str, scale: float, batch: int, vocab: int) -> None:
    q = random_probs(batch, vocab, 10, device) * scale
    for top_p in (0.3, 0.9):
        keep = reference.top_p_set(q, top_p)
        got = flashinfer.top_p_renorm_probs(q, top_p)
        free = near_boundary(q, top_p)
        assert torch.equal((got > 0)[~free], keep[~free])
        torch.testing.assert_close(
            got.double(), reference.renormalize(q, got > 0), atol=1e-6, rtol=1e-5
        )


SCALES = [1e-7, 1e-3, 1e4, 1e8]


@pytest.mark.gpu
@pytest.mark.parametrize("scale", SCALES)
def test_top_p_matches_the_reference_at_any_row_scale(scale) -> None:
    check_top_p_at_any_scale("cuda", scale, batch=8, vocab=32000)


def check_wide_indices_and_top_k(device: str) -> None:
    probs = random_probs(3, 500, 8, device)
    indices = torch.tensor([0, 2**32, 2**31, -(2**32) + 1, 2, 1], dtype=I64, device=device)
    tokens, valid = flashinfer.top_k_sampling_from_probs(
        probs, 3, indices=indices, seed=4, return_valid=True
    )
    assert tokens.dtype == I64 and valid.dtype == torch.bool
    assert tokens[1:4].tolist() == [-1, -1, -1]
    assert valid.view(torch.uint8).tolist() == [1, 0, 0, 0, 1, 1]
    keep = reference.top_k_set(probs, 3)
    for out_row, row in ((0, 0), (4, 2), (5, 1)):
        assert keep[row, tokens[out_row]]
    top_k = torch.tensor([2**32 + 1, 2**40, -(2**33)], dtype=I64, device=device)
    plain = flashinfer.sampling_from_probs(probs, seed=11, offset=0)
    assert torch.equal(flashinfer.top_k_sampling_from_probs(probs, top_k, seed=11, offset=0), plain)
    logits = torch.log(probs)
    assert torch.equal(flashinfer.top_k_mask_logits(logits, top_k), logits)


@pytest.mark.gpu
def test_wide_indices_and_top_k_are_not_narrowed() -> None:
    check_wide_indices_and_top_k("cuda")


def check_signed_zeros_tie(device: str, dtype: torch.dtype) -> None:
    logits = torch.tensor(
        [[0.0, -0.0, -1.0], [-0.0, 0.0, -1.0], [-1.0, -0.0, 0.0]], dtype=dtype, device=device
    )
    got = flashinfer.top_k_mask_logits(logits, 1)
    assert torch.isinf(got).cpu().tolist() == [[False, False, True]] * 2 + [[True, False, False]]
    probs = torch.tensor([[0.5, 0.0, -0.0, 0.5]], device=device)
    assert flashinfer.top_k_renorm_probs(probs, 2).cpu().tolist() == [[0.5, 0.0, 0.0, 0.5]]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_signed_zeros_tie_in_the_key_order(dtype) -> None:
    check_signed_zeros_tie("cuda", dtype)


def check_return_valid(device: str) -> None:
    probs = random_probs(4, 100, 1, device)
    probs[2] = 0
    for api, kwargs in (
        (flashinfer.sampling_from_probs, {}),
        (flashinfer.top_p_sampling_from_probs, dict(top_p=0.5)),
        (flashinfer.top_k_sampling_from_probs, dict(top_k=5)),
        (flashinfer.min_p_sampling_from_probs, dict(min_p=0.5)),
        (flashinfer.top_k_top_p_sampling_from_probs, dict(top_k=5, top_p=0.5)),
    ):
        tokens, valid = api(probs, seed=1, return_valid=True, **kwargs)
        assert tokens.dtype == I32 and valid.dtype == torch.bool
        assert valid.view(torch.uint8).tolist() == [1, 1, 0, 1] and tokens[2] == 0
        assert torch.equal(tokens, api(probs, seed=1, **kwargs))


@pytest.mark.gpu
def test_return_valid_flags_rows_with_nothing_to_draw() -> None:
    check_return_valid("cuda")


def check_16_and_64_bit_inputs(device: str) -> None:
    probs = random_probs(8, 1000, 6, device)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = probs.to(dtype)
        assert torch.equal(
            flashinfer.top_p_sampling_from_probs(x, 0.8, seed=3),
            flashinfer.top_p_sampling_from_probs(x.float(), 0.8, seed=3),
        )
        renormed = flashinfer.top_p_renorm_probs(x, 0.8)
        assert renormed.dtype == torch.float32
        assert torch.equal(renormed, flashinfer.top_p_renorm_probs(x.float(), 0.8))
        logits = torch.log(probs).to(dtype)
        assert flashinfer.softmax(logits).dtype == torch.float32
        assert torch.equal(
            flashinfer.sampling_from_logits(logits, seed=2),  # exact widening
            flashinfer.sampling_from_logits(logits.float(), seed=2),
        )
    for dtype in (torch.float16, torch.bfloat16):
        x = probs.to(dtype)
        got = flashinfer.top_k_renorm_probs(x, 10)
        assert got.dtype == dtype
        want = reference.renormalize(x.float(), reference.top_k_set(x.float(), 10))
        torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-2)


@pytest.mark.gpu
def test_16_and_64_bit_inputs() -> None:
    check_16_and_64_bit_inputs("cuda")


def check_temperature_zero_or_inf(device: str) -> None:
    logits = torch.randn(3, 10, device=device) * 4
    logits[1, 3] = float("-inf")
    want = torch.full((3, 10), 0.1, device=device, dtype=torch.float64)
    want[1] = 1 / 9
    want[1, 3] = 0
    for temperature in (0.0, math.inf, torch.tensor([0.0, 0.0, math.inf], device=device)):
        got = flashinfer.softmax(logits, temperature)
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    finite = logits[[0, 2]]
    got = flashinfer.softmax(finite, -2.0)  # softmax(logits / -2), as in the reference
    torch.testing.assert_close(
        got.double(), torch.softmax(finite.double() / -2, -1), atol=1e-6, rtol=1e-4
    )


@pytest.mark.gpu
def test_softmax_temperature_zero_or_inf_is_uniform_over_finite_logits() -> None:
    check_temperature_zero_or_inf("cuda")


def check_out_of_range_parameters(device: str) -> None:
    probs = random_probs(4, 700, 14, device)
    plain = flashinfer.sampling_from_probs(probs, seed=9, offset=4)
    argmax = probs.argmax(-1).int()
    p, a = plain.tolist(), argmax.tolist()
    same = dict(seed=9, offset=4)
    assert torch.equal(flashinfer.top_k_sampling_from_probs(probs, 10**6, **same), plain)
    assert torch.equal(flashinfer.top_p_sampling_from_probs(probs, 1.5, **same), plain)
    assert torch.equal(flashinfer.min_p_sampling_from_probs(probs, -0.5, **same), plain)
    assert torch.equal(flashinfer.min_p_sampling_from_probs(probs, 1.0, **same), argmax)
    per_row_k = torch.tensor([-1, 0, 700, 10**6], dtype=I32, device=device)
    got = flashinfer.top_k_sampling_from_probs(probs, per_row_k, **same)
    assert got.tolist() == [p[0], a[1], p[2], p[3]]
    per_row_p = torch.tensor([0.0, -1.0, 1.0, 2.0], device=device)
    got = flashinfer.top_p_sampling_from_probs(probs, per_row_p, **same)
    assert got.tolist() == [a[0], a[1], p[2], p[3]]
    per_row_min_p = torch.tensor([2.0, 1.0, 0.0, -1.0], device=device)
    got = flashinfer.min_p_sampling_from_probs(probs, per_row_min_p, **same)
    assert got.tolist() == [a[0], a[1], p[2], p[3]]


@pytest.mark.gpu
def test_out_of_range_parameters_follow_the_documented_meaning() -> None:
    check_out_of_range_parameters("cuda")


@pytest.mark.compile_matrix
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_sampling_specialization_compiles(dtype: str) -> None:
    from flashinfer.jit.sampling import gen_sampling_module

    assert gen_sampling_module(dtype).build_and_load().dtype() == dtype
