"""Shared fixtures. Every test session gets its own JIT workspace (unless
FLASHINFER_WORKSPACE_BASE is set), so each module compiles once per run and runs
never see each other's builds."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Generator

import pytest
import torch

HAS_GPU = torch.cuda.is_available()

if not os.environ.get("FLASHINFER_WORKSPACE_BASE"):
    os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="flashinfer-test-ws-")
if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST") and not HAS_GPU:
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a"

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--compile-matrix",
        action="store_true",
        help="also compile every module specialization (tests marked compile_matrix)",
    )
    parser.addoption(
        "--fuzz-seeds",
        default="0:6",
        help="START:COUNT, the seeds of the random cases of tests/ops/test_*_fuzz_emulated.py",
    )
    parser.addoption(
        "--memory-profile",
        metavar="FILE",
        help="write to FILE the memory profile (tests/emu/profile.py) of every emulated "
        "module the tests run: each source line's shared-memory wavefronts and global sectors",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--memory-profile")
    if path:
        from tests.emu import profile

        profile.profile_session()
        if not os.environ.get("PYTEST_XDIST_WORKER"):  # an earlier session's leftovers
            for part in Path(path).parent.glob(f"{Path(path).name}.*.json"):
                part.unlink()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With --memory-profile, each xdist worker leaves its sites beside FILE, and the process
    that ran the session writes them all, added up, to FILE."""
    path = session.config.getoption("--memory-profile")
    if not path:
        return
    from tests.emu import profile

    sites = profile.session_sites()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        profile.save(sites, Path(f"{path}.{worker}.json"))
        return
    for part in Path(path).parent.glob(f"{Path(path).name}.*.json"):
        sites += profile.load(part)
        part.unlink()
    Path(path).write_text(profile.Profile(profile.merge(sites)).table() + "\n")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking ``fuzz_seed`` runs once per seed of --fuzz-seeds."""
    if "fuzz_seed" in metafunc.fixturenames:
        start, count = (int(part) for part in metafunc.config.getoption("--fuzz-seeds").split(":"))
        seeds = range(start, start + count)
        metafunc.parametrize("fuzz_seed", seeds, ids=[f"seed{s}" for s in seeds])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--compile-matrix"):
        skip_matrix = pytest.mark.skip(reason="the full compile matrix runs with --compile-matrix")
        for item in items:
            if "compile_matrix" in item.keywords:
                item.add_marker(skip_matrix)
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """A test that runs the GPU out of memory is skipped with torch's message (the reference
    guide's convention): its sizes do not fit this GPU, which is no failure of the code.
    The cached blocks are released so the next test starts clean."""
    try:
        return (yield)
    except torch.OutOfMemoryError as err:
        if HAS_GPU:
            torch.cuda.empty_cache()
        reason = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
        pytest.skip(f"CUDA out of memory: {reason}")


class LogRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    def compiles(self) -> list[str]:
        """One message per build started (progress lines of a slow build excluded)."""
        return [
            m
            for m in self.messages()
            if m.startswith(("compiling ", "rebuilding ")) and " steps done, " not in m
        ]


@pytest.fixture
def jit_log():
    """Records what the flashinfer.jit logger says during the test."""
    recorder = LogRecorder()
    logger = logging.getLogger("flashinfer.jit")
    logger.addHandler(recorder)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty JIT workspace for this test only."""
    base = tmp_path / "workspace"
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(base))
    return base


def run_python(
    code: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with the current environment (plus ``env``)."""
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def build_host_program(source: Path, binary: Path) -> Path:
    """Build ``source`` (C++ including headers under include/) with the host compiler."""
    from flashinfer.jit.toolchain import current_toolchain

    subprocess.run(
        [
            str(current_toolchain().cxx),
            "-O2",
            "-std=c++17",
            f"-I{REPO_ROOT / 'include'}",
            str(source),
            "-o",
            str(binary),
        ],
        check=True,
    )
    return binary


def run_host_program(source: Path, binary: Path, stdin: str = "") -> list[str]:
    """Build ``source`` (see build_host_program), run it with ``stdin`` and return its
    output lines."""
    build_host_program(source, binary)
    return run_built_program(binary, stdin)


def run_built_program(binary: Path, stdin: str = "") -> list[str]:
    """Run a program build_host_program built, with ``stdin``; its output lines."""
    proc = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True)
    return proc.stdout.split("\n")
