"""Sampling against the reference's public API: signatures, deprecated aliases, and the call
forms engines use, bound and run on the CPU as far as the device check.

Parameter lists as they read in flashinfer-ai/flashinfer flashinfer/sampling.py at commit
01c897d7075594003c411c0aa5e3befdf0bcae94 (chain_speculative_sampling, a kernel we do not
ship, binds and refuses).
"""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import sampling

from .signature import assert_signature

_SAMPLING_TAIL = "deterministic=True, generator=None, check_nan=False, seed=None, offset=None"
REFERENCE_SIGNATURES = {
    "softmax": "(logits, temperature=None, enable_pdl=None)",
    "sampling_from_logits": f"(logits, indices=None, {_SAMPLING_TAIL})",
    "sampling_from_probs": f"(probs, indices=None, {_SAMPLING_TAIL}, return_valid=False)",
    "top_p_sampling_from_probs": (
        f"(probs, top_p, indices=None, {_SAMPLING_TAIL}, return_valid=False)"
    ),
    "top_k_sampling_from_probs": (
        f"(probs, top_k, indices=None, {_SAMPLING_TAIL}, return_valid=False)"
    ),
    "min_p_sampling_from_probs": (
        f"(probs, min_p, indices=None, {_SAMPLING_TAIL}, return_valid=False)"
    ),
    "top_k_top_p_sampling_from_logits": (
        f"(logits, top_k, top_p, indices=None, filter_apply_order='top_k_first', {_SAMPLING_TAIL})"
    ),
    "top_k_top_p_sampling_from_probs": (
        "(probs, top_k, top_p, indices=None, filter_apply_order='top_k_first', "
        f"{_SAMPLING_TAIL}, return_valid=False)"
    ),
    "top_p_renorm_probs": "(probs, top_p, is_deterministic=False)",
    "top_k_renorm_probs": "(probs, top_k, is_deterministic=False)",
    "top_k_mask_logits": "(logits, top_k)",
    "chain_speculative_sampling": (
        "(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None, "
        "maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None, "
        "seed=None, offset=None)"
    ),
}
ALIASES = {"top_p_renorm_prob": "top_p_renorm_probs", "top_k_renorm_prob": "top_k_renorm_probs"}


@pytest.mark.parametrize("name", sorted(REFERENCE_SIGNATURES))
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(getattr(sampling, name), REFERENCE_SIGNATURES[name])
    assert getattr(flashinfer, name) is getattr(sampling, name)


def test_chain_speculative_sampling_binds_as_tensorrt_llm_calls_it_and_refuses() -> None:
    """TensorRT-LLM imports it with the samplers; we have no kernel for it."""
    probs = torch.rand(2, 3, 50)
    with pytest.raises(NotImplementedError, match="no speculative-sampling kernel"):
        flashinfer.chain_speculative_sampling(
            probs,
            torch.zeros(2, 3, dtype=torch.int32),
            torch.rand(2, 4, 50),
            maybe_output_accepted_token_num=torch.zeros(2, dtype=torch.int32),
            maybe_output_emitted_draft_token_num=torch.zeros(2, dtype=torch.int32),
            deterministic=True,
            generator=None,
            seed=torch.tensor([0]),
            offset=torch.tensor([0]),
        )


def test_get_sampling_module_takes_no_argument_as_the_reference_s(monkeypatch) -> None:
    """Engines build it ahead of use with no argument (TensorRT-LLM's sampler warm-up):
    the float32 module, which serves probabilities and float32 logits."""
    asked = []

    class Spec:
        def build_and_load(self) -> str:
            return "module"

    monkeypatch.setattr(sampling, "gen_sampling_module", lambda d: asked.append(d) or Spec())
    sampling.get_sampling_module.cache_clear()
    try:
        assert sampling.get_sampling_module() == "module" and asked == [torch.float32]
    finally:
        sampling.get_sampling_module.cache_clear()


@pytest.mark.parametrize("alias,name", sorted(ALIASES.items()))
def test_deprecated_aliases_are_the_same_functions(alias: str, name: str) -> None:
    assert getattr(sampling, alias) is getattr(sampling, name)
    assert getattr(flashinfer, alias) is getattr(sampling, name)


