"""The JIT cache under faults (issue 16, items 1, 3, 4, 9, 10, 11 and the JIT parts of 12).

Every test uses the tiny test module (about 2 s to build); tests that only read a build
share one, copied into their own workspace (identities do not depend on the workspace
path, so a copied workspace is warm).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from flashinfer.__main__ import main as cli
from flashinfer.jit import aot, builder, env, registry
from flashinfer.jit.builder import JitCompileError
from flashinfer.jit.env import WorkspaceError
from flashinfer.jit.precompile import precompile
from flashinfer.jit.render import render_template
from flashinfer.version import __version__
from tests.conftest import REPO_ROOT, run_python
from tests.jit.tiny_module import load_fresh, tiny_spec, write_tiny_sources

URI = "tiny_test_module"
LIBRARY = f"{URI}.so"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sources, workspace base) of one build of the tiny module, shared by the module."""
    root = tmp_path_factory.mktemp("template")
    src = write_tiny_sources(root / "src")
    base = root / "workspace"
    run_python(_load_code(src), env={"FLASHINFER_WORKSPACE_BASE": str(base)})
    return src, base


@pytest.fixture
def warm(
    template: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """(sources, this test's copy of the built workspace), selected as the workspace."""
    src, base = template
    copy = tmp_path / "workspace"
    shutil.copytree(base, copy, symlinks=True)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(copy))
    return src, copy


def _load_code(src: Path) -> str:
    return (
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from pathlib import Path\n"
        "from tests.jit.tiny_module import tiny_spec\n"
        f"print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())\n"
    )


