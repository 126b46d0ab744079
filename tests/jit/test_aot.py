"""Precompiled (AOT) layers: one ninja run for every registered module, loading without nvcc."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flashinfer.__main__ import main as cli
from flashinfer.jit import aot, registry
from flashinfer.jit import precompile as precompile_module
from flashinfer.jit.manifest import Manifest
from flashinfer.jit.precompile import precompile
from tests.conftest import REPO_ROOT, run_python

NORM_URIS = ["norm_dtype_bf16", "norm_dtype_f16", "norm_dtype_f32"]


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("aot") / "layer"
    assert cli(["precompile", "--arch", "9.0a", "--ops", "norm", "--out", str(out)]) == 0
    return out


def _no_nvcc_env(layer: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "FLASHINFER_DISABLE_JIT": "1",
        "FLASHINFER_AOT_DIR": str(layer),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"),
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        **extra,
    }


def _links_every_module(staging: Path, *args: object, **kwargs: object) -> None:
    """Stands in for ninja in a precompile's staging dir: writes each module's library, as
    a run in which everything built would."""
    for build_file in staging.glob("*/build.ninja"):
        for line in build_file.read_text().splitlines():
            if line.startswith("build ") and ": link " in line:
                (staging / line[len("build ") : line.index(": link ")]).touch()


def test_precompile_publishes_every_specialization(layer: Path) -> None:
    assert sorted(p.name for p in layer.iterdir() if p.is_dir()) == NORM_URIS
    assert not list(layer.glob(".*"))  # no staging left behind
    record = json.loads((layer / "norm_dtype_f16" / "aot.json").read_text())
    assert record["archs"] == ["9.0a"] and record["uri"] == "norm_dtype_f16"
    assert any(p.endswith("include/flashinfer/norm.cuh") for p in record["inputs"])
    assert (layer / "norm_dtype_f16" / "norm_dtype_f16.so").is_file()


def test_a_fresh_process_loads_from_the_layer_without_nvcc(layer: Path, tmp_path: Path) -> None:
    code = """
import shutil, torch, flashinfer
assert shutil.which("nvcc") is None
print(flashinfer.get_norm_module(torch.bfloat16).dtype())
"""
    proc = run_python(code, env=_no_nvcc_env(layer, tmp_path), cwd=tmp_path)
    assert proc.stdout.strip() == "bfloat16" and "compil" not in proc.stderr


def test_a_module_missing_from_the_layer_is_a_clear_error(layer: Path, tmp_path: Path) -> None:
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from pathlib import Path
from flashinfer.jit import JitDisabledError
from tests.jit.tiny_module import tiny_spec, write_tiny_sources
try:
    tiny_spec(write_tiny_sources(Path({str(tmp_path / "src")!r}))).build_and_load()
except JitDisabledError as err:
    print(err)
"""
    proc = run_python(code, env=_no_nvcc_env(layer, tmp_path), cwd=tmp_path)
    assert "tiny_test_module is in no AOT layer" in proc.stdout
    assert "'nvcc' not found on PATH" in proc.stdout


