"""scripts/gpu_pass.sh: the layer its modules step starts from (the one gpu_prebuild.sh
carried, one a warm machine kept, or none), scripts/kernel_digest.sh, which that choice rests
on, its order of test runs, what it returns and its status. The pass runs in a copy of the
tree whose scripts/gpu_modules.py only reports the layer it was given (the real one compiles
for minutes; tests/testing/test_gpu_modules.py tests it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

COMPILED = "stub gpu_modules ran over"
STUB = f"""import os, sys
layer = sys.argv[1]
print({COMPILED!r}, sorted(os.listdir(layer)) if os.path.isdir(layer) else None)
os.makedirs(os.path.join(layer, "built_here"), exist_ok=True)
sys.exit(int(os.environ.get("STUB_RC", "0")))
"""


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
    """The parts of the project the pass and the digest read, with a stub modules step."""
    root = tmp_path / "tree"
    for part in (
        "include",
        "csrc",
        "flashinfer/jit",
        "tests/debug/debug_module",
        "benchmarks/results",
    ):
        shutil.copytree(REPO_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "scripts").mkdir()
    for script in ("gpu_pass.sh", "kernel_digest.sh"):
        shutil.copy(REPO_ROOT / "scripts" / script, root / "scripts" / script)
    (root / "scripts" / "gpu_modules.py").write_text(STUB)
    (root / ".device").mkdir()
    return root


def _carry(root: Path, modules: list[str], digest: str) -> None:
    layer = root.parent / "built" / "aot"
    for name in modules:
        (layer / name).mkdir(parents=True)
        (layer / name / f"{name}.so").write_bytes(b"a library")
    layer.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / ".device" / "aot.tgz", "w:gz") as tar:
        tar.add(layer, arcname="aot")
    (root / ".device" / "aot.digest").write_text(digest + "\n")


def _pass(
    root: Path, tests: str = "", workers: int = 1, benchmarks: str = "", **env: str
) -> tuple[int, str, set[str]]:
    """The pass's status, its output and the names in its results.tgz."""
    out = root.parent / "out"
    done = subprocess.run(
        ["bash", "scripts/gpu_pass.sh", tests, benchmarks, "200"],
        cwd=root,
        env={
            **os.environ,
            "OUT": str(out),
            "GPU_PASS_TMP": str(root.parent / "scratch"),
            "GPU_PASS_WORKERS": str(workers),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    with tarfile.open(out / "results.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    return done.returncode, done.stdout + done.stderr, names


def test_the_digest_follows_the_sources_alone(tree: Path) -> None:
    first = _digest(tree)
    assert len(first) == 64 and _digest(tree) == first
    (tree / "flashinfer" / "jit" / "__pycache__").mkdir()
    (tree / "flashinfer" / "jit" / "__pycache__" / "core.cpython-312.pyc").write_bytes(b"x")
    assert _digest(tree) == first
    header = tree / "include" / "flashinfer" / "prefill.cuh"
    header.write_text(header.read_text() + "\n")
    assert _digest(tree) != first


def test_the_modules_step_starts_from_a_carried_layer_of_this_tree(tree: Path) -> None:
    """The carried layer is unpacked for the modules step (which removes and builds what it
    must); only tables the pass wrote come back, with each step's log."""
    _carry(tree, ["norm_dtype_f16"], _digest(tree))
    rc, stdout, names = _pass(
        tree, benchmarks="mkdir -p results && echo '| x |' > results/written_now.md"
    )
    assert rc == 0, stdout
    assert f"{COMPILED} ['norm_dtype_f16']" in stdout and "compiling here" not in stdout
    assert {"modules.log", "written_now.md"} <= names
    assert not names & {p.name for p in (REPO_ROOT / "benchmarks" / "results").glob("*.md")}


@pytest.mark.parametrize("carried", ["none", "other sources", "not a tgz"])
def test_without_a_layer_of_this_tree_the_modules_step_starts_empty(
    tree: Path, carried: str
) -> None:
    if carried == "other sources":
        _carry(tree, ["norm_dtype_f16"], "0" * 64)
    elif carried == "not a tgz":
        (tree / ".device" / "aot.tgz").write_bytes(b"not an archive")
        (tree / ".device" / "aot.digest").write_text(_digest(tree) + "\n")
    rc, stdout, _ = _pass(tree)
    assert rc == 0, stdout
    assert f"{COMPILED} None" in stdout
    expected = {
        "none": "no carried layer",
        "other sources": "the carried layer was built from other sources",
        "not a tgz": "the carried layer does not unpack",
    }[carried]
    assert f"=== {expected}: compiling here" in stdout


def test_a_warm_machine_keeps_its_layer_while_the_tree_is_the_same(tree: Path) -> None:
    """A second pass on the same tree starts from the first's layer, what it built included;
    once a kernel source changes, neither that layer nor the carried one is used."""
    _carry(tree, ["norm_dtype_f16"], _digest(tree))
    assert _pass(tree)[0] == 0
    rc, stdout, _ = _pass(tree)
    assert rc == 0 and f"{COMPILED} ['built_here', 'norm_dtype_f16']" in stdout, stdout
    header = tree / "include" / "flashinfer" / "norm.cuh"
    header.write_text(header.read_text() + "\n")
    rc, stdout, _ = _pass(tree)
    assert "built from other sources" in stdout and f"{COMPILED} None" in stdout, stdout


def test_a_new_carried_layer_replaces_the_warm_one_of_the_same_tree(tree: Path) -> None:
    """A first pass without a carried layer leaves what it built; a prebuilt layer of the
    same tree carried next is unpacked in its place."""
    assert _pass(tree)[0] == 0
    _carry(tree, ["norm_dtype_f16"], _digest(tree))
    rc, stdout, _ = _pass(tree)
    assert rc == 0 and f"{COMPILED} ['norm_dtype_f16']" in stdout, stdout


def test_the_status_is_the_first_failing_steps_and_every_step_still_runs(tree: Path) -> None:
    """A failed modules step (status 3) and a failing test run: the pass goes on with the
    next group and returns 3; a pass after it returns its own logs, not the first's."""
    _recording_tests(tree, "ab")
    (tree / "a.py").write_text((tree / "a.py").read_text() + "    assert False\n")
    rc, stdout, names = _pass(tree, "a.py b.py", STUB_RC="3")
    assert rc == 3, stdout
    assert "rc=1" in stdout and (tree / "ran.txt").read_text().split()[1].startswith("b")
    assert {"pytest_a.py.log", "pytest_b.py.log"} <= names
    rc, stdout, names = _pass(tree, "b.py")
    assert rc == 0, stdout
    assert "pytest_b.py.log" in names and "pytest_a.py.log" not in names


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
    rc, stdout, names = _pass(tree, "1@b.py,a.py c.py", workers=2)
    order = ran.read_text().split()
    assert rc == 0 and [entry[0] for entry in order] == ["b", "a", "c"], stdout
    assert order[0][1:] == order[1][1:] != order[2][1:]  # b and a in one process
    assert {"pytest_b.py+a.py.log", "pytest_c.py.log"} <= names


def test_a_group_runs_on_several_workers(tree: Path) -> None:
    """GPU_PASS_WORKERS=2: a group's tests are spread over two pytest-xdist processes."""
    pytest.importorskip("xdist")
    ran = _recording_tests(tree, "abcdefgh")
    rc, stdout, _ = _pass(tree, ",".join(f"{name}.py" for name in "abcdefgh"), workers=2)
    entries = ran.read_text().split()
    assert rc == 0 and sorted(entry[0] for entry in entries) == list("abcdefgh"), stdout
    assert len({entry[1:] for entry in entries}) == 2
