"""Level-10 dumps (caps, filters, formats) and replay (CPU)."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flashinfer.__main__ import main as cli
from flashinfer.api_logging import ApiLogger
from flashinfer.dump import Dumper
from flashinfer.logdest import Destination
from flashinfer.replay import replay
from tests.conftest import REPO_ROOT, run_python
from tests.debug import sample_api

SAMPLE = "tests.debug.sample_api"  # replay runs its @flashinfer_api functions only when allowed


def _dumping(tmp_path: Path, **dumper_options) -> tuple[ApiLogger, Path]:
    root = tmp_path / "dumps"
    return ApiLogger(10, Destination(str(tmp_path / "log")), Dumper(root, **dumper_options)), root


@pytest.fixture
def dump_log():
    """Records what the flashinfer.dump logger says during the test."""
    from tests.conftest import LogRecorder

    recorder = LogRecorder()
    logging.getLogger("flashinfer.dump").addHandler(recorder)
    try:
        yield recorder
    finally:
        logging.getLogger("flashinfer.dump").removeHandler(recorder)


def _calls(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def test_inputs_are_dumped_before_the_call_runs(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path)
    seen = {}

    def check(x: torch.Tensor, tag: str) -> torch.Tensor:
        (call,) = _calls(root)
        manifest = json.loads((call / "call.json").read_text())
        seen["status"] = manifest["status"]
        seen["inputs"] = torch.load(call / "inputs.pt", weights_only=True)
        return x * 2

    check.__module__ = "tests.debug.sample_api"
    x = torch.randn(3, 5)
    logger.decorate(check)(x, tag="t")
    assert seen["status"] == "inputs_saved"
    assert torch.equal(seen["inputs"]["x"], x)
    (call,) = _calls(root)
    assert sorted(p.name for p in call.iterdir()) == ["call.json", "inputs.pt", "outputs.pt"]
    manifest = json.loads((call / "call.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["function"]["module"] == "tests.debug.sample_api"
    assert manifest["function"]["qualname"].endswith("<locals>.check")
    assert manifest["args"][0] | {"stride": None} == {
        "name": "x",
        "param_kind": "POSITIONAL_OR_KEYWORD",
        "kind": "tensor",
        "key": "x",
        "shape": [3, 5],
        "dtype": "float32",
        "device": "cpu",
        "stride": None,
    }
    assert manifest["args"][1]["value"] == "t"
    outputs = torch.load(call / "outputs.pt", weights_only=True)
    assert torch.equal(outputs["return"], x * 2)
    assert f"Inputs dumped to: {call}" in (tmp_path / "log").read_text()


def test_in_place_changes_are_saved_as_mutated_outputs(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path)
    x = torch.randn(4)
    before = x.clone()
    logger.decorate(sample_api.scale_)(x, 3.0)
    (call,) = _calls(root)
    inputs = torch.load(call / "inputs.pt", weights_only=True)
    outputs = torch.load(call / "outputs.pt", weights_only=True)
    assert torch.equal(inputs["x"], before)
    assert torch.equal(outputs["mutated.x"], before * 3)
    assert "return" not in outputs


def test_include_and_exclude_patterns(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path, include=("add_*", "scale_"), exclude=("scale*",))
    logger.decorate(sample_api.add_and_sub)(torch.ones(2), torch.ones(2))
    logger.decorate(sample_api.scale_)(torch.ones(2), 2.0)
    logger.decorate(sample_api.concat)([torch.ones(2)])
    assert [p.name.split("_", 2)[2] for p in _calls(root)] == ["add_and_sub"]


def test_max_count_stops_with_one_warning(tmp_path: Path, dump_log) -> None:
    logger, root = _dumping(tmp_path, max_count=2)
    func = logger.decorate(sample_api.scale_)
    for _ in range(5):
        func(torch.ones(2), 2.0)
    assert len(_calls(root)) == 2
    warnings = [m for m in dump_log.messages(logging.WARNING) if "dumps stopped" in m]
    assert warnings == ["flashinfer dumps stopped: FLASHINFER_DUMP_MAX_COUNT=2 calls dumped"]


def test_max_size_stops_dumps_without_breaking_calls(tmp_path: Path, dump_log) -> None:
    """The cap counts the bytes of the files written; a call whose inputs would cross it
    is not dumped, and dumping stops."""
    logger, root = _dumping(tmp_path)
    func = logger.decorate(sample_api.scale_)
    x = torch.ones(100)  # 400 bytes of tensor data, more on disk
    func(x, 1.0)
    written = sum(p.stat().st_size for p in root.rglob("*.pt"))
    assert logger.dumper.bytes == written > 400
    logger.dumper.max_bytes = written + 500  # room for one more call's 400 bytes, not two
    func(x, 1.0)
    func(x, 1.0)
    big = torch.ones(10_000)
    func(big, 2.0)
    assert torch.equal(big, torch.full((10_000,), 2.0))
    assert len(_calls(root)) == 2
    assert any("FLASHINFER_DUMP_MAX_SIZE_GB" in m for m in dump_log.messages(logging.WARNING))


def test_unpicklable_arguments_do_not_break_the_dump(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path)
    obj = sample_api.Wrapper(2)
    assert logger.decorate(sample_api.Wrapper.plan)(obj, 5) == 10
    manifest = json.loads((_calls(root)[0] / "call.json").read_text())
    assert manifest["args"][0]["kind"] == "unsupported"
    assert manifest["args"][1] == {
        "name": "n",
        "param_kind": "POSITIONAL_OR_KEYWORD",
        "kind": "value",
        "value": 5,
    }


def _write_without_the_library(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The layout flashinfer's own writer produced before it used the safetensors library:
    an 8-byte header length, the JSON header padded with spaces to 8 bytes, the raw data."""
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.bool: "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        data = tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {
            "dtype": codes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def test_safetensors_dumps_load_with_the_library_and_replay(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path, safetensors=True)
    a = torch.randn(4, 4).t()  # not contiguous: stored as a contiguous copy
    logger.decorate(sample_api.add_and_sub)(a, torch.randn(4, 4), 0.5, mode=sample_api.Mode.FAST)
    (call,) = _calls(root)
    assert (call / "inputs.safetensors").is_file() and not (call / "inputs.pt").exists()
    inputs = load_file(call / "inputs.safetensors")
    outputs = load_file(call / "outputs.safetensors")
    assert torch.equal(inputs["a"], a) and inputs["a"].is_contiguous()
    assert outputs.keys() == {"return.0", "return.1"}
    manifest = json.loads((call / "call.json").read_text())
    assert manifest["args"][3] | {"param_kind": None} == {
        "name": "mode",
        "param_kind": None,
        "kind": "enum",
        "enum_module": "tests.debug.sample_api",
        "enum_qualname": "Mode",
        "member": "FAST",
    }
    logger.decorate(sample_api.concat)([torch.randn(2), torch.randn(3)])
    results = replay(root, allow_modules=SAMPLE)
    assert [r.status for r in results] == ["PASS", "PASS"]


