"""scripts/gpu_pass.sh's choice between the layer gpu_prebuild.sh carried and compiling on
the GPU machine, and scripts/kernel_digest.sh, which that choice rests on. The pass runs in a
copy of the tree whose scripts/gpu_modules.py only says it ran (the real one compiles every
module for minutes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

COMPILED = "stub gpu_modules ran"


def _digest(root: Path) -> str:
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "kernel_digest.sh")],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The parts of the project the pass and the digest read, with a stub compile step."""
    root = tmp_path / "tree"
    for part in ("include", "csrc", "flashinfer/jit", "benchmarks/results"):
        shutil.copytree(REPO_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "scripts").mkdir()
    for script in ("gpu_pass.sh", "kernel_digest.sh"):
        shutil.copy(REPO_ROOT / "scripts" / script, root / "scripts" / script)
    (root / "scripts" / "gpu_modules.py").write_text(f"print({COMPILED!r})\n")
    (root / ".device").mkdir()
    return root


def _carry(root: Path, libraries: dict[str, bytes], digest: str) -> None:
    layer = root.parent / "built" / "aot"
    for name, data in libraries.items():
        (layer / name).mkdir(parents=True)
        (layer / name / f"{name}.so").write_bytes(data)
    layer.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / ".device" / "aot.tgz", "w:gz") as tar:
        tar.add(layer, arcname="aot")
    (root / ".device" / "aot.digest").write_text(digest + "\n")


def _pass(root: Path, tests: str = "", workers: int = 1) -> tuple[str, Path]:
    out = root.parent / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "GPU_PASS_TMP": str(root.parent / "scratch"),
        "GPU_PASS_WORKERS": str(workers),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "scripts/gpu_pass.sh", tests, "", "100"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, out / "results.tgz"


def test_the_digest_follows_the_sources_alone(tree: Path) -> None:
    first = _digest(tree)
    assert len(first) == 64 and _digest(tree) == first
    (tree / "flashinfer" / "jit" / "__pycache__").mkdir()
    (tree / "flashinfer" / "jit" / "__pycache__" / "core.cpython-312.pyc").write_bytes(b"x")
    assert _digest(tree) == first
    header = tree / "include" / "flashinfer" / "prefill.cuh"
    header.write_text(header.read_text() + "\n")
    assert _digest(tree) != first


def test_a_matching_layer_that_loads_is_used(tree: Path) -> None:
    """Any shared library loads through tvm_ffi.load_module; torch's c10 stands in for a
    module, and the pass names it as one the AOT lookup will not take."""
    import torch

    library = Path(torch.__file__).parent / "lib" / "libc10.so"
    _carry(tree, {"c10": library.read_bytes()}, _digest(tree))
    stdout, results = _pass(tree)
    assert "the carried layer loads: 1 modules" in stdout
    assert "1 of them are not taken here: c10" in stdout  # it has no aot.json record
    assert COMPILED not in stdout
    with tarfile.open(results) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {p.name for p in (REPO_ROOT / "benchmarks" / "results").glob("*.md")} <= names


def test_a_layer_of_other_sources_or_that_does_not_load_is_compiled_again(tree: Path) -> None:
    _carry(tree, {}, "0" * 64)
    stdout, _ = _pass(tree)
    assert "the carried layer was built from other sources" in stdout and COMPILED in stdout
    shutil.rmtree(tree.parent / "built")
    _carry(tree, {"broken": b"not an ELF library"}, _digest(tree))
    stdout, _ = _pass(tree)
    assert "the carried layer does not load here" in stdout and COMPILED in stdout
    assert not (tree.parent / "scratch" / "aot").exists()


def test_without_a_carried_layer_the_modules_compile_first(tree: Path) -> None:
    stdout, _ = _pass(tree)
    assert COMPILED in stdout and "carried layer" not in stdout


def _recording_tests(tree: Path, names: str) -> Path:
    """A gpu-marked test file per name, each test appending its name and pid to ran.txt."""
    ran = tree / "ran.txt"
    for name in names:
        (tree / f"{name}.py").write_text(
            "import os\nimport pytest\n\n\n@pytest.mark.gpu\n"
            f"def test_{name}():\n"
            f"    with open({str(ran)!r}, 'a') as f:\n"
            f"        f.write('{name}' + str(os.getpid()) + ' ')\n"
        )
    return ran


def test_test_paths_run_in_the_order_given_one_run_per_group(tree: Path) -> None:
    """'1@b.py,a.py c.py': b then a in one pytest process (1@ overrides GPU_PASS_WORKERS),
    then c in another run, each run its log."""
    ran = _recording_tests(tree, "abc")
    stdout, results = _pass(tree, "1@b.py,a.py c.py", workers=2)
    order = ran.read_text().split()
    assert [entry[0] for entry in order] == ["b", "a", "c"], stdout
    assert order[0][1:] == order[1][1:] != order[2][1:]  # b and a in one process
    with tarfile.open(results) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"pytest_b.py+a.py.log", "pytest_c.py.log"} <= names


def test_a_group_runs_on_several_workers(tree: Path) -> None:
    """GPU_PASS_WORKERS=2: a group's tests are spread over two pytest-xdist processes."""
    pytest.importorskip("xdist")
    ran = _recording_tests(tree, "abcdefgh")
    stdout, _ = _pass(tree, ",".join(f"{name}.py" for name in "abcdefgh"), workers=2)
    entries = ran.read_text().split()
    assert sorted(entry[0] for entry in entries) == list("abcdefgh"), stdout
    assert len({entry[1:] for entry in entries}) == 2