def test_the_layer_is_skipped_when_it_does_not_match(
    layer: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLASHINFER_AOT_DIR", str(layer))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    assert aot.find("norm_dtype_f16") == layer / "norm_dtype_f16" / "norm_dtype_f16.so"
    assert aot.find("no_such_module") is None
    for var, value in [
        ("FLASHINFER_JIT_DEBUG", "1"),
        ("FLASHINFER_EXTRA_CUDAFLAGS", "-DX"),
        ("FLASHINFER_CUDA_ARCH_LIST", "10.0a"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            assert aot.find("norm_dtype_f16") is None, var

    # A recorded source whose content differs here (an edited kernel) falls through too.
    edited = tmp_path / "edited"
    edited.mkdir()
    for item in layer.iterdir():
        if item.is_dir():
            os.symlink(item, edited / item.name)
    record_path = layer / "norm_dtype_f32" / "aot.json"
    record = json.loads(record_path.read_text())
    header = next(p for p in record["inputs"] if p.endswith("norm.cuh"))
    record["inputs"][header] = [1, 1, "0" * 64]
    (edited / "norm_dtype_f32").unlink()
    (edited / "norm_dtype_f32").mkdir()
    (edited / "norm_dtype_f32" / "aot.json").write_text(json.dumps(record))
    os.symlink(
        layer / "norm_dtype_f32" / "norm_dtype_f32.so",
        edited / "norm_dtype_f32" / "norm_dtype_f32.so",
    )
    monkeypatch.setenv("FLASHINFER_AOT_DIR", str(edited))
    assert aot.find("norm_dtype_f32") is None
    assert aot.find("norm_dtype_f16") is not None


def test_an_installed_flashinfer_aot_package_is_a_layer(layer: Path, tmp_path: Path) -> None:
    package = tmp_path / "site" / "flashinfer_aot"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    os.symlink(layer, package / "modules")
    env = _no_nvcc_env(layer, tmp_path, PYTHONPATH=str(tmp_path / "site"))
    env["FLASHINFER_AOT_DIR"] = ""
    proc = run_python(
        "import torch, flashinfer\nprint(flashinfer.get_norm_module(torch.float32).dtype())",
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout.strip() == "float32"


def test_registry_and_precompile_errors(capsys: pytest.CaptureFixture[str]) -> None:
    names = [spec.name for spec in registry.specs_for(["norm"])]
    assert sorted(names) == NORM_URIS
    assert {"norm", "activation"} <= set(registry.registered_ops())
    with pytest.raises(
        ValueError,
        match="unknown op.*nope.*registered: activation, cascade, decode, decode_fp8, "
        "decode_pos_encoding, norm, norm_quant, page, prefill, prefill_fp8, "
        "prefill_pos_encoding, rope, sampling",
    ):
        registry.specs_for(["nope"])
    assert cli(["precompile", "--arch", "9.0a", "--ops", "nope", "--out", "/tmp/x"]) == 1
    assert "unknown op(s) nope" in capsys.readouterr().err


def test_fp8_and_position_encoding_builds_are_ops_of_their_own() -> None:
    """precompile --ops decode_fp8 (prefill_fp8, decode_pos_encoding, prefill_pos_encoding)
    names the builds an fp8 cache (a pos_encoding_mode) asks for, one per dtype and head_dim
    (prefill's fp8 ones also at head_dim 192/128, which takes no RoPE), none of them in the
    plain op's list; the plain prefill op has the 192/128 builds too."""
    plain = {spec.name for op in ("decode", "prefill") for spec in registry.specs_for([op])}
    assert {"prefill_bf16_hd192_vo128", "prefill_f16_hd192_vo128"} <= plain
    for op, suffixes, head_dims in (
        ("decode_fp8", ("_kve4m3", "_kve5m2"), 3),
        ("prefill_fp8", ("_kve4m3", "_kve5m2"), 4),
        ("decode_pos_encoding", ("_rope", "_alibi"), 3),
        ("prefill_pos_encoding", ("_rope", "_alibi"), 3),
    ):
        names = [spec.name for spec in registry.specs_for([op])]
        assert len(set(names)) == len(names) == 2 * head_dims * 2, op
        assert not plain & set(names)
        for suffix in suffixes:
            assert sum(name.endswith(suffix) for name in names) == 2 * head_dims, (op, suffix)


def test_precompile_skips_modules_that_cannot_target_the_archs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """decode needs sm_80+ (cp.async): at 7.5 it is skipped and named, the rest is built;
    with nothing buildable the command fails with one line, never a traceback."""
    built: list[str] = []
    monkeypatch.setattr(precompile_module, "run_ninja", _links_every_module)
    monkeypatch.setattr(
        precompile_module,
        "_publish",
        lambda out, staging, spec, plan: (
            built.append(f"{spec.name}@{' '.join(map(str, plan.archs))}") or out / spec.name
        ),
    )
    result = precompile(tmp_path / "layer", "7.5 9.0a", ["norm", "decode"])
    assert sorted(built) == sorted(
        [f"{u}@7.5 9.0a" for u in NORM_URIS]
        + [f"decode_{d}_hd{h}@9.0a" for d in ("bf16", "f16") for h in (64, 128, 256)]
    )
    assert result.skipped == {}
    built.clear()
    assert (
        cli(
            [
                "precompile",
                "--arch",
                "7.5",
                "--ops",
                "norm,decode",
                "--out",
                str(tmp_path / "layer"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert sorted(built) == [f"{u}@7.5" for u in NORM_URIS]
    assert err.count("skipped decode_") == 6 and "supports SM majors [8, 9, 10, 11, 12]" in err
    assert (
        cli(["precompile", "--arch", "7.5", "--ops", "decode", "--out", str(tmp_path / "layer")])
        == 1
    )
    assert "precompile: no requested module can target 7.5: decode_" in capsys.readouterr().err


def test_precompile_builds_extra_specs_along_with_the_ops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Modules no op registers (every prefill tiling, as scripts/gpu_modules.py builds them)
    are built in the same run and indexed under the op given; one that an op registers
    already (a default tiling) is built once."""
    from flashinfer.jit.prefill import DEFAULT_TILINGS, gen_prefill_module, tiling_specs

    built: list[str] = []
    monkeypatch.setattr(precompile_module, "run_ninja", _links_every_module)
    monkeypatch.setattr(
        precompile_module, "_publish", lambda out, staging, spec, plan: built.append(spec.name)
    )
    indexed: dict[str, str] = {}
    monkeypatch.setattr(precompile_module, "write_index", lambda out, ops: indexed.update(ops))
    tilings = tiling_specs()
    default = gen_prefill_module("bfloat16", 128, DEFAULT_TILINGS[128]).name
    assert default in {spec.name for spec in tilings}
    precompile(
        tmp_path / "layer", "9.0a", ["norm", "prefill"], extra=[("prefill", s) for s in tilings]
    )
    assert len(built) == len(set(built))
    assert set(built) == set(NORM_URIS) | {s.name for s in registry.specs_for(["prefill"])} | {
        s.name for s in tilings
    }
    assert len(tilings) > 30 and default in built
    assert {indexed[s.name] for s in tilings} == {"prefill"}
    assert {indexed[u] for u in NORM_URIS} == {"norm"}


def test_a_module_that_fails_to_build_does_not_stop_the_others(tmp_path: Path) -> None:
    """One ninja run keeps going past a failed module: what built is published and indexed,
    then the compile error is raised; nothing is left in staging."""
    from flashinfer.jit import JitCompileError
    from tests.jit.tiny_module import tiny_spec, write_tiny_sources

    good = tiny_spec(write_tiny_sources(tmp_path / "good"))
    broken_root = write_tiny_sources(tmp_path / "broken")
    (broken_root / "kernel.cu").write_text("int broken( {\n")
    broken = tiny_spec(broken_root, name="tiny_broken_module")
    out = tmp_path / "layer"
    with pytest.raises(JitCompileError, match="kernel.cu"):
        precompile(out, "9.0a", ops=[], extra=[("tiny", broken), ("tiny", good)])
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["tiny_test_module"]
    assert (out / "tiny_test_module" / "tiny_test_module.so").is_file()
    assert (out / "tiny_test_module" / aot.AOT_RECORD).is_file()
    index = json.loads((out / "repository.json").read_text())
    assert "tiny_test_module" in json.dumps(index) and "tiny_broken" not in json.dumps(index)
    assert not list(out.glob(".*"))


def test_an_interrupted_precompile_publishes_what_built_then_stops(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ctrl-C (or gpu_pass.sh's SIGINT at its time limit) while ninja runs: the modules
    linked by then are published and indexed, the interrupt goes on, staging is gone."""

    def interrupted(staging: Path, *args: object, **kwargs: object) -> None:
        _links_every_module(staging)
        (staging / "norm_dtype_f16" / "norm_dtype_f16.so").unlink()  # was still compiling
        raise KeyboardInterrupt

    monkeypatch.setattr(precompile_module, "run_ninja", interrupted)
    monkeypatch.setattr(precompile_module, "record_manifest", lambda *a: Manifest({}, "", {}))
    out = tmp_path / "layer"
    with pytest.raises(KeyboardInterrupt):
        precompile(out, "9.0a", ["norm"])
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "norm_dtype_bf16",
        "norm_dtype_f32",
    ]
    index = json.loads((out / "repository.json").read_text())
    assert "norm_dtype_bf16" in json.dumps(index) and "norm_dtype_f16" not in json.dumps(index)
    assert not list(out.glob(".*"))
