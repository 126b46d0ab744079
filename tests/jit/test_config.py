"""flashinfer.config and flashinfer.jit.arch: parsing and errors (no compiler needed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flashinfer.config import Config, config
from flashinfer.jit import arch
from flashinfer.jit.arch import CudaArch, NoTargetArchError


def test_defaults_and_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in Config.variables():
        monkeypatch.delenv(var.name, raising=False)
    assert config.workspace_base == Path.home() / ".cache" / "flashinfer"
    assert config.jit_verbose is False and config.nvcc_threads == 1
    assert config.logging_level == logging.INFO
    monkeypatch.setenv("FLASHINFER_JIT_DEBUG", "1")
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DFOO=1 '-DBAR=a b'")
    monkeypatch.setenv("FLASHINFER_NVCC_THREADS", "4")
    monkeypatch.setenv("FLASHINFER_LOGGING_LEVEL", "warning")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "~/ws")
    assert config.jit_debug is True
    assert config.extra_cudaflags == ("-DFOO=1", "-DBAR=a b")
    assert config.nvcc_threads == 4
    assert config.logging_level == logging.WARNING
    assert config.workspace_base == Path.home() / "ws"


@pytest.mark.parametrize(
    "var,value",
    [
        ("FLASHINFER_JIT_DEBUG", "maybe"),
        ("FLASHINFER_NVCC_THREADS", "0"),
        ("MAX_JOBS", "many"),
        ("FLASHINFER_LOGGING_LEVEL", "LOUD"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    attr = next(name for name, v in vars(Config).items() if getattr(v, "name", None) == var)
    with pytest.raises(ValueError, match=var):
        getattr(config, attr)


def test_arch_list_parsing() -> None:
    archs = arch.parse_arch_list("9.0a, 8.0;10.0a 9.0a")
    assert [str(a) for a in archs] == ["8.0", "9.0a", "10.0a"]
    assert archs[1].gencode == "-gencode=arch=compute_90a,code=sm_90a"
    assert CudaArch.parse("sm_12.0f").sm == "120f"
    with pytest.raises(ValueError, match="FLASHINFER_CUDA_ARCH_LIST"):
        arch.parse_arch_list("9.x")
    with pytest.raises(ValueError, match="names no arch"):
        arch.parse_arch_list(" , ")


def test_no_gpu_and_no_arch_list_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(arch, "_visible_gpu_archs", lambda: ())
    with pytest.raises(NoTargetArchError, match="FLASHINFER_CUDA_ARCH_LIST"):
        arch.target_archs()


def test_visible_gpus_are_used_without_arch_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(arch, "_visible_gpu_archs", lambda: (CudaArch(9, 0, "a"),))
    assert arch.target_archs() == (CudaArch(9, 0, "a"),)


def test_supported_majors_filter() -> None:
    archs = arch.parse_arch_list("8.0 9.0a 10.0a")
    assert arch.filter_archs(archs, [9, 10], "m") == archs[1:]
    assert arch.filter_archs(archs, None, "m") == archs
    with pytest.raises(NoTargetArchError, match="module m supports SM majors \\[12\\]"):
        arch.filter_archs(archs, [12], "m")
