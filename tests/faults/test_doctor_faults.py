"""``python -m flashinfer doctor`` against real misconfigurations (issue 16, item 8).

Each scenario runs doctor in a fresh process, as a user would, with its own workspace
under a private tmp dir. Every process pays torch's import (~3 s), so the scenarios start
together in one module fixture, and several independent faults share a scenario: each
test reads only the line of its own check.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from flashinfer import doctor
from flashinfer.jit.arch import CudaArch, runs_on
from flashinfer.jit.toolchain import ToolchainError, nvcc_arch_problem, nvcc_supported_archs

REPO_ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


@dataclass
class Run:
    returncode: int
    out: str
    stderr: str

    def lines(self, name: str) -> list[str]:
        """The ``[ok]``/``[FAIL]`` lines of check ``name``."""
        return [
            ln
            for ln in self.out.splitlines()
            if ln.startswith((f"[ok] {name}: ", f"[FAIL] {name}: "))
        ]

    def line(self, name: str) -> str:
        (found,) = self.lines(name)
        return found

    def fix_after(self, line: str) -> str:
        rows = self.out.splitlines()
        following = rows[rows.index(line) + 1]
        assert following.strip().startswith("fix: "), self.out
        return following


def _base_env(root: Path) -> dict[str, str]:
    """The test process's environment without its flashinfer settings (the arch list
    conftest sets without a GPU excepted), a private workspace and temp dir."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_") and k != "MAX_JOBS"
    }
    if "FLASHINFER_CUDA_ARCH_LIST" in os.environ:
        env["FLASHINFER_CUDA_ARCH_LIST"] = os.environ["FLASHINFER_CUDA_ARCH_LIST"]
    (root / "tmp").mkdir()
    env.update(
        FLASHINFER_WORKSPACE_BASE=str(root / "ws"),
        TMPDIR=str(root / "tmp"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def _sound(root: Path) -> dict[str, str]:
    # a log file in dirs that do not exist yet: fine, and the probe must not leave them
    return {"FLASHINFER_LOGDEST": str(root / "new_dir" / "sub" / "doctor-%i.log")}


def _bad_settings(root: Path) -> dict[str, str]:
    (root / "log_dir").mkdir()
    return {
        "FLASHINFER_LOGLEVEL": "7",
        "FLASHINFER_LOGGING_LEVEL": "loud",
        "MAX_JOBS": "0",
        "FLASHINFER_CACHE_MAX_GB": "-1",
        "FLASHINFER_JIT_VERBOSE": "maybe",
        "FLASHINFER_CUDA_ARCH_LIST": "foo",
        "FLASHINFER_WORKSPACE_BASE": "rel-ws",  # against the cwd: root
        "FLASHINFER_LOGDEST": str(root / "log_dir"),
    }


def _unbuildable(root: Path) -> dict[str, str]:
    (root / "a_file").write_text("not a directory")
    return {
        "FLASHINFER_CUDA_ARCH_LIST": "7.0 9.0a",
        "FLASHINFER_WORKSPACE_BASE": str(root / "a_file" / "ws"),
        "FLASHINFER_LOGDEST": "/proc/flashinfer-doctor.log",
    }


def _host_cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def _no_nvcc(root: Path) -> dict[str, str]:
    (root / "a_file").write_text("not a directory")
    path = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "nvcc").exists()
    ]
    return {
        "PATH": os.pathsep.join(path),
        "FLASHINFER_NVCC": "/nonexistent",
        "CXX": _host_cxx() or "c++",  # an absolute path: PATH may have lost its dir
        "FLASHINFER_LOGDEST": str(root / "a_file" / "sub" / "log.%i"),
    }


SCENARIOS: dict[str, Callable[[Path], dict[str, str]]] = {
    "sound": _sound,
    "bad_settings": _bad_settings,
    "unbuildable": _unbuildable,
    "no_nvcc": _no_nvcc,
}


@pytest.fixture(scope="module")
def scenario_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: tmp_path_factory.mktemp(f"doctor-{name}") for name in SCENARIOS}


@pytest.fixture(scope="module")
def runs(scenario_roots: dict[str, Path]) -> dict[str, Run]:
    procs = {}
    for name, make_env in SCENARIOS.items():
        root = scenario_roots[name]
        env = {**_base_env(root), **make_env(root)}
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "flashinfer", "doctor"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        results[name] = Run(proc.returncode, out, err)
    return results


def test_sound_environment_passes(runs: dict[str, Run], scenario_roots: dict[str, Path]) -> None:
    run = runs["sound"]
    assert run.returncode == 0, run.out + run.stderr
    assert run.out.rstrip().endswith("all checks passed")
    for name in (
        "versions",
        "configuration",
        "nvcc",
        "host compiler",
        "ninja",
        "GPU",
        "target archs",
        "workspace",
        "log destination",
    ):
        assert run.line(name).startswith("[ok] "), run.out
    assert str(scenario_roots["sound"] / "ws") in run.line("workspace")
    assert "writable" in run.line("log destination")
    assert not (scenario_roots["sound"] / "new_dir").exists(), "the log probe left dirs behind"


def test_invalid_settings_start_doctor_and_fail_configuration(runs: dict[str, Run]) -> None:
    run = runs["bad_settings"]
    assert run.returncode == 1, run.out + run.stderr
    line = run.line("configuration")
    assert line.startswith("[FAIL] configuration: ")
    for name, value in (
        ("FLASHINFER_LOGLEVEL", "7"),
        ("FLASHINFER_LOGGING_LEVEL", "loud"),
        ("MAX_JOBS", "0"),
        ("FLASHINFER_CACHE_MAX_GB", "-1"),
        ("FLASHINFER_JIT_VERBOSE", "maybe"),
    ):
        assert f"invalid value {value!r} for {name}" in line
    assert "unset" in run.fix_after(line)
    assert "Traceback" not in run.stderr


