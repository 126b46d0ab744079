"""SASS facts of the sampling module (CPU: compile for sm_90a, read the machine code): the
radix-select histograms use native 32-bit shared atomics, warp-aggregated, with no 64-bit
shared compare-and-swap loop, and no kernel spills. Skips when cuobjdump or nvdisasm (the
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, or a CUDA toolkit) is missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flashinfer.jit.sampling import gen_sampling_module

from .test_norm import build_with_ptxas_report

# Kernels that build histograms (radix select), by their mangled-name fragment.
HISTOGRAM_KERNELS = ("FilteredSamplingKernel", "RenormProbsKernel", "MaskLogitsKernel")


def _tool_dirs() -> list[Path]:
    """Where a CUDA binary tool may be: PATH, nvcc's folder, the nvidia-* wheels' bin folders."""
    dirs = [Path(p) for p in os.get_exec_path()]
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(Path(nvcc).resolve().parent)
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        dirs += [bin_dir for root in nvidia.__path__ for bin_dir in Path(root).glob("*/bin")]
    except ImportError:
        pass
    return dirs


def _find_tool(name: str) -> Path | None:
    return next((d / name for d in _tool_dirs() if (d / name).is_file()), None)


def _cuobjdump() -> list[str]:
    """The command line of ``cuobjdump -sass`` (skips the test without the tools): cuobjdump
    runs nvdisasm, named through NVDISASM_PATH."""
    cuobjdump, nvdisasm = _find_tool("cuobjdump"), _find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        pytest.skip("cuobjdump and nvdisasm are needed (nvidia-cuda-cuobjdump/-nvdisasm wheels)")
    return ["env", f"NVDISASM_PATH={nvdisasm.parent}", str(cuobjdump), "-sass"]


def _sass_by_kernel(command: list[str], obj: Path) -> dict[str, str]:
    """The SASS of an object, split into {mangled kernel name: its SASS}."""
    text = subprocess.run([*command, str(obj)], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_histograms_use_warp_aggregated_32_bit_shared_atomics(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = _cuobjdump()
    spec = gen_sampling_module(dtype)
    build_with_ptxas_report(spec, monkeypatch)  # asserts no kernel spills
    (obj,) = spec.build_dir.glob("sampling_kernel*.o")
    kernels = _sass_by_kernel(command, obj)
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
