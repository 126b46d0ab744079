"""flashinfer.utils and flashinfer.jit.core.check_cuda_arch as drop-ins for the reference's
(flashinfer-ai/flashinfer flashinfer/utils.py read at ba1f20666a4db947ab4f8ea66537609677918e3b,
is_sm120f_supported as changed by its PR #3175; flashinfer/jit/core.py read at
13289e8192f70748da900b088874cf638bc7d5da)."""

from __future__ import annotations

import pytest

from flashinfer import utils
from flashinfer.jit.core import check_cuda_arch

from .signature import assert_signature

DEVICE_HELPERS = [
    "get_compute_capability",
    "get_device_sm_count",
    "is_sm90a_supported",
    "is_sm100a_supported",
    "is_sm100f_supported",
    "is_sm110a_supported",
    "is_sm120a_supported",
    "is_sm120f_supported",
    "is_sm121a_supported",
    "is_sm12x_supported",
]


@pytest.mark.parametrize("name", DEVICE_HELPERS)
def test_device_helper_signatures(name: str) -> None:
    assert_signature(getattr(utils, name), "(device)")


def test_check_cuda_arch_signature() -> None:
    assert_signature(check_cuda_arch, "()")


@pytest.mark.parametrize(
    "archs,ok",
    [("7.5", True), ("9.0a", True), ("7.0 9.0a", True), ("7.0", False), ("6.1 7.0", False)],
)
def test_check_cuda_arch_needs_an_sm75_target(
    monkeypatch: pytest.MonkeyPatch, archs: str, ok: bool
) -> None:
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", archs)
    if ok:
        check_cuda_arch()
    else:
        with pytest.raises(RuntimeError, match="requires GPUs with sm75 or higher"):
            check_cuda_arch()
