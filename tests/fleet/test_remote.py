"""The module repository (issue 20): a layer written by ``precompile``, served by a real HTTP
server on loopback, downloaded by processes that would otherwise compile.

Loads run with FLASHINFER_DISABLE_JIT=1, so "it would compile" is observable cheaply: the
JitDisabledError, whose message must then say why the repository did not provide the module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from flashinfer.__main__ import main as cli
from flashinfer.config import config
from flashinfer.doctor import _repository
from flashinfer.jit import aot, remote
from flashinfer.jit.core import JitDisabledError
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.precompile import write_index
from flashinfer.version import __version__
from tests.conftest import LogRecorder, run_python
from tests.fleet.conftest import NORM_URIS, Served

BF16 = "norm_dtype_bf16"
LOAD_BF16 = """
import shutil, torch, flashinfer
assert shutil.which("nvcc") is None
print(flashinfer.get_norm_module(torch.bfloat16).dtype())
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cubins(workspace: Path) -> Path:
    return workspace / __version__ / "cubins"


def _leftovers(workspace: Path) -> list[str]:
    cubins = _cubins(workspace)
    return sorted(p.name for p in cubins.iterdir()) if cubins.is_dir() else []


def _warnings(log: LogRecorder) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelname == "WARNING"]


def _load(dtype: str = "bfloat16"):  # noqa: ANN202 - a tvm_ffi module
    return gen_norm_module(dtype).build_and_load()