PROBS = torch.rand(4, 50) + 0.01
LOGITS = torch.randn(4, 50)
IDX64 = torch.zeros(6, dtype=torch.int64)
SEEDS = dict(seed=torch.tensor([1]), offset=torch.tensor([0], dtype=torch.uint64))
CALL_FORMS = [
    # (api, args, kwargs): how engines and the reference's docs call these
    (flashinfer.softmax, (LOGITS,), {}),
    (flashinfer.softmax, (LOGITS, 0.7, True), {}),
    (
        flashinfer.softmax,
        (LOGITS,),
        dict(temperature=torch.full((4,), 0.5, dtype=torch.float64), enable_pdl=None),
    ),
    (flashinfer.sampling_from_logits, (LOGITS, None, True, None, False, 1, 2), {}),
    (flashinfer.sampling_from_logits, (LOGITS,), dict(indices=IDX64, generator=torch.Generator())),
    (flashinfer.sampling_from_probs, (PROBS, None, True, None, False, 1, 2, True), {}),
    (flashinfer.sampling_from_probs, (PROBS,), dict(deterministic=False, check_nan=True, **SEEDS)),
    (flashinfer.top_p_sampling_from_probs, (PROBS, 0.9, None, True, None, False, 3, 4, False), {}),
    (
        flashinfer.top_p_sampling_from_probs,
        (PROBS,),
        dict(top_p=torch.full((6,), 0.9), indices=IDX64, return_valid=True),
    ),
    (flashinfer.top_k_sampling_from_probs, (PROBS, 20), dict(seed=5, offset=0)),
    (flashinfer.top_k_sampling_from_probs, (PROBS,), dict(top_k=torch.full((4,), 50 * 2**32))),
    (flashinfer.min_p_sampling_from_probs, (PROBS, torch.full((4,), 0.1)), dict(**SEEDS)),
    (flashinfer.min_p_sampling_from_probs, (PROBS,), dict(min_p=0.05, generator=None)),
    (
        flashinfer.top_k_top_p_sampling_from_probs,
        (PROBS, 5, 0.9, None, "joint", True, None, False, 1, 2, True),
        {},
    ),
    (
        flashinfer.top_k_top_p_sampling_from_probs,
        (PROBS,),
        dict(
            top_k=torch.full((4,), 40, dtype=torch.int32),
            top_p=torch.full((4,), 0.8),
            filter_apply_order="top_k_first",
        ),
    ),
    (
        flashinfer.top_k_top_p_sampling_from_logits,
        (LOGITS, 5, 0.9, None, "top_k_first", True, None, False, 1, 2),
        {},
    ),
    (
        flashinfer.top_k_top_p_sampling_from_logits,
        (LOGITS.half(),),
        dict(top_k=1000, top_p=1.0, filter_apply_order="joint", deterministic=True),
    ),
    (flashinfer.top_p_renorm_probs, (PROBS, 0.5, True), {}),
    (flashinfer.top_p_renorm_probs, (PROBS.double(),), dict(top_p=torch.full((4,), 0.5))),
    (flashinfer.top_k_renorm_probs, (PROBS.half(), 10), dict(is_deterministic=True)),
    (flashinfer.top_k_renorm_probs, (PROBS,), dict(top_k=torch.full((4,), 10))),
    (flashinfer.top_k_mask_logits, (LOGITS.bfloat16(), 3), {}),
    (flashinfer.top_k_mask_logits, (LOGITS,), dict(top_k=torch.full((4,), 3))),
    (flashinfer.sampling.top_p_renorm_prob, (PROBS, 0.5), {}),
    (flashinfer.sampling.top_k_renorm_prob, (PROBS, 5), {}),
]


@pytest.mark.parametrize(
    "api,args,kwargs",
    CALL_FORMS,
    ids=[f"{api.__name__}-{i}" for i, (api, _, _) in enumerate(CALL_FORMS)],
)
def test_reference_call_forms_are_accepted(api, args, kwargs) -> None:  # noqa: ANN001
    """Every form binds and passes every check but the device's (CPU tensors here)."""
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        api(*args, **kwargs)
