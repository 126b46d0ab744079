"""The PEP 517 backend: wheel contents, editable installs, and JIT from a read-only install."""

from __future__ import annotations

import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import build_backend
from tests.conftest import REPO_ROOT, run_python


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def test_wheel_carries_sources_and_headers_as_package_data(tmp_path: Path) -> None:
    name = build_backend.build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as wheel:
        names = set(wheel.namelist())
        record = wheel.read(f"flashinfer-{build_backend._version()}.dist-info/RECORD").decode()
        metadata = wheel.read(f"flashinfer-{build_backend._version()}.dist-info/METADATA").decode()
    for expected in (
        "flashinfer/__init__.py",
        "flashinfer/jit/core.py",
        "flashinfer/data/csrc/norm_kernel.cu",
        "flashinfer/data/csrc/norm.cc",
        "flashinfer/data/csrc/dtype_config.jinja",
        "flashinfer/data/include/flashinfer/norm.cuh",
    ):
        assert expected in names
    assert not any("__pycache__" in n for n in names)
    assert all(line.split(",")[0] in names for line in record.splitlines())
    for dep in ("torch", "jinja2", "ninja", "filelock", "apache-tvm-ffi"):
        assert f"Requires-Dist: {dep}" in metadata


def test_editable_wheel_points_at_the_checkout(tmp_path: Path) -> None:
    name = build_backend.build_editable(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as wheel:
        pth = [n for n in wheel.namelist() if n.endswith(".pth")]
        assert len(pth) == 1
        assert wheel.read(pth[0]).decode().strip() == str(REPO_ROOT)
    for data in ("csrc", "include"):
        link = REPO_ROOT / "flashinfer" / "data" / data
        assert link.is_symlink() and link.resolve() == (REPO_ROOT / data).resolve()


def test_sdist_contains_what_a_wheel_is_built_from(tmp_path: Path) -> None:
    name = build_backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames()}
    assert {
        "pyproject.toml",
        "build_backend.py",
        "PKG-INFO",
        "csrc/norm.cc",
        "include/flashinfer/norm.cuh",
        "flashinfer/jit/core.py",
    } <= names


def test_jit_from_a_read_only_installed_wheel(tmp_path: Path) -> None:
    wheel = build_backend.build_wheel(str(tmp_path))
    prefix = tmp_path / "prefix"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(prefix),
            str(tmp_path / wheel),
        ],
        check=True,
        capture_output=True,
    )
    package = prefix / "flashinfer"
    for path in [package, *package.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = _snapshot(package)
    try:
        code = """
import torch, flashinfer
from flashinfer.jit import env
print(flashinfer.__file__)
print(env.FLASHINFER_CSRC_DIR)
print(flashinfer.get_norm_module(torch.float32).dtype())
"""
        proc = run_python(
            code,
            env={
                "PYTHONPATH": str(prefix),
                "PYTHONDONTWRITEBYTECODE": "1",
                "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
            },
            cwd=tmp_path,
        )  # not the checkout: python -c puts the cwd first on sys.path
        module_file, csrc, dtype = proc.stdout.split()
        assert Path(module_file).is_relative_to(package)
        assert Path(csrc) == package / "data" / "csrc"
        assert dtype == "float32"
        assert "compiling norm_dtype_f32" in proc.stderr
        assert _snapshot(package) == before, "the JIT wrote into the installed package"
        assert any((tmp_path / "ws").rglob("norm_dtype_f32.so"))
    finally:
        for path in [package, *package.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
