"""Many processes, killed builds and dead lock holders (real compiles)."""

from __future__ import annotations

import logging
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def _hold_lock(uri: str) -> subprocess.Popen[str]:
    """A process in its own session holding ``uri``'s lock (returns once it does)."""
    holder = _spawn(
        f"""
from flashinfer.jit.lock import module_lock
with module_lock({uri!r}):
    print("locked", flush=True)
    time.sleep(600)
""",
        start_new_session=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


@pytest.fixture
def locks_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem that refuses locks, as some NFS setups do."""
    import errno

    from filelock import FileLock

    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(FileLock, "acquire", refuse)


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def _racers(count: int, src: Path, go: Path) -> list[subprocess.Popen[str]]:
    """``count`` processes that load the tiny module at once, started together."""
    code = f"""
go = Path({str(go)!r})
while not go.exists():
    time.sleep(0.005)
print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())
"""
    procs = [_spawn(code) for _ in range(count)]
    time.sleep(0.5 + 0.2 * count)  # let every child finish importing, then start them together
    go.touch()
    return procs


def test_racing_processes_compile_once_and_all_load(workspace: Path, tmp_path: Path) -> None:
    procs = _racers(4, write_tiny_sources(tmp_path / "src"), tmp_path / "go")
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert [out.strip() for out, _ in results] == ["1"] * 4
    # a build's first line; a slow build adds "compiling tiny_test_module: N steps done" lines
    compiles = sum(err.count("compiling tiny_test_module for ") for _, err in results)
    assert compiles == 1, [err for _, err in results]


def test_lock_of_a_killed_holder_does_not_block(workspace: Path, tmp_path: Path, jit_log) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    holder = _hold_lock("tiny_test_module")
    result: dict[str, object] = {}

    def build() -> None:
        try:
            result["value"] = spec.build_and_load().a_value()
        except Exception as err:  # surfaced by the assertion below
            result["error"] = err

    builder = threading.Thread(target=build, daemon=True)
    builder.start()
    try:
        deadline = time.monotonic() + 30
        while not any(
            m.startswith(f"waiting for tiny_test_module: being built by pid {holder.pid} on ")
            for m in jit_log.messages()
        ):
            assert time.monotonic() < deadline, "the waiting builder never said who holds the lock"
            time.sleep(0.05)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    builder.join(timeout=300)
    assert result.get("value") == 1, result
    assert any(
        "taking over the lock" in m and f"left by pid {holder.pid}" in m
        for m in jit_log.messages(logging.WARNING)
    )


def test_lock_is_reentrant_across_sequential_uses(workspace: Path) -> None:
    with module_lock("x"):
        pass
    with module_lock("x"):
        pass


@pytest.mark.parametrize("phase", ["nvcc", "c++", "link"])
def test_build_killed_mid_step_recovers(
    workspace: Path, tmp_path: Path, jit_log, phase: str
) -> None:
    """SIGKILL the whole building process group while nvcc runs, while the host compiler
    runs, or after the linker wrote its temp file but before the rename; the next call
    must rebuild and load."""
    src = write_tiny_sources(tmp_path / "src")
    marker = tmp_path / "reached"
    pids = tmp_path / "pids"
    launcher = tmp_path / "launcher.sh"
    # ninja runs each command in its own process group, so killing the building process
    # group leaves them running; the launcher records them for the cleanup below.
    if phase == "nvcc":
        body = f'echo $$ >> {pids}\ntouch {marker}\nexec "$@"\n'
        env = {"FLASHINFER_NVCC_LAUNCHER": str(launcher)}
    elif phase == "c++":
        body = (
            f'case " $* " in *" -shared "*) exec "$@";; *) echo $$ >> {pids}; '
            f'touch {marker}; exec "$@";; esac\n'
        )
        env = {"FLASHINFER_CXX_LAUNCHER": str(launcher)}
    else:
        body = (
            'case " $* " in *" -shared "*) "$@" || exit 1; '
            f'echo $$ >> {pids}; touch {marker}; exec sleep 600;; *) exec "$@";; esac\n'
        )
        env = {"FLASHINFER_CXX_LAUNCHER": str(launcher)}
    launcher.write_text("#!/bin/sh\n" + body)
    launcher.chmod(0o755)

    child = _spawn(
        f"tiny_spec(Path({str(src)!r})).build_and_load()", env=env, start_new_session=True
    )
    try:
        _wait_for(marker)
        time.sleep(0 if phase == "link" else 0.3)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for pid in pids.read_text().split() if pids.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    spec = tiny_spec(src)
    assert not spec.library_path.exists(), "a killed build left a loadable library"
    if phase == "link":
        assert spec.library_path.with_name(spec.library_path.name + ".tmp").exists()
    assert spec.is_stale
    assert spec.build_and_load().a_value() == 1
    assert len(jit_log.compiles()) == 1


def _elf_complete(path: Path) -> bool:
    """The section header table (at the end of a linked ELF) lies within the file."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return False
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    return shoff + shentsize * shnum <= len(data)


def test_eight_racing_processes_build_once_and_nothing_partial_is_visible(
    workspace: Path, tmp_path: Path
) -> None:
    import json

    src = write_tiny_sources(tmp_path / "src")
    spec = tiny_spec(src)
    library, manifest = spec.library_path, spec.build_dir / "manifest.json"
    procs = _racers(8, src, tmp_path / "go")
    seen = {"library": 0, "manifest": 0}
    while any(p.poll() is None for p in procs):
        if library.exists():
            assert _elf_complete(library), "a partial library was visible"
            seen["library"] += 1
        if manifest.exists():
            json.loads(manifest.read_text())  # never a truncated manifest
            assert library.exists(), "a manifest without its library"
            seen["manifest"] += 1
        time.sleep(0.002)
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert [out.strip() for out, _ in results] == ["1"] * 8
    # "compiling X for <archs>" starts a build; a slow one adds "compiling X: n steps done".
    assert sum(err.count("compiling tiny_test_module for ") for _, err in results) == 1
    assert seen["library"] > 0


def test_a_filesystem_that_refuses_locks_builds_in_staging(
    workspace: Path, tmp_path: Path, jit_log, locks_refused
) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    assert spec.build_and_load().a_value() == 1
    assert any("refused a lock" in m for m in jit_log.messages(logging.WARNING))
    assert spec.library_path.is_file() and not spec.is_stale
    assert not list(spec.build_dir.parent.glob(".staging-*"))  # cleaned up


def test_a_lock_held_past_the_timeout_is_taken_over(
    workspace: Path, tmp_path: Path, jit_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_JIT_LOCK_TIMEOUT", "2")
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    holder = _hold_lock("tiny_test_module")
    try:
        start = time.monotonic()
        assert spec.build_and_load().a_value() == 1
        assert time.monotonic() - start >= 2
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    warnings = jit_log.messages(logging.WARNING)
    assert any(
        f"held by pid {holder.pid}" in m and "FLASHINFER_JIT_LOCK_TIMEOUT=2" in m for m in warnings
    ), warnings


def test_a_failed_staging_build_points_at_a_log_that_exists(
    workspace: Path, tmp_path: Path, locks_refused
) -> None:
    from flashinfer.jit import JitCompileError

    src = write_tiny_sources(tmp_path / "src")
    (src / "include" / "tiny" / "a.cuh").write_text("#pragma once\nnot C++\n")
    with pytest.raises(JitCompileError) as info:
        tiny_spec(src).build_and_load()
    log = Path(str(info.value).rstrip().rsplit("full log: ", 1)[1])
    assert log.is_file() and "a.cuh" in log.read_text()
