"""SASS facts of the sampling module (CPU: compile for sm_90a, read the machine code): the
radix-select histograms use native 32-bit shared atomics, warp-aggregated, with no 64-bit
shared compare-and-swap loop, and no kernel spills. Skips when cuobjdump or nvdisasm (the
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, or a CUDA toolkit) is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashinfer.jit.sampling import gen_sampling_module
from flashinfer.testing.sass import cuobjdump_sass, sass_by_kernel

from .test_norm import build_without_spills

# Kernels that build histograms (radix select), by their mangled-name fragment.
HISTOGRAM_KERNELS = ("FilteredSamplingKernel", "RenormProbsKernel", "MaskLogitsKernel")


def _sass_by_kernel(obj: Path) -> dict[str, str]:
    """The SASS of an object per kernel (skips the test without cuobjdump and nvdisasm)."""
    try:
        return sass_by_kernel(cuobjdump_sass(obj))
    except FileNotFoundError as missing:
        pytest.skip(str(missing))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_histograms_use_warp_aggregated_32_bit_shared_atomics(dtype: str) -> None:
    spec = gen_sampling_module(dtype)
    build_without_spills(spec)  # asserts no kernel spills
    (obj,) = spec.build_dir.glob("sampling_kernel*.o")
    kernels = _sass_by_kernel(obj)
    assert kernels, "no kernel in the object"
    for name, sass in kernels.items():
        assert not re.search(r"\bATOMS\.CAS", sass), f"{name}: shared compare-and-swap"
        assert not re.search(r"\bATOMS\.\S*64", sass), f"{name}: 64-bit shared atomic"
    for fragment in HISTOGRAM_KERNELS:
        found = [sass for name, sass in kernels.items() if fragment in name]
        assert found, f"{fragment} not in the module"
        for sass in found:
            assert "MATCH.ANY" in sass, f"{fragment}: histogram adds are not warp-aggregated"
            assert re.search(r"\bATOMS\.(ADD|POPC\.INC)", sass), f"{fragment}: no 32-bit add"
