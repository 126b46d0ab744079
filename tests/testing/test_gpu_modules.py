"""scripts/gpu_modules.py over a layer that is already there (the one a GPU pass carried):
a library that does not load with every symbol bound is removed, a module that serves this
process is kept, and only the rest is built."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from flashinfer.jit import aot
from flashinfer.jit.arch import parse_arch_list
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.precompile import PrecompileResult, precompile
from tests.conftest import REPO_ROOT
from tests.jit.tiny_module import tiny_spec, write_tiny_sources


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_modules", REPO_ROOT / "scripts" / "gpu_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _library(path: Path, source: str) -> None:
    path.parent.mkdir(parents=True)
    (path.parent / "lib.cc").write_text(source)
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx is not None
    subprocess.run(
        [cxx, "-shared", "-fPIC", "-o", str(path), str(path.parent / "lib.cc")], check=True
    )


def test_it_keeps_what_serves_removes_what_does_not_load_and_builds_the_rest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    out = tmp_path / "aot"
    tiny = tiny_spec(write_tiny_sources(tmp_path / "tiny"))
    precompile(out, script.ARCHS, ops=[], extra=[("tiny", tiny)])
    # Links (undefined symbols are allowed in a shared library) and loads lazily; its
    # first call would end the process.
    _library(out / "lazy" / "lazy.so", "void missing_fn();\nvoid f() { missing_fn(); }\n")
    (out / "garbage").mkdir()
    (out / "garbage" / "garbage.so").write_bytes(b"not a library")
    norm = gen_norm_module("float32")
    monkeypatch.setattr(script, "wanted", lambda: [("tiny", tiny), ("norm", norm)])
    built: list[str] = []
    monkeypatch.setattr(
        script,
        "precompile",
        lambda layer, archs, ops, extra: (
            built.extend(s.name for _, s in extra) or PrecompileResult([], {})
        ),
    )
    assert script.main(out) == 0
    printed = capsys.readouterr().out
    assert "undefined symbol: _Z10missing_fnv" in printed
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["tiny_test_module"]
    assert built == [norm.name]
    assert "1 of 2 modules" in printed and "2 removed" in printed
    target = aot.Target.current(parse_arch_list(script.ARCHS))
    assert aot.layer_library(out, tiny.name, target) is not None


def test_the_pass_wants_every_module_its_tests_load_once() -> None:
    """Registered modules, the prefill tilings, the other-tiling builds and the builds only
    tests load (fp8 caches with ALiBi, fp8 appends, the debug module, the random attention
    cases' GPU runs), no name twice."""
    from flashinfer.jit.registry import specs_for
    from tests.ops import (
        test_cascade_fuzz_emulated,
        test_decode_fuzz_emulated,
        test_prefill_fuzz_emulated,
    )

    names = [spec.name for _, spec in _script().wanted()]
    assert len(names) == len(set(names))
    assert {spec.name for spec in specs_for()} <= set(names)
    for family in (
        test_prefill_fuzz_emulated,
        test_decode_fuzz_emulated,
        test_cascade_fuzz_emulated,
    ):
        assert {spec.name for _, spec in family.gpu_specs()} <= set(names), family.__name__
    assert {
        "decode_f16_hd256_kve4m3_alibi",
        "prefill_bf16_hd64_kve5m2_alibi",
        "page_dtype_e4m3",
        "page_dtype_e5m2",
        "debug_test",
    } <= set(names)