def _load_in_fresh_process(
    src: Path, base: Path, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    return run_python(
        _load_code(src), env={"FLASHINFER_WORKSPACE_BASE": str(base), **env_vars}, check=False
    )


def _library(base: Path) -> Path:
    (library,) = (base / __version__ / "cached_ops" / URI).glob(f"*/{LIBRARY}")
    return library


# -- 1. a source saved while its module compiles ------------------------------------------

LAUNCHER = """
import os, subprocess, sys, time
from pathlib import Path
cmd = sys.argv[1:]
code = subprocess.call(cmd)
count = Path(os.environ["EDIT_COUNT"])
done = int(count.read_text()) if count.exists() else 0
if code == 0 and any(a.endswith("kernel.cu") for a in cmd) and done < int(os.environ["EDIT_LIMIT"]):
    Path(os.environ["EDIT_HEADER"]).write_text(f"#pragma once\\n#define A_VALUE {100 + done}\\n")
    count.write_text(str(done + 1))
    # The object ends up newer than the edit, as when the save lands while nvcc runs:
    # ninja alone then takes the object as up to date.
    later = time.time() + 5
    os.utime(cmd[cmd.index("-o") + 1], (later, later))
sys.exit(code)
"""


@pytest.fixture
def edits_during_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Returns ``arm(src, limit)``: nvcc runs through a launcher that rewrites a.cuh after
    compiling kernel.cu, ``limit`` times in all."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)

    def arm(src: Path, limit: int) -> Path:
        count = tmp_path / "edits"
        count.unlink(missing_ok=True)
        monkeypatch.setenv("FLASHINFER_NVCC_LAUNCHER", f"{sys.executable} {launcher}")
        monkeypatch.setenv("EDIT_HEADER", str(src / "include" / "tiny" / "a.cuh"))
        monkeypatch.setenv("EDIT_COUNT", str(count))
        monkeypatch.setenv("EDIT_LIMIT", str(limit))
        return count

    return arm


def test_a_header_saved_during_the_first_build_is_compiled_before_publishing(
    workspace: Path, tmp_path: Path, edits_during_compile, jit_log
) -> None:
    src = write_tiny_sources(tmp_path / "src")
    edits_during_compile(src, 1)
    assert tiny_spec(src).build_and_load().a_value() == 100
    assert any(
        "changed while tiny_test_module compiled; compiling again" in m for m in jit_log.messages()
    )
    # A fresh process trusts the manifest: it must describe what was compiled.
    proc = _load_in_fresh_process(src, workspace, FLASHINFER_NVCC_LAUNCHER="")
    assert proc.stdout.strip() == "100", proc.stderr
    assert "compiling" not in proc.stderr


def test_a_tracked_header_saved_during_a_rebuild_is_compiled_before_publishing(
    warm, tmp_path: Path, edits_during_compile, jit_log
) -> None:
    _, base = warm
    src = write_tiny_sources(tmp_path / "src")  # own sources: this test edits them
    tiny_spec(src).build_and_load()
    (src / "include" / "tiny" / "a.cuh").write_text("#pragma once\n#define A_VALUE 5\n")
    edits_during_compile(src, 1)
    spec = tiny_spec(src)
    spec.build()
    assert load_fresh(spec.library_path, tmp_path).a_value() == 100
    assert _load_in_fresh_process(src, base, FLASHINFER_NVCC_LAUNCHER="").stdout.strip() == "100"


def test_a_header_that_keeps_changing_is_rebuilt_by_the_next_load(
    workspace: Path, tmp_path: Path, edits_during_compile, jit_log
) -> None:
    src = write_tiny_sources(tmp_path / "src")
    edits_during_compile(src, 99)
    spec = tiny_spec(src)
    spec.build()
    assert len([m for m in jit_log.messages(logging.WARNING) if "kept changing" in m]) == 1
    last = 100 + builder.BUILD_ATTEMPTS - 1
    assert (src / "include" / "tiny" / "a.cuh").read_text().endswith(f"A_VALUE {last}\n")
    assert spec.is_stale
    proc = _load_in_fresh_process(src, workspace, FLASHINFER_NVCC_LAUNCHER="")
    assert proc.stdout.strip() == str(last), proc.stderr
    assert "a.cuh changed" in proc.stderr


# -- 3. a damaged library is rebuilt, never loaded ------------------------------------------


def test_a_truncated_library_is_rebuilt_in_every_new_process(warm) -> None:
    src, base = warm
    library = _library(base)
    with open(library, "r+b") as fh:
        fh.truncate(library.stat().st_size // 2)
    proc = _load_in_fresh_process(src, base)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr
    assert "changed size" in proc.stderr and "rebuilding tiny_test_module" in proc.stderr
    proc = _load_in_fresh_process(src, base)
    assert proc.stdout.strip() == "1" and "compiling" not in proc.stderr + proc.stdout


def test_a_library_rewritten_in_place_is_rebuilt(warm) -> None:
    src, base = warm
    library = _library(base)
    data = bytearray(library.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 4096] = os.urandom(4096)
    library.write_bytes(bytes(data))
    proc = _load_in_fresh_process(src, base)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr
    assert "was modified" in proc.stderr


def test_a_copied_workspace_is_hashed_once_then_warm(warm, jit_log) -> None:
    src, _ = warm
    spec = tiny_spec(src)
    assert not spec.is_stale  # a new inode: the bytes are hashed and match
    assert spec.build_and_load().a_value() == 1
    assert jit_log.compiles() == []


def test_cache_list_reports_damage_and_verify_removes_it(
    warm, capsys: pytest.CaptureFixture[str]
) -> None:
    src, base = warm
    library = _library(base)
    assert cli(["cache", "list"]) == 0
    assert f"{URI}" in capsys.readouterr().out
    # Same size, same mtime: only hashing can tell.
    st = library.stat()
    data = bytearray(library.read_bytes())
    data[-100:] = bytes(b ^ 0xFF for b in data[-100:])
    library.write_bytes(bytes(data))
    os.utime(library, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cli(["cache", "verify"]) == 1
    out = capsys.readouterr().out
    assert f"removed {URI}/" in out and ("sha256" in out or "was modified" in out)
    assert _load_in_fresh_process(src, base).stdout.strip() == "1"
    with open(_library(base), "r+b") as fh:
        fh.truncate(1000)
    assert cli(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "changed size" in out and "1 would be rebuilt on load" in out
    assert cli(["cache", "verify"]) == 1


def _tiny_op_specs():  # noqa: ANN202 - registered for precompile
    return [tiny_spec(Path(os.environ["FAULTS_TINY_SRC"]))]


@pytest.fixture
def aot_layer(warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(sources, the tiny module's library in a precompiled AOT layer in use)."""
    src, _ = warm
    monkeypatch.setenv("FAULTS_TINY_SRC", str(src))
    registry.registered_ops()  # the real ops first, so the test op is the only addition
    monkeypatch.setitem(registry._OPS, "faults_tiny", _tiny_op_specs)  # gone after the test
    layer = tmp_path / "layer"
    (library,) = precompile(layer, "9.0a", ["faults_tiny"]).published
    monkeypatch.setenv("FLASHINFER_AOT_DIR", str(layer))
    assert aot.find(URI) == library
    return src, library


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_a_damaged_aot_library_is_skipped_with_a_warning(
    aot_layer, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    src, library = aot_layer
    data = library.read_bytes()
    library.chmod(0o644)
    if damage == "truncate":
        library.write_bytes(data[: len(data) // 2])
    else:
        library.write_bytes(data[:-64] + os.urandom(64))
    with caplog.at_level(logging.WARNING, logger="flashinfer.jit"):
        assert aot.find(URI) is None
    assert "not using tiny_test_module" in caplog.text
    proc = _load_in_fresh_process(src, Path(os.environ["FLASHINFER_WORKSPACE_BASE"]))
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr


def test_cache_verify_hashes_aot_libraries(aot_layer, capsys: pytest.CaptureFixture[str]) -> None:
    _, library = aot_layer
    assert cli(["cache", "verify"]) == 0
    st = library.stat()
    data = bytearray(library.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    library.chmod(0o644)
    library.write_bytes(bytes(data))
    os.utime(library, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    assert cli(["cache", "verify"]) == 1
    assert f"AOT library {library}" in capsys.readouterr().out


# -- 4. the workspace setting ------------------------------------------------------------


def test_a_relative_workspace_is_resolved_once_against_the_first_working_dir(
    tmp_path: Path,
) -> None:
    src = write_tiny_sources(tmp_path / "src")
    (tmp_path / "elsewhere").mkdir()
    code = (
        _load_code(src) + "import os\nfrom flashinfer.jit import env\n"
        "os.chdir('elsewhere')\n"
        f"print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())\n"
        "print(env.workspace_dir())\n"
    )
    proc = run_python(code, env={"FLASHINFER_WORKSPACE_BASE": "rel-ws"}, cwd=tmp_path)
    first, second, workspace = proc.stdout.split()
    assert first == second == "1"
    assert Path(workspace) == tmp_path / "rel-ws" / __version__
    assert proc.stderr.count("compiling tiny_test_module for ") == 1
    assert not (tmp_path / "elsewhere" / "rel-ws").exists()


def test_an_empty_workspace_setting_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashinfer.config import Config, config

    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "  ")
    assert config.workspace_base == Config.workspace_base.default
    assert config.workspace_base.is_absolute()


# -- 9. settings are validated when a module loads from the cache too ---------------------


@pytest.mark.parametrize(
    "name,value",
    [("MAX_JOBS", "0"), ("FLASHINFER_CACHE_MAX_GB", "-1"), ("FLASHINFER_JIT_VERBOSE", "maybe")],
)
def test_an_invalid_setting_is_reported_on_a_cache_hit(
    warm, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    src, _ = warm
    spec = tiny_spec(src)
    assert not spec.is_stale
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"invalid value '{value}' for {name}"):
        spec.build_and_load()


def test_cache_gc_rejects_a_negative_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(["cache", "gc", "--max-gb", "-1"])
    assert exit_info.value.code == 2
    assert "--max-gb: '-1': expected a number >= 0" in capsys.readouterr().err


# -- 10. the compiler's first error is the headline ----------------------------------------


def test_an_unsupported_arch_flag_headlines_nvccs_error(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-gencode=arch=compute_70,code=sm_70")
    with pytest.raises(JitCompileError) as err:
        tiny_spec(write_tiny_sources(tmp_path / "src")).build()
    assert str(err.value).splitlines()[0] == (
        "nvcc fatal   : Unsupported gpu architecture 'compute_70'"
    )


def test_an_arch_nvcc_cannot_build_is_refused_before_compiling(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "7.0")
    with pytest.raises(JitCompileError, match=r"cannot build arch 7\.0.*FLASHINFER_CUDA_ARCH_LIST"):
        tiny_spec(write_tiny_sources(tmp_path / "src")).build()
    assert jit_log.compiles() == []


# -- 11. obstructed, partly read-only and read-only workspaces ------------------------------


@pytest.mark.parametrize("obstacle", ["cached_ops", f"cached_ops/{URI}"])
def test_a_file_in_the_way_of_the_cache_is_one_clear_error(
    workspace: Path, tmp_path: Path, obstacle: str
) -> None:
    blocked = workspace / __version__ / obstacle
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a dir")
    with pytest.raises(WorkspaceError) as err:
        tiny_spec(write_tiny_sources(tmp_path / "src")).build_and_load()
    message = str(err.value)
    assert str(workspace) in message and "FLASHINFER_WORKSPACE_BASE" in message
    assert message.startswith("cannot build module tiny_test_module: ")


def test_a_file_in_the_way_of_generated_sources_is_one_clear_error(
    workspace: Path, tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("#define X {{ x }}\n")
    blocked = workspace / __version__ / "generated"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a dir")
    with pytest.raises(
        WorkspaceError,
        match=r"cannot write the rendered t\.h of faults_gen: .*"
        r"generated",
    ):
        render_template(template, "faults_gen", "t.h", x=1)


@pytest.mark.parametrize(
    "manifest",
    [
        "[]",
        '"text"',
        "null",
        '{"format": 2, "identity": [], "library": 1, "inputs": {}, '
        '"objects": {}, "library_record": [1, 2, 3, "x"]}',
        "MUTATE_INPUTS",
        "MUTATE_RECORD",
        "{truncated",
    ],
)
def test_a_manifest_that_does_not_parse_is_treated_as_absent(warm, manifest: str, jit_log) -> None:
    src, base = warm
    path = _library(base).with_name("manifest.json")
    if manifest.startswith("MUTATE"):
        data = json.loads(path.read_text())
        data["inputs" if manifest == "MUTATE_INPUTS" else "library_record"] = ["a", "b"]
        manifest = json.dumps(data)
    path.write_text(manifest)
    spec = tiny_spec(src)
    assert spec.is_stale
    assert spec.build_and_load().a_value() == 1
    assert jit_log.compiles() == [
        "compiling tiny_test_module for sm_90a (its manifest is unreadable or from an older format)"
    ]


def test_a_read_only_workspace_is_still_read_and_new_modules_compile_elsewhere(
    warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    src, base = warm
    # Root can write anywhere, so the read-only verdict is given to the probe directly.
    real_problem = env._problem
    monkeypatch.setattr(
        env, "_problem", lambda path: "read-only" if path == base else real_problem(path)
    )
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    env._writable_base.cache_clear()
    try:
        assert env.read_only_workspace() == base / __version__
        assert tiny_spec(src).build_and_load().a_value() == 1
        assert jit_log.compiles() == []
        fresh = tiny_spec(src, name="tiny_faults_new")
        assert fresh.build_and_load().a_value() == 1
        assert fresh.library_path.is_relative_to(tmp_path / "tmp")
        assert len(jit_log.compiles()) == 1
        warnings = [m for m in jit_log.messages(logging.WARNING) if "is read-only" in m]
        assert len(warnings) == 1 and "modules built there are loaded from it" in warnings[0]
    finally:
        env._writable_base.cache_clear()


# -- 12. smaller ones ---------------------------------------------------------------------


def test_a_deleted_library_is_rebuilt_with_the_reason(warm, jit_log) -> None:
    src, base = warm
    library = _library(base)
    stale_log = library.with_name("build-somehost-1-deadbeef.log")
    stale_log.write_text("an old failure")
    library.unlink()
    assert tiny_spec(src).build_and_load().a_value() == 1
    assert jit_log.compiles() == [
        f"rebuilding tiny_test_module for sm_90a: its library {LIBRARY} is missing"
    ]
    assert not stale_log.exists()


def test_cache_list_does_not_create_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "absent"
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(base))
    assert cli(["cache", "list"]) == 0
    assert "no cached modules" in capsys.readouterr().out
    assert not base.exists()


def test_precompile_arch_errors_name_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["precompile", "--arch", "foo", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "--arch" in err and "FLASHINFER_CUDA_ARCH_LIST" not in err
    assert cli(["precompile", "--arch", "7.0", "--out", str(tmp_path / "out")]) == 1
    assert "--arch: nvcc" in capsys.readouterr().err


def test_the_cli_has_a_version_and_prints_no_warnings() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flashinfer", "--version"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
        check=True,
    )
    assert proc.stdout.strip() == f"flashinfer {__version__}"
    assert proc.stderr == ""
