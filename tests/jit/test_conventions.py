"""The reference developer guide's conventions (../shared/reference/flashinfer-developer-guide.md):
the nvcc default, FLASHINFER_DISABLE_VERSION_CHECK, the unsupported-arch wording, the
``jit_env`` directory names, ``cache list --paths`` and the OOM skip. CPU only, no compiler.

Reference read: flashinfer-ai/flashinfer flashinfer/jit/env.py at
05ce648b408ab17c2c31ad7b498b3c28d15b9369 (FLASHINFER_DISABLE_VERSION_CHECK, directory names).
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
import torch

from flashinfer.__main__ import main as cli
from flashinfer.config import config
from flashinfer.jit import aot, arch
from flashinfer.jit import env as jit_env
from flashinfer.jit.arch import CudaArch, NoTargetArchError
from flashinfer.jit.toolchain import ToolchainError, find_nvcc, nvcc_name
from flashinfer.version import __version__
from tests import conftest

REFERENCE_ARCH_ERROR = "No supported CUDA architectures found"


def _fake_nvcc(cuda_home: Path) -> Path:
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


def test_nvcc_defaults_to_cuda_home_then_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FLASHINFER_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert config.nvcc is None and nvcc_name() == "nvcc"
    nvcc = _fake_nvcc(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert nvcc_name() == str(nvcc)
    assert find_nvcc() == nvcc


def test_explicit_nvcc_wins_over_cuda_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_nvcc(tmp_path / "cuda")
    other = _fake_nvcc(tmp_path / "other")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("FLASHINFER_NVCC", str(other))
    assert find_nvcc() == other


def test_cuda_home_without_nvcc_names_both_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FLASHINFER_NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(ToolchainError, match="not found .*FLASHINFER_NVCC or fix CUDA_HOME"):
        find_nvcc()


def _layer_with_other_version(layer: Path, uri: str) -> Path:
    """An AOT layer holding ``uri`` recorded as built by another flashinfer version."""
    import tvm_ffi

    library = layer / uri / f"{uri}.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"not really a library")
    record = aot.AotRecord(
        uri=uri,
        flashinfer=f"{__version__}.other",
        tvm_ffi=tvm_ffi.__version__,
        archs=(CudaArch(9, 0, "a"),),
        settings=aot.build_settings(),
        identity={},
        inputs={},
        library_size=library.stat().st_size,
        library_sha256=hashlib.sha256(library.read_bytes()).hexdigest(),
    )
    (layer / uri / aot.AOT_RECORD).write_text(record.to_json())
    return library


@pytest.mark.usefixtures("workspace")
def test_disable_version_check_admits_another_versions_aot_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    library = _layer_with_other_version(tmp_path / "layer", "conv_mod")
    monkeypatch.setenv("FLASHINFER_AOT_DIR", str(tmp_path / "layer"))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.delenv("FLASHINFER_DISABLE_VERSION_CHECK", raising=False)
    assert aot.find("conv_mod") is None
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "0")
    assert aot.find("conv_mod") is None
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "1")
    assert aot.find("conv_mod") == library
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "perhaps")
    with pytest.raises(ValueError, match="FLASHINFER_DISABLE_VERSION_CHECK"):
        config.validate()


def test_unsupported_arch_errors_start_with_the_reference_wording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(arch, "_visible_gpu_archs", lambda: ())
    with pytest.raises(NoTargetArchError) as no_gpu:
        arch.target_archs()
    with pytest.raises(NoTargetArchError) as no_major:
        arch.filter_archs(arch.parse_arch_list("8.0 9.0a"), [12], "m")
    for err in (no_gpu.value, no_major.value):
        assert isinstance(err, RuntimeError)
        assert str(err).startswith(f"{REFERENCE_ARCH_ERROR}: ")
    assert "FLASHINFER_CUDA_ARCH_LIST" in str(no_gpu.value)
    assert "module m supports SM majors [12]" in str(no_major.value)


def test_jit_env_exposes_the_reference_directory_names(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    versioned = workspace / __version__
    assert jit_env.FLASHINFER_WORKSPACE_DIR == versioned
    assert jit_env.FLASHINFER_GEN_SRC_DIR == versioned / "generated"
    assert jit_env.generated_dir("m") == jit_env.FLASHINFER_GEN_SRC_DIR / "m"
    assert jit_env.FLASHINFER_JIT_DIR == versioned / "cached_ops"
    assert (jit_env.FLASHINFER_CSRC_DIR / "norm.cc").is_file()
    assert (jit_env.FLASHINFER_INCLUDE_DIR / "flashinfer").is_dir()
    monkeypatch.setenv("FLASHINFER_AOT_DIR", str(tmp_path / "aot"))
    assert jit_env.FLASHINFER_AOT_DIR == tmp_path / "aot"
    assert {"FLASHINFER_GEN_SRC_DIR", "FLASHINFER_JIT_DIR", "FLASHINFER_AOT_DIR"} <= set(
        dir(jit_env)
    )
    with pytest.raises(AttributeError, match="FLASHINFER_NO_SUCH_DIR"):
        jit_env.FLASHINFER_NO_SUCH_DIR  # noqa: B018


def test_cache_list_paths_shows_generated_dir_and_build_ninja(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    versioned = workspace / __version__
    variant = versioned / "cached_ops" / "conv_mod" / "0123456789abcdef"
    variant.mkdir(parents=True)
    (variant / "manifest.json").write_text("{}")
    (variant / "build.ninja").write_text("")
    (versioned / "generated" / "conv_mod").mkdir(parents=True)
    assert cli(["cache", "list"]) == 0
    assert "build.ninja" not in capsys.readouterr().out
    assert cli(["cache", "list", "--paths"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("conv_mod "))
    assert lines[row + 1].split() == ["generated:", str(versioned / "generated" / "conv_mod")]
    assert lines[row + 2].split() == ["build.ninja:", str(variant / "build.ninja")]
    (variant / "build.ninja").unlink()
    assert cli(["cache", "list", "--paths"]) == 0
    assert f"{variant / 'build.ninja'}  (missing)" in capsys.readouterr().out


def test_out_of_memory_in_a_test_is_a_skip_with_the_reason() -> None:
    hook = conftest.pytest_runtest_call(item=None)  # type: ignore[arg-type]
    next(hook)
    with pytest.raises(pytest.skip.Exception, match="CUDA out of memory: Tried to allocate"):
        hook.throw(torch.OutOfMemoryError("Tried to allocate 80.00 GiB\nmore details"))
    other = conftest.pytest_runtest_call(item=None)  # type: ignore[arg-type]
    next(other)
    with pytest.raises(ValueError, match="not memory"):
        other.throw(ValueError("not memory"))
