"""The norm family against the reference library's signatures and call forms.

Parameter lists as in flashinfer-ai/flashinfer flashinfer/norm/__init__.py at commit
0040d23e6a5d7b1fc3c2cc1a1dc4a159a2e525e1 (the same lists at
ba1a6457188bad9ebc82b16e5cfd32e00244538a, where ``scale`` was annotated ``float`` only).
"""

from __future__ import annotations

import pytest
import torch

import flashinfer

from .signature import assert_signature

SIGNATURES = {
    "rmsnorm": "(input, weight, eps=1e-6, out=None, enable_pdl=None)",
    "gemma_rmsnorm": "(input, weight, eps=1e-6, out=None, enable_pdl=None)",
    "fused_add_rmsnorm": "(input, residual, weight, eps=1e-6, enable_pdl=None)",
    "gemma_fused_add_rmsnorm": "(input, residual, weight, eps=1e-6, enable_pdl=None)",
    "rmsnorm_quant": "(out, input, weight, scale, eps=1e-6, enable_pdl=None)",
    "fused_add_rmsnorm_quant": "(out, input, residual, weight, scale, eps=1e-6, enable_pdl=None)",
    "layernorm": "(input, gemma, beta, eps=1e-6)",
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_matches_the_reference(name: str) -> None:
    assert_signature(getattr(flashinfer, name), SIGNATURES[name])


def _x(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def _fp8(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float8_e4m3fn)


# The reference's call forms, with CPU tensors: each must bind and get as far as the device
# check (a ValueError asking for a CUDA tensor), i.e. be accepted for its form.
CALL_FORMS = {
    "rmsnorm positional": lambda: flashinfer.rmsnorm(_x(4, 64), _x(64), 1e-5, _x(4, 64), True),
    "rmsnorm keywords": lambda: flashinfer.rmsnorm(
        input=_x(4, 64), weight=_x(64), eps=1e-5, out=None, enable_pdl=None
    ),
    "rmsnorm 3-D (QK norm)": lambda: flashinfer.rmsnorm(_x(4, 8, 64), _x(64)),
    "gemma_rmsnorm positional": lambda: flashinfer.gemma_rmsnorm(
        _x(4, 64), _x(64), 1e-6, None, False
    ),
    "gemma_rmsnorm keywords": lambda: flashinfer.gemma_rmsnorm(
        input=_x(4, 64), weight=_x(64), out=_x(4, 64), enable_pdl=True
    ),
    "fused_add_rmsnorm positional": lambda: flashinfer.fused_add_rmsnorm(
        _x(4, 64), _x(4, 64), _x(64), 1e-6, False
    ),
    "fused_add_rmsnorm keywords": lambda: flashinfer.fused_add_rmsnorm(
        input=_x(4, 64), residual=_x(4, 64), weight=_x(64), eps=1e-6, enable_pdl=None
    ),
    "gemma_fused_add_rmsnorm positional": lambda: flashinfer.gemma_fused_add_rmsnorm(
        _x(4, 64), _x(4, 64), _x(64), 1e-6, True
    ),
    "gemma_fused_add_rmsnorm keywords": lambda: flashinfer.gemma_fused_add_rmsnorm(
        input=_x(4, 64), residual=_x(4, 64), weight=_x(64)
    ),
    "rmsnorm_quant positional, float scale": lambda: flashinfer.rmsnorm_quant(
        _fp8(4, 64), _x(4, 64), _x(64), 0.5, 1e-6, False
    ),
    "rmsnorm_quant keywords, (1,) scale": lambda: flashinfer.rmsnorm_quant(
        out=_fp8(4, 64),
        input=_x(4, 64),
        weight=_x(64),
        scale=torch.tensor([0.5]),
        eps=1e-6,
        enable_pdl=None,
    ),
    "rmsnorm_quant 0-d scale": lambda: flashinfer.rmsnorm_quant(
        _fp8(4, 64), _x(4, 64), _x(64), torch.tensor(0.5)
    ),
    "fused_add_rmsnorm_quant positional": lambda: flashinfer.fused_add_rmsnorm_quant(
        _fp8(4, 64), _x(4, 64), _x(4, 64), _x(64), torch.tensor([2.0]), 1e-6, True
    ),
    "fused_add_rmsnorm_quant keywords, float scale": lambda: flashinfer.fused_add_rmsnorm_quant(
        out=_fp8(4, 64), input=_x(4, 64), residual=_x(4, 64), weight=_x(64), scale=2.0
    ),
    "layernorm positional": lambda: flashinfer.layernorm(
        _x(4, 64), _x(64, dtype=torch.float32), _x(64, dtype=torch.float32), 1e-5
    ),
    "layernorm keywords": lambda: flashinfer.layernorm(
        input=_x(4, 64),
        gemma=_x(64, dtype=torch.float32),
        beta=_x(64, dtype=torch.float32),
        eps=1e-5,
    ),
}


@pytest.mark.parametrize("form", list(CALL_FORMS))
def test_reference_call_forms_are_accepted(form: str) -> None:
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        CALL_FORMS[form]()


def test_norm_functions_are_exported_at_the_top_level() -> None:
    assert set(SIGNATURES) <= set(flashinfer.__all__)