def test_safetensors_dumps_of_the_former_writer_still_replay(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path, safetensors=True)
    logger.decorate(sample_api.concat)(
        [torch.tensor([1.5, -2.0], dtype=torch.bfloat16), torch.empty(0, dtype=torch.bfloat16)]
    )
    (call,) = _calls(root)
    for name in ("inputs", "outputs"):
        path = call / f"{name}.safetensors"
        tensors = load_file(path)
        _write_without_the_library(tensors, path)
        loaded = load_file(path)
        assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert [r.status for r in replay(root, allow_modules=SAMPLE)] == ["PASS"]


def test_replay_passes_on_a_faithful_dump_and_fails_on_an_altered_output(tmp_path: Path) -> None:
    logger, root = _dumping(tmp_path)
    logger.decorate(sample_api.add_and_sub)(torch.randn(8), torch.randn(8), alpha=2.0)
    logger.decorate(sample_api.scale_)(torch.randn(8), 0.5)
    logger.decorate(sample_api.concat)([torch.randn(2), torch.randn(3)], dim=0)
    results = replay(root, allow_modules=SAMPLE)
    assert [r.status for r in results] == ["PASS", "PASS", "PASS"]
    assert results[0].function == "tests.debug.sample_api.add_and_sub"

    altered = _calls(root)[1] / "outputs.pt"
    outputs = torch.load(altered, weights_only=True)
    outputs["mutated.x"][3] += 1e-3
    torch.save(outputs, altered)
    results = replay(root, allow_modules=SAMPLE)
    assert [r.status for r in results] == ["PASS", "FAIL", "PASS"]
    assert "mutated.x: max abs diff" in results[1].detail
    assert replay(root, atol=1e-2, allow_modules=SAMPLE)[1].status == "PASS"