def test_unparsable_arch_list_fails_naming_the_variable(runs: dict[str, Run]) -> None:
    run = runs["bad_settings"]
    line = run.line("target archs")
    assert line.startswith("[FAIL] target archs: ") and "'foo'" in line
    assert "FLASHINFER_CUDA_ARCH_LIST" in line
    assert "FLASHINFER_CUDA_ARCH_LIST" in run.fix_after(line)


def test_arch_nvcc_cannot_build_fails_with_what_it_supports(runs: dict[str, Run]) -> None:
    try:
        supported = nvcc_supported_archs()
    except ToolchainError:
        pytest.skip("no nvcc here")
    if (7, 0) in supported:
        pytest.skip("this nvcc still builds sm_70")
    run = runs["unbuildable"]
    assert run.returncode == 1
    line = run.line("target archs")
    assert line.startswith("[FAIL] target archs: ")
    assert "cannot build arch 7.0" in line and "it supports " in line and "9.0" in line
    assert "9.0a:" not in line  # the buildable arch is not blamed


def test_relative_workspace_is_a_problem_showing_its_absolute_path(
    runs: dict[str, Run], scenario_roots: dict[str, Path]
) -> None:
    run = runs["bad_settings"]
    absolute = scenario_roots["bad_settings"] / "rel-ws"
    (line,) = [ln for ln in run.lines("workspace") if "relative" in ln]
    assert line.startswith("[FAIL] workspace: FLASHINFER_WORKSPACE_BASE='rel-ws' is relative")
    assert str(absolute) in line
    assert "absolute path" in run.fix_after(line)


def test_unusable_workspace_base_fails_naming_base_and_fallback(
    runs: dict[str, Run], scenario_roots: dict[str, Path]
) -> None:
    root = scenario_roots["unbuildable"]
    run = runs["unbuildable"]
    line = run.line("workspace")
    assert line.startswith(f"[FAIL] workspace: {root / 'a_file' / 'ws'} ")
    assert "Not a directory" in line
    assert str(root / "tmp" / f"flashinfer-{os.getuid()}") in line  # the fallback


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("bad_settings", "Is a directory"),
        ("unbuildable", "No such file or directory"),  # /proc takes no new files
        ("no_nvcc", "Not a directory"),  # a parent is a regular file
    ],
)
def test_unusable_log_destination_fails_with_the_os_reason(
    runs: dict[str, Run], scenario: str, reason: str
) -> None:
    run = runs[scenario]
    assert run.returncode == 1
    line = run.line("log destination")
    assert line.startswith("[FAIL] log destination: FLASHINFER_LOGDEST=")
    assert ": cannot write " in line and line.endswith(f": {reason}")
    assert "stdout, stderr" in run.fix_after(line)


def test_log_destination_without_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process (the check is the code the subprocesses run): one torch import less."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if IS_ROOT:  # root writes where the mode forbids; sysfs refuses new files to everyone
        target, reason = Path("/sys/flashinfer-doctor.log"), None
    else:
        target, reason = locked / "doctor.log", "Permission denied"
    monkeypatch.setenv("FLASHINFER_LOGDEST", str(target))
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        check = doctor._log_destination()
    finally:
        locked.chmod(stat.S_IRWXU)
    assert not check.ok and f"cannot write {target}: " in check.detail
    if reason is not None:
        assert check.detail.endswith(reason)
    assert not target.exists()


def test_missing_nvcc_fails_nvcc_only(runs: dict[str, Run]) -> None:
    run = runs["no_nvcc"]
    assert run.returncode == 1
    assert run.line("nvcc").startswith("[FAIL] nvcc: '/nonexistent' not found")
    if _host_cxx() is None:
        pytest.skip("no host compiler here")
    host = run.line("host compiler")
    assert host.startswith("[ok] host compiler: ")
    assert "not found" not in host and "'nvcc'" not in host
    assert "no usable nvcc to check it against" in host  # the gcc limit is skipped
    assert "not checked against nvcc" in run.line("target archs")


def test_log_probe_leaves_an_existing_file_untouched(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("earlier lines\n")
    os.utime(log, (1_000_000, 1_000_000))
    assert doctor._writable_file_problem(log) is None
    assert log.read_text() == "earlier lines\n" and log.stat().st_mtime == 1_000_000
    assert sorted(tmp_path.iterdir()) == [log]


@pytest.mark.parametrize(
    ("arch", "gpu", "runs_there"),
    [
        ("9.0a", (9, 0), True),
        ("8.0", (8, 6), True),
        ("8.6", (8, 0), False),
        ("8.0", (9, 0), False),
        ("10.0a", (10, 3), False),
        ("10.0f", (10, 3), True),
    ],
)
def test_arch_coverage_of_a_gpu(arch: str, gpu: tuple[int, int], runs_there: bool) -> None:
    assert runs_on(CudaArch.parse(arch), gpu) is runs_there


def test_nvcc_arch_helpers() -> None:
    try:
        supported = nvcc_supported_archs()
    except ToolchainError:
        pytest.skip("no nvcc here")
    assert (9, 0) in supported and all(isinstance(m, int) for pair in supported for m in pair)
    assert nvcc_arch_problem(CudaArch.parse("9.0a")) is None
    assert "start at 9.0a" in (nvcc_arch_problem(CudaArch.parse("8.0a")) or "")
    assert "start at 10.0f" in (nvcc_arch_problem(CudaArch.parse("9.0f")) or "")
    with pytest.raises(ToolchainError, match="cannot read"):
        nvcc_supported_archs(Path("/nonexistent/nvcc"))