def _path_without_nvcc() -> str:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "nvcc").exists())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def node(workspace: Path, served: Served, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a fleet node: the served repository, no compiling, target 9.0a."""
    for name in (
        "FLASHINFER_CUBIN_DIR",
        "FLASHINFER_NO_DOWNLOAD",
        "FLASHINFER_CUBIN_CHECKSUM_DISABLED",
        "FLASHINFER_AOT_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", served.url)
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setenv("FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT", "10")
    return workspace


def _subprocess_env(workspace: Path, served: Served, **extra: str) -> dict[str, str]:
    return {
        "PATH": _path_without_nvcc(),
        "FLASHINFER_NVCC": "",
        "CUDA_HOME": "",
        "FLASHINFER_DISABLE_JIT": "1",
        "FLASHINFER_AOT_DIR": "",
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "FLASHINFER_WORKSPACE_BASE": str(workspace),
        "FLASHINFER_CUBINS_REPOSITORY": served.url,
        **extra,
    }


def _rehash_record(served: Served, uri: str) -> None:
    """Make the index agree with ``uri``'s aot.json as it now is (an edited build)."""
    index = served.index
    record = served.root / uri / "aot.json"
    index["modules"][uri]["files"]["aot.json"] = {
        "size": record.stat().st_size,
        "sha256": _sha256(record),
    }
    served.index = index


# -- the index precompile writes ------------------------------------------------------------


def test_precompile_writes_the_index_of_its_layer(built_repository: Path) -> None:
    index = json.loads((built_repository / "repository.json").read_text())
    assert index["format"] == remote.INDEX_FORMAT
    assert sorted(index["modules"]) == list(NORM_URIS)
    for uri, entry in index["modules"].items():
        assert entry["op"] == "norm" and entry["archs"] == ["9.0a"]
        assert entry["flashinfer"] == __version__
        assert sorted(entry["files"]) == sorted(["aot.json", f"{uri}.so"])
        for name, item in entry["files"].items():
            path = built_repository / uri / name
            assert item == {"size": path.stat().st_size, "sha256": _sha256(path)}


def test_the_index_is_rebuilt_from_the_layer_keeping_earlier_modules(
    built_repository: Path, tmp_path: Path
) -> None:
    layer = tmp_path / "layer"
    shutil.copytree(built_repository, layer)
    shutil.rmtree(layer / "norm_dtype_f32")
    shutil.copytree(layer / "norm_dtype_f16", layer / ".norm_dtype_f16.new")  # mid-publish
    index = write_index(layer, {BF16: "norm_again"})
    assert sorted(index.modules) == [BF16, "norm_dtype_f16"]
    assert index.modules[BF16].op == "norm_again"
    assert index.modules["norm_dtype_f16"].op == "norm"  # from the previous index
    assert remote.RepositoryIndex.load(layer / "repository.json") == index


# -- loading from the repository ------------------------------------------------------------


def test_a_node_without_nvcc_loads_from_the_repository_then_from_its_download_dir(
    served: Served, tmp_path: Path
) -> None:
    env = _subprocess_env(tmp_path / "ws", served)
    first = run_python(LOAD_BF16, env=env, cwd=tmp_path)
    assert first.stdout.strip() == "bfloat16"
    assert "compil" not in first.stderr
    assert served.requests() == ["/repository.json", f"/{BF16}/aot.json", f"/{BF16}/{BF16}.so"]
    module_dir = _cubins(tmp_path / "ws") / BF16
    assert sorted(p.name for p in module_dir.iterdir()) == ["aot.json", f"{BF16}.so"]
    assert _sha256(module_dir / f"{BF16}.so") == _sha256(served.root / BF16 / f"{BF16}.so")

    second = run_python(LOAD_BF16, env=env, cwd=tmp_path)
    assert second.stdout.strip() == "bfloat16"
    assert len(served.requests()) == 3  # not even the index


def test_racing_processes_download_each_file_once(served: Served, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore", **_subprocess_env(tmp_path / "ws", served))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD_BF16],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert out.strip() == "bfloat16"
    files = served.file_requests()
    assert sorted(files) == [f"/{BF16}/aot.json", f"/{BF16}/{BF16}.so"], files
    # A process that started late finds the module published: no index request at all.
    assert 1 <= served.requests().count("/repository.json") <= 8
    assert _leftovers(tmp_path / "ws") == [BF16]


# -- faults: one warning naming the URL and the cause, then the compile path ----------------


def _set_fault(glob: str, mode: str, seconds: float = 0) -> Callable[[Served], None]:
    return lambda served: served.fault(glob, mode, seconds)


def _edit_index(edit: Callable[[dict], object]) -> Callable[[Served], None]:
    def apply(served: Served) -> None:
        index = served.index
        edit(index)
        served.index = index

    return apply


def _library(index: dict) -> dict:
    return index["modules"][BF16]["files"][f"{BF16}.so"]


def _write_index_text(text: str) -> Callable[[Served], None]:
    return lambda served: (served.root / "repository.json").write_text(text)


def _record_for_8_0(served: Served) -> None:
    """aot.json says 8.0 while the index (sizes and sha256 right) says 9.0a: the index lies."""
    record = served.root / BF16 / "aot.json"
    data = json.loads(record.read_text())
    data["archs"] = ["8.0"]
    record.write_text(json.dumps(data))
    _rehash_record(served, BF16)


def _record_of_another_module(served: Served) -> None:
    shutil.copy(served.root / "norm_dtype_f16" / "aot.json", served.root / BF16 / "aot.json")
    _rehash_record(served, BF16)


FAULTS: dict[str, tuple[Callable[[Served], None], str, str]] = {
    # name: (inject, the file whose URL the warning names, cause)
    "404": (_set_fault("*.so", "404"), f"{BF16}.so", "HTTP 404"),
    "500 on the record": (_set_fault("*/aot.json", "500"), "aot.json", "HTTP 500"),
    "500 on the index": (
        _set_fault("*/repository.json", "500"),
        "repository.json",
        "HTTP 500",
    ),
    "stall before headers": (
        _set_fault("*.so", "stall_headers", 4),
        f"{BF16}.so",
        "no answer within 1 s (FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT)",
    ),
    "stall in the body": (
        _set_fault("*.so", "stall_body", 4),
        f"{BF16}.so",
        "no answer within 1 s (FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT)",
    ),
    "truncated body": (_set_fault("*.so", "truncate"), f"{BF16}.so", "truncated body"),
    "wrong bytes": (_set_fault("*.so", "corrupt"), f"{BF16}.so", "checksum mismatch"),
    "index gives a smaller size": (
        _edit_index(lambda i: _library(i).update(size=_library(i)["size"] - 1)),
        f"{BF16}.so",
        "longer than the",
    ),
    "index gives a larger size": (
        _edit_index(lambda i: _library(i).update(size=_library(i)["size"] + 1)),
        f"{BF16}.so",
        "bytes, the index gives",
    ),
    "index gives a wrong sha256": (
        _edit_index(lambda i: _library(i).update(sha256="0" * 64)),
        f"{BF16}.so",
        "checksum mismatch",
    ),
    "index lists a missing file": (
        _edit_index(
            lambda i: i["modules"][BF16]["files"].update(extra={"size": 1, "sha256": "0" * 64})
        ),
        "extra",
        "HTTP 404",
    ),
    "index leaves out the library": (
        _edit_index(lambda i: i["modules"][BF16]["files"].pop(f"{BF16}.so")),
        "repository.json",
        f"lists no {BF16}.so",
    ),
    "index names a path": (
        _edit_index(
            lambda i: i["modules"][BF16]["files"].update(
                {"../../evil": {"size": 1, "sha256": "0" * 64}}
            )
        ),
        "repository.json",
        "bad file name '../../evil'",
    ),
    "malformed index": (_write_index_text("{"), "repository.json", "not JSON"),
    "index of another format": (
        _write_index_text('{"format": 99, "modules": {}}'),
        "repository.json",
        "format 99",
    ),
    "index lies about the archs": (
        _record_for_8_0,
        "aot.json",
        "the index gives another archs than this record",
    ),
    "record of another module": (
        _record_of_another_module,
        "aot.json",
        "the record of 'norm_dtype_f16'",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_is_one_warning_then_the_compile_path(
    fault: str,
    node: Path,
    served: Served,
    jit_log: LogRecorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inject, file, cause = FAULTS[fault]
    if fault.startswith("stall"):
        monkeypatch.setenv("FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT", "1")
    inject(served)
    with pytest.raises(JitDisabledError) as err:
        _load()
    (warning,) = _warnings(jit_log)
    url = served.url.rstrip("/") + (
        "/repository.json" if file == "repository.json" else f"/{BF16}/{file}"
    )
    assert url in warning and cause in warning, warning
    assert warning.startswith(f"not downloading {BF16}: ")
    assert "FLASHINFER_DISABLE_JIT=1 forbids compiling" in str(err.value)
    assert f"downloading it failed: {url}" in str(err.value) and cause in str(err.value)
    assert _leftovers(node) == []  # nothing final, nothing partial


def test_without_nvcc_a_fault_ends_in_the_disabled_jit_error_naming_it(
    node: Path, served: Served, jit_log: LogRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path_without_nvcc())
    monkeypatch.delenv("FLASHINFER_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    served.fault("*.so", "404")
    with pytest.raises(JitDisabledError, match="'nvcc' not found") as err:
        _load()
    assert "downloading it failed" in str(err.value) and "HTTP 404" in str(err.value)
    assert len(_warnings(jit_log)) == 1
    assert _leftovers(node) == []


def test_a_server_that_is_down_is_a_warning(
    node: Path, monkeypatch: pytest.MonkeyPatch, jit_log: LogRecorder
) -> None:
    url = f"http://127.0.0.1:{_free_port()}/repo"
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", url)
    with pytest.raises(JitDisabledError, match="Connection refused"):
        _load()
    (warning,) = _warnings(jit_log)
    assert f"{url}/repository.json: Connection refused" in warning
    assert _leftovers(node) == []


def test_no_download_never_touches_the_network(
    node: Path, served: Served, monkeypatch: pytest.MonkeyPatch, jit_log: LogRecorder
) -> None:
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    with pytest.raises(JitDisabledError, match="FLASHINFER_NO_DOWNLOAD=1 forbids downloading"):
        _load()
    assert served.requests() == [] and _warnings(jit_log) == []
    assert cli(["artifacts", "list"]) == 1 and served.requests() == []


def test_a_module_the_index_does_not_list_is_not_requested(
    node: Path, served: Served, jit_log: LogRecorder
) -> None:
    _edit_index(lambda i: i["modules"].pop(BF16))(served)
    with pytest.raises(JitDisabledError, match="does not list it"):
        _load()
    assert served.requests() == ["/repository.json"] and _warnings(jit_log) == []


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [("archs", ["8.0"], "archs"), ("flashinfer", "0.0.1.other", "flashinfer version")],
)
def test_a_build_for_another_target_is_never_used(
    field: str, value: object, problem: str, node: Path, served: Served, jit_log: LogRecorder
) -> None:
    # A consistent repository (records and index agree, checksums right) built otherwise.
    for uri in NORM_URIS:
        record = served.root / uri / "aot.json"
        data = json.loads(record.read_text())
        data[field] = value
        record.write_text(json.dumps(data))
        _rehash_record(served, uri)
        _edit_index(lambda i, uri=uri: i["modules"][uri].update({field: value}))(served)
    with pytest.raises(JitDisabledError, match=f"built for another target \\(other {problem}\\)"):
        _load()
    assert served.file_requests() == [] and _warnings(jit_log) == []

    # Downloaded on purpose for that target, it is still not used here.
    arch_option = ["--arch", "8.0"] if field == "archs" else []
    with pytest.MonkeyPatch.context() as m:
        m.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "1" if field == "flashinfer" else "0")
        assert cli(["artifacts", "download", *arch_option]) == 0
    assert (_cubins(node) / BF16 / f"{BF16}.so").is_file()
    assert aot.find(BF16) is None
    with pytest.raises(JitDisabledError):
        _load()


def test_checksum_disabled_warns_once_and_trusts_the_record(served: Served, tmp_path: Path) -> None:
    index = served.index
    for uri in (BF16, "norm_dtype_f16"):
        index["modules"][uri]["files"][f"{uri}.so"]["sha256"] = "0" * 64
    served.index = index
    code = LOAD_BF16 + "print(flashinfer.get_norm_module(torch.float16).dtype())\n"
    env = _subprocess_env(tmp_path / "ws", served, FLASHINFER_CUBIN_CHECKSUM_DISABLED="1")
    proc = run_python(code, env=env, cwd=tmp_path)
    assert proc.stdout.split() == ["bfloat16", "float16"]
    assert proc.stderr.count("FLASHINFER_CUBIN_CHECKSUM_DISABLED=1") == 1, proc.stderr
    assert "not downloading" not in proc.stderr


def test_a_damaged_download_is_downloaded_again(
    node: Path, served: Served, jit_log: LogRecorder
) -> None:
    assert remote.fetch(BF16)
    library = _cubins(node) / BF16 / f"{BF16}.so"
    damaged = library.with_name("damaged")
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    os.replace(damaged, library)
    assert _load().dtype() == "bfloat16"
    assert served.file_requests().count(f"/{BF16}/{BF16}.so") == 2
    assert any("downloaded again" in w for w in _warnings(jit_log))


def test_a_download_killed_midway_leaves_nothing_loadable(
    node: Path, served: Served, tmp_path: Path
) -> None:
    served.fault("*.so", "stall_body", 120)
    env = dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        **_subprocess_env(node, served, FLASHINFER_CUBIN_DOWNLOAD_TIMEOUT="300"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD_BF16],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        partial = None
        while partial is None and time.monotonic() < deadline:
            found = [
                p
                for p in _cubins(node).glob(f".{BF16}.partial-*")
                if (p / f"{BF16}.so").is_file() and (p / f"{BF16}.so").stat().st_size > 0
            ]
            partial = found[0] if found else None
            time.sleep(0.05)
        assert partial is not None, "the download never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _leftovers(node) == [partial.name]  # no module under its final name
    assert aot.find(BF16) is None

    served.clear_faults()
    assert _load().dtype() == "bfloat16"
    assert _leftovers(node) == [BF16]  # the dead process's partial dir is gone
    assert served.file_requests().count(f"/{BF16}/{BF16}.so") == 2


def test_a_file_url_and_an_absolute_path_are_repositories(
    node: Path, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", str(served.root))
    assert config.cubins_repository == served.root.as_uri()
    assert _load().dtype() == "bfloat16"
    assert served.requests() == []
    assert _leftovers(node) == [BF16]


@pytest.mark.parametrize("value", ["ftp://host/repo", "relative/dir", "http:///no-host"])
def test_a_bad_repository_setting_names_the_variable(
    value: str, node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", value)
    with pytest.raises(ValueError, match="FLASHINFER_CUBINS_REPOSITORY"):
        _load()
    check = _repository()
    assert not check.ok and "FLASHINFER_CUBINS_REPOSITORY" in check.detail


# -- the command line and doctor --------------------------------------------------------------


def test_artifacts_list_download_and_clear(
    node: Path, served: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("FLASHINFER_CUBIN_DOWNLOAD_THREADS", "3")
    assert cli(["artifacts", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:4]] == list(NORM_URIS)
    assert all(line.split()[1:3] == ["norm", "9.0a"] for line in out[1:4])
    assert all(line.endswith("  available") for line in out[1:4])
    assert out[4].startswith(f"3 module(s) in {served.url}; 0 downloaded")

    served.fault("/fleet/repo/norm_dtype_f16/*.so", "404")
    assert cli(["artifacts", "download", "--ops", "norm"]) == 1
    captured = capsys.readouterr()
    assert "2 module(s) downloaded, 0 already there, 1 failed" in captured.out
    assert "not downloaded: norm_dtype_f16" in captured.err
    assert "downloading modules: 3/3" in captured.err

    served.clear_faults()
    assert cli(["download-cubin"]) == 0  # the reference's name
    assert "1 module(s) downloaded, 2 already there, 0 failed" in capsys.readouterr().out
    assert sorted(served.file_requests()) == sorted(
        [f"/{u}/aot.json" for u in NORM_URIS]
        + [f"/{u}/{u}.so" for u in NORM_URIS]
        + ["/norm_dtype_f16/aot.json", "/norm_dtype_f16/norm_dtype_f16.so"]  # the retry
    )
    assert _leftovers(node) == list(NORM_URIS)

    assert cli(["artifacts", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(line.endswith("  downloaded") for line in out[1:4])
    assert cli(["artifacts", "list", "--arch", "10.0a"]) == 0
    assert "downloaded, not for this machine (other archs)" in capsys.readouterr().out

    assert cli(["artifacts", "download", "--ops", "rope"]) == 1
    assert "no module of op(s) rope" in capsys.readouterr().err
    assert cli(["artifacts", "download", "--arch", "8.0"]) == 1
    assert "no module of the repository is built for this target" in capsys.readouterr().err

    assert cli(["artifacts", "clear"]) == 0
    assert "removed 3 downloaded module(s)" in capsys.readouterr().out
    assert not _cubins(node).exists()

    monkeypatch.delenv("FLASHINFER_CUBINS_REPOSITORY")
    assert cli(["list-cubins"]) == 1
    assert "set FLASHINFER_CUBINS_REPOSITORY" in capsys.readouterr().err


def test_doctor_shows_the_repository_and_whether_it_answers(
    node: Path, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _repository()
    assert check.ok and check.detail.startswith(f"{served.url}: 3 module(s), 3 for this machine")
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "10.0a")
    assert "3 module(s), 0 for this machine" in _repository().detail
    monkeypatch.setenv("FLASHINFER_CUBINS_REPOSITORY", f"http://127.0.0.1:{_free_port()}")
    check = _repository()
    assert not check.ok and "repository.json: Connection refused" in check.detail
    assert "precompile --out" in check.fix
    monkeypatch.delenv("FLASHINFER_CUBINS_REPOSITORY")
    assert _repository().ok and "unset" in _repository().detail
    assert len(served.requests()) == 2  # one index request per check that asked