def test_a_tensor_list_replays_on_the_devices_it_was_dumped_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list or tuple of tensors (a (k_cache, v_cache) pair) records each tensor's device
    and replays each there: a CUDA pair is never run on the CPU (which, beside CUDA tensors,
    would raise); without a GPU, or without the GPU index it ran on, the call is SKIP, and
    so is a dump from before the devices were recorded."""
    logger, root = _dumping(tmp_path)
    logger.decorate(sample_api.concat)((torch.randn(2), torch.randn(3)), dim=0)
    (call,) = _calls(root)
    manifest = json.loads((call / "call.json").read_text())
    (entry,) = [a for a in manifest["args"] if a["kind"] == "tensor_list"]
    assert entry["devices"] == ["cpu", "cpu"] and entry["sequence"] == "tuple"
    assert [r.status for r in replay(root, allow_modules=SAMPLE)] == ["PASS"]

    def rewrite(**changes: object) -> None:
        entry.update(changes)
        (call / "call.json").write_text(json.dumps(manifest))

    rewrite(devices=["cuda:0", "cuda:0"])
    (result,) = replay(root, allow_modules=SAMPLE)
    assert result.status == "SKIP" and "ran on cuda:0, and no GPU is visible" in result.detail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rewrite(devices=["cpu", "cuda:3"])
    (result,) = replay(root, allow_modules=SAMPLE)
    assert result.status == "SKIP" and "ran on cuda:3, and 1 GPU(s) are visible" in result.detail
    rewrite(devices=["cpu"])
    assert replay(root, allow_modules=SAMPLE)[0].status == "ERROR"
    del entry["devices"]
    (call / "call.json").write_text(json.dumps(manifest))
    (result,) = replay(root, allow_modules=SAMPLE)
    assert result.status == "SKIP" and "devices were not recorded" in result.detail


def test_replay_cli_and_a_crashed_call(tmp_path: Path, capsys) -> None:
    logger, root = _dumping(tmp_path)
    logger.decorate(sample_api.scale_)(torch.randn(4), 2.0)
    with pytest.raises(ValueError):
        logger.decorate(sample_api.fail)(torch.randn(2))
    manifest = json.loads((_calls(root)[1] / "call.json").read_text())
    assert manifest["status"] == "raised" and "bad x" in manifest["exception"]

    assert cli(["replay", str(root), "--allow-module", SAMPLE]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "RAN" in out and "raised ValueError" in out
    assert cli(["replay", "--dir", str(root), "--allow-module", "tests"]) == 0
    assert cli(["replay", str(root)]) == 1  # not allowed: both calls refused
    assert capsys.readouterr().out.count("REFUSED") == 2
    assert cli(["replay", str(tmp_path / "nothing")]) == 2


def test_replay_in_a_fresh_process_with_python_m(tmp_path: Path) -> None:
    root = tmp_path / "dumps"
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
from tests.debug import sample_api
sample_api.add_and_sub(torch.randn(3), torch.randn(3))  # decorated at import, at level 10
"""
    run_python(
        code,
        env={
            "FLASHINFER_LOGLEVEL": "10",
            "FLASHINFER_DUMP_DIR": str(root),
            "FLASHINFER_LOGDEST": str(tmp_path / "log"),
        },
    )
    argv = ["flashinfer", "replay", str(root), "--allow-module", SAMPLE]
    proc = run_python(
        f"import runpy, sys\nsys.argv = {argv!r}\n"
        "runpy.run_module('flashinfer', run_name='__main__')",
        cwd=REPO_ROOT,
    )
    assert "PASS" in proc.stdout and "1 pass, 0 fail" in proc.stdout


def test_calls_during_graph_capture_are_not_dumped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dump_log
) -> None:
    from flashinfer import dump

    logger, root = _dumping(tmp_path)
    func = logger.decorate(sample_api.scale_)
    monkeypatch.setattr(dump, "graph_capture_in_progress", lambda: True)
    func(torch.ones(2), 2.0)
    func(torch.ones(2), 2.0)
    assert _calls(root) == []
    assert sum("graph capture" in m for m in dump_log.messages(logging.WARNING)) == 1
    monkeypatch.setattr(dump, "graph_capture_in_progress", lambda: False)
    func(torch.ones(2), 2.0)
    assert len(_calls(root)) == 1
