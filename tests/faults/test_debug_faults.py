"""Debugging tools under faults (issue 16, items 5, 6 and part of 12), all on the CPU.

- An unusable log destination, dump directory or debug-printer save directory never breaks
  the call: one warning line on stderr, the call's result unchanged.
- ``replay`` runs only ``@flashinfer_api`` functions of flashinfer (and of modules allowed
  explicitly); hostile dumps are refused without running anything, and a malformed dump
  is one row with its reason.
- The level-2 debug printer prints a line, not a blank one, for a launch without arguments.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from flashinfer import norm
from flashinfer.__main__ import main as cli
from flashinfer.api_logging import API_MARKER, ApiLogger
from flashinfer.debug_printer import LaunchPrinter
from flashinfer.dump import Dumper
from flashinfer.logdest import Destination
from flashinfer.replay import replay, replay_call
from tests.conftest import REPO_ROOT, run_python
from tests.debug import sample_api

SAMPLE = "tests.debug.sample_api"
IS_ROOT = os.geteuid() == 0
LOGDEST_WARNING = "cannot write the log to FLASHINFER_LOGDEST="


def _warnings(err: str, marker: str) -> list[str]:
    return [line for line in err.splitlines() if marker in line]


def _unusable_path(kind: str, tmp_path: Path) -> Path:
    """A path no process can open as a file (root included), or one root alone could."""
    if kind == "directory":
        (tmp_path / "a_dir").mkdir()
        return tmp_path / "a_dir"
    if kind == "under_a_file":
        (tmp_path / "a_file").write_text("x")
        return tmp_path / "a_file" / "log"
    if kind == "proc":
        return Path("/proc") / f"flashinfer-test-{tmp_path.name}" / "log"
    if kind == "unknown_user":
        return Path("~no_such_user_flashinfer_test/log")  # expanduser fails: RuntimeError
    if kind == "no_permission":
        if IS_ROOT:
            pytest.skip("permissions do not bind root")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        return locked / "log"
    raise AssertionError(kind)


# -- item 5: FLASHINFER_LOGDEST --------------------------------------------------------------


@pytest.mark.parametrize(
    "kind", ["directory", "under_a_file", "proc", "unknown_user", "no_permission"]
)
def test_unusable_log_destination_falls_back_to_stderr_with_one_warning(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _unusable_path(kind, tmp_path)
    func = ApiLogger(3, Destination(str(path))).decorate(sample_api.add_and_sub)
    a, b = torch.randn(4), torch.randn(4)
    for _ in range(3):
        total, diff = func(a, b, 2.0)
        assert torch.equal(total, a + 2 * b) and torch.equal(diff, a - 2 * b)
    err = capsys.readouterr().err
    (warning,) = _warnings(err, LOGDEST_WARNING)
    assert str(path) in warning and "Error" in warning and "logging to stderr instead" in warning
    assert err.count("FlashInfer API Call: add_and_sub") == 3  # the log itself, on stderr
    assert err.count("Output value:") == 3


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_destination_that_fails_on_write_falls_back_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/dev/full opens, and every write fails (ENOSPC): the failure after opening."""
    func = ApiLogger(1, Destination("/dev/full")).decorate(sample_api.concat)
    for _ in range(2):
        assert torch.equal(func([torch.ones(2), torch.zeros(1)]), torch.tensor([1.0, 1.0, 0.0]))
    err = capsys.readouterr().err
    (warning,) = _warnings(err, LOGDEST_WARNING)
    assert "/dev/full" in warning and "No space left on device" in warning
    assert err.count("FlashInfer API Call: concat") == 2


def test_a_closed_stdout_falls_back_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = open(os.devnull, "w")  # noqa: SIM115
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)
    func = ApiLogger(1, Destination("stdout")).decorate(sample_api.scale_)
    x = torch.ones(3)
    func(x, 2.0)
    func(x, 2.0)
    assert torch.equal(x, torch.full((3,), 4.0))
    err = capsys.readouterr().err
    assert len(_warnings(err, "FLASHINFER_LOGDEST=stdout")) == 1
    assert err.count("FlashInfer API Call: scale_") == 2


