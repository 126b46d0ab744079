"""Many processes, killed builds and dead lock holders (real compiles)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flashinfer.jit.lock import module_lock
from tests.conftest import REPO_ROOT
from tests.jit.tiny_module import tiny_spec, write_tiny_sources

_CHILD_PRELUDE = f"""
import sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
from pathlib import Path
from tests.jit.tiny_module import tiny_spec
"""


def _spawn(code: str, **kwargs) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.update(kwargs.pop("env", {}))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD_PRELUDE + code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs,
    )


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def test_racing_processes_compile_once_and_all_load(workspace: Path, tmp_path: Path) -> None:
    src = write_tiny_sources(tmp_path / "src")
    go = tmp_path / "go"
    code = f"""
go = Path({str(go)!r})
while not go.exists():
    time.sleep(0.005)
print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())
"""
    procs = [_spawn(code) for _ in range(4)]
    time.sleep(1.5)  # let every child finish importing, then start them together
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert [out.strip() for out, _ in results] == ["1"] * 4
    compiles = sum(err.count("compiling tiny_test_module") for _, err in results)
    assert compiles == 1, [err for _, err in results]


def test_lock_of_a_killed_holder_does_not_block(
    workspace: Path, tmp_path: Path, jit_log
) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    holder = _spawn(
        """
from flashinfer.jit.lock import module_lock
with module_lock("tiny_test_module"):
    print("locked", flush=True)
    time.sleep(600)
""",
        start_new_session=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"

    result: dict[str, object] = {}

    def build() -> None:
        try:
            result["value"] = spec.build_and_load().a_value()
        except Exception as err:  # surfaced by the assertion below
            result["error"] = err

    builder = threading.Thread(target=build)
    builder.start()
    deadline = time.monotonic() + 30
    while not any("waiting for another process" in m for m in jit_log.messages()):
        assert time.monotonic() < deadline, "the waiting builder never said so"
        time.sleep(0.05)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    builder.join(timeout=300)
    assert result.get("value") == 1, result


def test_lock_is_reentrant_across_sequential_uses(workspace: Path) -> None:
    with module_lock("x"):
        pass
    with module_lock("x"):
        pass


@pytest.mark.parametrize("phase", ["nvcc", "link"])
def test_build_killed_mid_step_recovers(
    workspace: Path, tmp_path: Path, jit_log, phase: str
) -> None:
    """SIGKILL the whole building process group while nvcc runs, or after the linker
    wrote its temp file but before the rename; the next call must rebuild and load."""
    src = write_tiny_sources(tmp_path / "src")
    marker = tmp_path / "reached"
    launcher = tmp_path / "launcher.sh"
    if phase == "nvcc":
        body = f'touch {marker}\nexec "$@"\n'
        env = {"FLASHINFER_NVCC_LAUNCHER": str(launcher)}
    else:
        body = (
            'case " $* " in *" -shared "*) "$@" || exit 1; '
            f'touch {marker}; sleep 600;; *) exec "$@";; esac\n'
        )
        env = {"FLASHINFER_CXX_LAUNCHER": str(launcher)}
    launcher.write_text("#!/bin/sh\n" + body)
    launcher.chmod(0o755)

    child = _spawn(
        f"tiny_spec(Path({str(src)!r})).build_and_load()", env=env, start_new_session=True
    )
    try:
        _wait_for(marker)
        time.sleep(0.3 if phase == "nvcc" else 0)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()

    spec = tiny_spec(src)
    assert not spec.library_path.exists(), "a killed build left a loadable library"
    if phase == "link":
        assert spec.library_path.with_name(spec.library_path.name + ".tmp").exists()
    assert spec.is_stale
    assert spec.build_and_load().a_value() == 1
    assert len(jit_log.compiles()) == 1
