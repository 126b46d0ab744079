"""Fixtures of the fleet tests: a module repository built once per session by the real
``precompile`` (the norm op for 9.0a), and a real HTTP server serving a copy of it per test,
with faults the test switches (see server.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from flashinfer.jit.precompile import precompile

SERVER = Path(__file__).with_name("server.py")
NORM_URIS = ("norm_dtype_bf16", "norm_dtype_f16", "norm_dtype_f32")
PREFIX = "/fleet/repo"  # the repository is served below a path, as from an object store


@pytest.fixture(scope="session")
def built_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repository") / "repo"
    result = precompile(out, "9.0a", ["norm"])
    assert sorted(p.parent.name for p in result.published) == list(NORM_URIS)
    return out


@dataclass
class Served:
    """A served copy of the repository: edit ``root`` to make its index lie."""

    root: Path
    state: Path
    url: str

    def fault(self, glob: str, mode: str, seconds: float = 0) -> None:
        faults = self._faults()
        faults[glob] = {"mode": mode, "seconds": seconds}
        (self.state / "faults.json").write_text(json.dumps(faults))

    def clear_faults(self) -> None:
        (self.state / "faults.json").unlink(missing_ok=True)

    def _faults(self) -> dict[str, Any]:
        path = self.state / "faults.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def requests(self) -> list[str]:
        """The paths requested so far, in order, relative to the repository's URL."""
        log = self.state / "requests.log"
        lines = log.read_text().splitlines() if log.is_file() else []
        return [line.split(" ", 1)[1].removeprefix(PREFIX) for line in lines]

    def file_requests(self) -> list[str]:
        """The requests of module files (the index left out)."""
        return [p for p in self.requests() if p != "/repository.json"]

    @property
    def index(self) -> dict[str, Any]:
        return json.loads((self.root / "repository.json").read_text())

    @index.setter
    def index(self, data: dict[str, Any]) -> None:
        (self.root / "repository.json").write_text(json.dumps(data))


def start_server(root: Path, state: Path) -> tuple[subprocess.Popen[str], int]:
    state.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(root), str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.fixture
def served(built_repository: Path, tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "www" / PREFIX.lstrip("/")
    shutil.copytree(built_repository, root)
    proc, port = start_server(tmp_path / "www", tmp_path / "server-state")
    try:
        yield Served(root, tmp_path / "server-state", f"http://127.0.0.1:{port}{PREFIX}/")
    finally:
        proc.kill()
        proc.wait()