def test_unusable_log_destination_in_a_fresh_process(tmp_path: Path) -> None:
    """The real path: FLASHINFER_LOGDEST from the environment, APIs decorated at import."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
from tests.debug import sample_api
x = torch.ones(2)
sample_api.scale_(x, 3.0)
sample_api.scale_(x, 3.0)
print("result", x.tolist())
"""
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": str(tmp_path)})
    assert "result [9.0, 9.0]" in proc.stdout
    assert len(_warnings(proc.stderr, LOGDEST_WARNING)) == 1
    assert proc.stderr.count("FlashInfer API Call: scale_") == 2
    assert "Traceback" not in proc.stderr


# -- item 5: FLASHINFER_DUMP_DIR and FLASHINFER_DEBUG_PRINTER_DIR -----------------------------


@pytest.mark.parametrize("kind", ["under_a_file", "proc", "no_permission"])
def test_unusable_dump_dir_stops_dumps_with_one_warning(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _unusable_path(kind, tmp_path)
    dumper = Dumper(directory)
    func = ApiLogger(10, Destination(str(tmp_path / "log")), dumper).decorate(sample_api.concat)
    for _ in range(3):
        assert torch.equal(func([torch.ones(1), torch.zeros(2)]), torch.tensor([1.0, 0.0, 0.0]))
    (warning,) = _warnings(capsys.readouterr().err, "dumps stopped")
    assert f"FLASHINFER_DUMP_DIR={directory}" in warning and "without dumps" in warning
    assert dumper.stopped is not None and "Inputs dumped" not in (tmp_path / "log").read_text()


def test_a_dump_name_taken_by_an_earlier_process_skips_only_that_dump(tmp_path: Path) -> None:
    """Pids are reused (containers): a colliding name must not stop the dumps."""
    root = tmp_path / "dumps"
    (root / f"000000_{os.getpid()}_scale_").mkdir(parents=True)
    dumper = Dumper(root)
    func = ApiLogger(10, Destination(str(tmp_path / "log")), dumper).decorate(sample_api.scale_)
    func(torch.ones(2), 2.0)
    func(torch.ones(2), 2.0)
    assert dumper.stopped is None
    assert (root / f"000001_{os.getpid()}_scale_" / "call.json").is_file()


def test_unusable_dump_dir_in_a_fresh_process(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
from tests.debug import sample_api
print("result", [sample_api.concat([torch.ones(1), torch.zeros(1)]).tolist() for _ in range(3)])
"""
    proc = run_python(
        code,
        env={
            "FLASHINFER_LOGLEVEL": "10",
            "FLASHINFER_DUMP_DIR": str(tmp_path / "a_file" / "dumps"),
            "FLASHINFER_LOGDEST": str(tmp_path / "log"),
        },
    )
    assert "result [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]" in proc.stdout
    assert len(_warnings(proc.stderr, "dumps stopped")) == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["under_a_file", "proc", "no_permission"])
def test_unusable_debug_printer_dir_stops_saves_with_one_warning(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _unusable_path(kind, tmp_path)
    printer = LaunchPrinter(1, dest=Destination(str(tmp_path / "log")), directory=directory)
    launch = printer.wrap("m.scale", lambda out, x: out.copy_(x * 2), ("out", "x"))
    out, x = torch.zeros(3), torch.arange(3.0)
    for _ in range(3):
        launch(out, x)
        assert torch.equal(out, x * 2)
    (warning,) = _warnings(capsys.readouterr().err, "FLASHINFER_DEBUG_PRINTER_DIR")
    assert str(directory) in warning and "stops saving" in warning


# -- item 12 (part): the level-2 printer and launches without arguments ----------------------


def test_level_2_prints_a_line_for_a_launch_without_arguments(tmp_path: Path) -> None:
    log = tmp_path / "log"
    printer = LaunchPrinter(2, dest=Destination(str(log)))
    assert printer.wrap("m.sync", lambda: 7, ())() == 7
    assert log.read_text().splitlines() == [
        "[ before_launch: m.sync ] (no arguments)",
        "[ after_launch: m.sync ] (no arguments)",
    ]


# -- item 6: replay runs only @flashinfer_api functions ---------------------------------------


def _write_dump(
    directory: Path,
    module: str,
    qualname: str,
    args: list[dict[str, Any]],
    tensors: dict[str, torch.Tensor] | None = None,
    status: str = "completed",
) -> Path:
    directory.mkdir(parents=True)
    manifest = {
        "format": 1,
        "function": {"module": module, "qualname": qualname},
        "call_index": 0,
        "pid": 1,
        "tensor_format": "pt",
        "args": args,
        "status": status,
    }
    (directory / "call.json").write_text(json.dumps(manifest))
    torch.save(tensors or {}, directory / "inputs.pt")
    return directory


def _value(name: str, value: Any, param_kind: str = "POSITIONAL_OR_KEYWORD") -> dict[str, Any]:
    return {"name": name, "param_kind": param_kind, "kind": "value", "value": value}


def _tensor(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "param_kind": "POSITIONAL_OR_KEYWORD",
        "kind": "tensor",
        "key": name,
        "device": "cpu",
        "shape": [2],
        "dtype": "float32",
        "stride": [1],
    }


def _hostile(case: str, marker: Path, tmp_path: Path) -> tuple[str, str, list[dict[str, Any]]]:
    """(module, qualname, args) of a dump that must not run; most would create ``marker``."""
    if case == "os.system":
        return "os", "system", [_value("command", f"touch {marker}", "POSITIONAL_ONLY")]
    if case == "posix.system":
        return "posix", "system", [_value("command", f"touch {marker}", "POSITIONAL_ONLY")]
    if case == "subprocess.run":
        return "subprocess", "run", [_value("args", ["touch", str(marker)])]
    if case == "builtins.eval":
        return (
            "builtins",
            "eval",
            [_value("source", f"open({str(marker)!r}, 'w').close()", "POSITIONAL_ONLY")],
        )
    if case == "flashinfer.dump.os.system":  # through a module flashinfer imports
        return (
            "flashinfer.dump",
            "os.system",
            [_value("command", f"touch {marker}", "POSITIONAL_ONLY")],
        )
    if case == "undecorated flashinfer function":
        return (
            "flashinfer.jit.fileutil",
            "atomic_write_text",
            [_value("path", str(marker)), _value("text", "ran")],
        )
    if case == "flashinfer_lookalike":
        return "flashinfer_evil", "run", []
    if case == "import side effect":
        (tmp_path / "evil_import_mod.py").write_text(
            f"open({str(marker)!r}, 'w').close()\ndef run():\n    pass\n"
        )
        return "evil_import_mod", "run", []
    raise AssertionError(case)


HOSTILE = [
    "os.system",
    "posix.system",
    "subprocess.run",
    "builtins.eval",
    "flashinfer.dump.os.system",
    "undecorated flashinfer function",
    "flashinfer_lookalike",
    "import side effect",
]


@pytest.mark.parametrize("allow", [(), ("os", "posix", "subprocess", "builtins")])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_dumps_are_refused_and_do_not_run(
    case: str, allow: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a module allowed explicitly runs only its @flashinfer_api functions."""
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = tmp_path / "ran"
    module, qualname, args = _hostile(case, marker, tmp_path)
    call = _write_dump(tmp_path / "dumps" / "000000_1_x", module, qualname, args)
    (result,) = replay(call.parent, allow_modules=allow)
    assert result.status == "REFUSED", result
    assert result.function == f"{module}.{qualname}"
    assert not marker.exists()
    assert "evil_import_mod" not in sys.modules  # refused before any import


@pytest.mark.parametrize(
    "enum_module,enum_qualname,reason",
    [
        ("os", "system", "outside the modules replay may use"),
        ("flashinfer.dump", "os.system", "is not a class"),
        (SAMPLE, "add_and_sub", "is not an enum class"),
        (SAMPLE, "Wrapper", "is not an enum class"),
    ],
)
def test_enum_arguments_resolve_only_to_enum_classes(
    enum_module: str, enum_qualname: str, reason: str, tmp_path: Path
) -> None:
    args = [
        _tensor("a"),
        _tensor("b"),
        {
            "name": "mode",
            "param_kind": "KEYWORD_ONLY",
            "kind": "enum",
            "enum_module": enum_module,
            "enum_qualname": enum_qualname,
            "member": "FAST",
        },
    ]
    tensors = {"a": torch.ones(2), "b": torch.ones(2)}
    call = _write_dump(tmp_path / "000000_1_add", SAMPLE, "add_and_sub", args, tensors)
    result = replay_call(call, allow_modules=SAMPLE)
    assert result.status == "REFUSED" and reason in result.detail, result

    args[2].update(enum_module=SAMPLE, enum_qualname="Mode", member="EXACT")
    (call / "call.json").write_text(
        json.dumps(json.loads((call / "call.json").read_text()) | {"args": args})
    )
    assert replay_call(call, allow_modules=SAMPLE).status == "RAN"  # a real enum: it runs


def _sample_dump(root: Path) -> Path:
    """One faithful dump of sample_api.scale_ under ``root``; returns its directory."""
    dumper = Dumper(root)
    ApiLogger(10, Destination(str(root.parent / "log")), dumper).decorate(sample_api.scale_)(
        torch.randn(5), 3.0
    )
    (call,) = root.iterdir()
    return call


@pytest.mark.parametrize(
    "allow,status",
    [
        ((), "REFUSED"),
        ((SAMPLE,), "PASS"),
        (("tests",), "PASS"),  # a package allows its submodules
        (SAMPLE, "PASS"),  # a single name as a string
        (("tests.debug.sample",), "REFUSED"),  # a name prefix is not a parent package
    ],
)
def test_allow_modules(allow: Any, status: str, tmp_path: Path) -> None:
    call = _sample_dump(tmp_path / "dumps")
    (result,) = replay(call.parent, allow_modules=allow)
    assert result.status == status, result
    if status == "REFUSED":
        assert "--allow-module" in result.detail


def test_flashinfer_apis_are_marked_and_replayed_without_allow(tmp_path: Path) -> None:
    assert getattr(norm.rmsnorm, API_MARKER) is True
    assert getattr(sample_api.Wrapper.run, API_MARKER) is True
    args = [_tensor("input"), _tensor("weight"), _value("eps", 1e-6)]
    tensors = {"input": torch.ones(1, 2), "weight": torch.ones(2)}
    call = _write_dump(
        tmp_path / "000000_1_rmsnorm", "flashinfer.norm", "rmsnorm", args, tensors, status="raised"
    )
    result = replay_call(call)
    assert result.status == "RAN" and "CUDA" in result.detail, result  # it ran, and refused CPU


def _malformed_dumps(root: Path, good: Path) -> dict[str, str]:
    """Writes broken dumps next to ``good``; returns directory name -> expected reason."""
    expected: dict[str, str] = {}

    def broken(
        name: str,
        reason: str,
        manifest: Any = None,
        text: str | None = None,
        inputs: bytes | None = None,
    ) -> Path:
        directory = root / name
        directory.mkdir()
        if text is None:
            text = json.dumps(manifest)
        (directory / "call.json").write_text(text)
        if inputs is None:
            (directory / "inputs.pt").write_bytes((good / "inputs.pt").read_bytes())
        else:
            (directory / "inputs.pt").write_bytes(inputs)
        expected[name] = reason
        return directory

    manifest = json.loads((good / "call.json").read_text())
    broken("a_bad_json", "call.json is unreadable", text="{not json")
    broken("b_array", "does not hold a JSON object", [])
    broken(
        "c_no_function", "has no 'function'", {k: v for k, v in manifest.items() if k != "function"}
    )
    broken("d_function_str", "'function' is a str", manifest | {"function": "os.system"})
    broken("e_args_dict", "'args' is a dict", manifest | {"args": {}})
    broken("f_arg_no_kind", "has no 'kind'", manifest | {"args": [{"name": "x"}]})
    broken("g_arg_name_int", "'name' is a int", manifest | {"args": [{"name": 3}]})
    broken(
        "h_unknown_function",
        "has no function no_such_api",
        manifest | {"function": {"module": SAMPLE, "qualname": "no_such_api"}},
    )
    broken(
        "i_unknown_module",
        "cannot import flashinfer.no_such_module",
        manifest | {"function": {"module": "flashinfer.no_such_module", "qualname": "f"}},
    )
    broken("j_garbage_inputs", "inputs.pt is unreadable", manifest, inputs=b"garbage")
    broken("k_empty_inputs", "inputs.pt is unreadable", manifest, inputs=b"")
    pickled = root / "pickled.pt"
    torch.save([torch.ones(1)], pickled)
    broken(
        "l_inputs_not_a_dict", "does not hold named tensors", manifest, inputs=pickled.read_bytes()
    )
    broken(
        "m_missing_tensor",
        "has no tensor 'y'",
        manifest | {"args": [manifest["args"][0] | {"key": "y"}]},
    )
    broken("n_tensor_format", "unknown tensor_format", manifest | {"tensor_format": "../x"})
    broken(
        "o_unknown_kind",
        "unknown kind 'pickle'",
        manifest | {"args": [{"name": "x", "kind": "pickle"}]},
    )
    broken(
        "p_bad_device",
        "unknown device 'nowhere'",
        manifest | {"args": [manifest["args"][0] | {"device": "nowhere"}]},
    )
    outputs = broken("q_garbage_outputs", "outputs.pt is unreadable", manifest)
    (outputs / "outputs.pt").write_bytes(b"not a tensor file")
    (root / "r_manifest_is_a_dir" / "call.json").mkdir(parents=True)
    expected["r_manifest_is_a_dir"] = "call.json is unreadable"
    return expected


def test_malformed_dumps_are_one_error_row_each_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "dumps"
    good = _sample_dump(root)
    expected = _malformed_dumps(root, good)
    results = {r.directory.name: r for r in replay(root, allow_modules=SAMPLE)}
    assert results.keys() == expected.keys() | {good.name}
    assert results[good.name].status == "PASS"
    for name, reason in expected.items():
        assert results[name].status == "ERROR", results[name]
        assert reason in results[name].detail, results[name]

    assert cli(["replay", str(root), "--allow-module", SAMPLE]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert f"1 pass, 0 fail, {len(expected)} error" in captured.out
    assert len(captured.out.splitlines()) == len(expected) + 3  # header, rows, summary


@pytest.mark.parametrize(
    "option,value", [("--rtol", "-1"), ("--rtol", "nan"), ("--atol", "inf"), ("--atol", "-0.5")]
)
def test_bad_tolerances_are_rejected_before_anything_runs(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = _sample_dump(tmp_path / "dumps")
    assert cli(["replay", str(call.parent), "--allow-module", SAMPLE, option, value]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{option} must be a finite number >= 0" in captured.err
    with pytest.raises(ValueError, match=f"{option[2:]} must be a finite number >= 0"):
        replay(call.parent, **{option[2:]: float(value)})


def test_replay_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    call = _sample_dump(tmp_path / "dumps")
    root = call.parent
    assert cli(["replay", str(root), "--allow-module", SAMPLE]) == 0  # all pass
    assert cli(["replay", str(root)]) == 1  # refused
    assert cli(["replay", str(root), "--allow-module", "1nvalid"]) == 2
    assert cli(["replay", str(tmp_path / "no_dumps")]) == 2
    outputs = torch.load(call / "outputs.pt", weights_only=True)
    outputs["mutated.x"] += 1
    torch.save(outputs, call / "outputs.pt")
    assert cli(["replay", str(root), "--allow-module", SAMPLE]) == 1  # a mismatch
    assert cli(["replay", str(root), "--allow-module", SAMPLE, "--atol", "2"]) == 0
    err = capsys.readouterr().err
    assert "'1nvalid' is not a module name" in err and "no dumped calls" in err
    with pytest.raises(ValueError, match="allow_modules"):
        replay(root, allow_modules=["a b"])
    with pytest.raises(ValueError, match="rtol"):
        replay(root, rtol=True)  # type: ignore[arg-type]
