"""flashinfer.rope as a drop-in for the reference's (flashinfer-ai/flashinfer flashinfer/rope.py,
read at ca14df138621d5a531a4a465a02bab379c849e95): signatures, call forms and return types.
The reference keeps no deprecated aliases for these functions."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import flashinfer
from flashinfer import checks
from flashinfer import rope as rope_api

from ..compile import cpu_kernels
from .signature import assert_signature

ROPE = "(q, k, {ids}, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4)"
LLAMA31 = (
    "(q, k, {ids}, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=5e5, "
    "low_freq_factor=1, high_freq_factor=4, old_context_len=8192)"
)
COS_SIN = "(positions, query, key, head_size, cos_sin_cache, is_neox=True)"

SIGNATURES = {
    "apply_rope": ROPE.format(ids="indptr, offsets"),
    "apply_rope_inplace": ROPE.format(ids="indptr, offsets"),
    "apply_rope_pos_ids": ROPE.format(ids="pos_ids"),
    "apply_rope_pos_ids_inplace": ROPE.format(ids="pos_ids"),
    "apply_llama31_rope": LLAMA31.format(ids="indptr, offsets"),
    "apply_llama31_rope_inplace": LLAMA31.format(ids="indptr, offsets"),
    "apply_llama31_rope_pos_ids": LLAMA31.format(ids="pos_ids"),
    "apply_llama31_rope_pos_ids_inplace": LLAMA31.format(ids="pos_ids"),
    "apply_rope_with_cos_sin_cache": COS_SIN,
    "apply_rope_with_cos_sin_cache_inplace": COS_SIN,
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures(name: str) -> None:
    assert_signature(getattr(flashinfer, name), SIGNATURES[name])


class NoOpModule:
    """Stands in for the compiled module so that return values can be checked on CPU."""

    def __getattr__(self, name: str):  # noqa: ANN204
        return lambda *args: None


@pytest.fixture
def cpu_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(rope_api, "get_rope_module", lambda dtype: NoOpModule())
    monkeypatch.setattr(checks, "check_cuda", lambda name, tensor, like=None: None)
    with cpu_kernels(rope_api):
        yield


def _qk(nnz: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randn(nnz, 4, 64, dtype=torch.float16),
        torch.randn(nnz, 2, 64, dtype=torch.float16),
    )


def _ragged() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([7, 0], dtype=torch.int32)


def _calls(name: str, q: torch.Tensor, k: torch.Tensor) -> list:
    """The reference's call forms of ``name``: positional, keyword, with its parameters."""
    ids = (
        {"pos_ids": torch.arange(q.shape[0])}
        if "pos_ids" in name
        else dict(zip(("indptr", "offsets"), _ragged()))
    )
    api = getattr(flashinfer, name)
    extra = dict(rotary_dim=32, interleave=True, rope_scale=2, rope_theta=1e5)
    if "llama31" in name:
        extra.update(low_freq_factor=1, high_freq_factor=4, old_context_len=4096)
    return [
        lambda: api(q, k, *ids.values()),
        lambda: api(q=q, k=k, **ids),
        lambda: api(q, k, *ids.values(), *extra.values()),
        lambda: api(q, k, *ids.values(), **extra),
    ]


@pytest.mark.parametrize("name", [n for n in sorted(SIGNATURES) if "cos_sin" not in n])
def test_call_forms_and_return_types(cpu_run, name: str) -> None:
    q, k = _qk()
    for call in _calls(name, q, k):
        result = call()
        if name.endswith("_inplace"):
            assert result is None
        else:
            q_rope, k_rope = result
            assert q_rope.shape == q.shape and k_rope.shape == k.shape
            assert q_rope.dtype == q.dtype and q_rope.data_ptr() != q.data_ptr()


@pytest.mark.parametrize("inplace", [False, True])
def test_cos_sin_cache_call_forms_and_return_types(cpu_run, inplace: bool) -> None:
    api = (
        flashinfer.apply_rope_with_cos_sin_cache_inplace
        if inplace
        else flashinfer.apply_rope_with_cos_sin_cache
    )
    q, k = _qk()
    positions, cache = torch.arange(6), torch.ones(32, 64)
    for query, key in ((q.reshape(6, -1), k.reshape(6, -1)), (q, k)):
        results = [
            api(positions, query, key, 64, cache),
            api(positions, query, key, 64, cache, False),
            api(
                positions=positions,
                query=query,
                key=key,
                head_size=64,
                cos_sin_cache=cache,
                is_neox=True,
            ),
        ]
        for result in results:
            if inplace:
                assert result is None
            else:
                assert result[0].shape == query.shape and result[1].shape == key.shape


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_cpu_tensors_get_to_the_device_check(name: str) -> None:
    q, k = _qk()
    if "cos_sin" in name:

        def call() -> None:
            getattr(flashinfer, name)(
                torch.arange(6), q.reshape(6, -1), k.reshape(6, -1), 64, torch.ones(8, 64)
            )

    else:
        call = _calls(name, q, k)[0]
    with pytest.raises(ValueError, match="(q|query) must be a CUDA tensor"):
        call()
