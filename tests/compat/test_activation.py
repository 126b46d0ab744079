"""The gated activations against the reference library's signatures and call forms.

Parameter lists as in flashinfer-ai/flashinfer flashinfer/activation.py at commit
0daa58bf3f1acec070b9467df640bc12664dc1db.
"""

from __future__ import annotations

import pytest
import torch

import flashinfer

from .signature import assert_signature

NAMES = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]
SIGNATURE = "(input, out=None, enable_pdl=None)"


@pytest.mark.parametrize("name", NAMES)
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(getattr(flashinfer, name), SIGNATURE)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float16)


# The reference's call forms, with CPU tensors: each must bind and reach the device check.
CALL_FORMS = {
    "input only": lambda api: api(_x(4, 128)),
    "positional": lambda api: api(_x(4, 128), _x(4, 64), True),
    "keywords": lambda api: api(input=_x(2, 3, 128), out=_x(2, 3, 64), enable_pdl=False),
    "enable_pdl=None": lambda api: api(_x(4, 128), enable_pdl=None),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", list(CALL_FORMS))
def test_reference_call_forms_are_accepted(name: str, form: str) -> None:
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        CALL_FORMS[form](getattr(flashinfer, name))
