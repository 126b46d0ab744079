"""The plan index: a warm load skips planning, and anything that could change the plan
(a setting, a compiler binary, a rendered source) misses it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashinfer.jit import core, plan_index
from tests.jit.tiny_module import tiny_spec, write_tiny_sources


@pytest.fixture
def built(workspace: Path, tmp_path: Path):  # noqa: ANN201 - (sources, spec)
    src = write_tiny_sources(tmp_path / "src")
    spec = tiny_spec(src)
    spec.build_and_load()
    return src, spec


def _no_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("planned")

    monkeypatch.setattr(core, "make_plan", refuse)


def test_a_warm_load_uses_the_index_without_planning(
    built, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    src, spec = built
    known = plan_index.lookup(tiny_spec(src))
    assert known is not None and known.build_dir == spec.build_dir
    _no_planning(monkeypatch)
    assert tiny_spec(src).build_and_load().a_value() == 1
    assert jit_log.compiles() == []


@pytest.mark.parametrize(
    "name,value",
    [
        ("FLASHINFER_EXTRA_CUDAFLAGS", "-DX=1"),
        ("FLASHINFER_JIT_DEBUG", "1"),
        ("FLASHINFER_CUDA_ARCH_LIST", "8.0 9.0a"),
        ("PATH", os.environ["PATH"] + os.pathsep + "/nowhere"),
    ],
)
def test_a_setting_that_decides_the_plan_misses(
    built, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    src, _ = built
    monkeypatch.setenv(name, value)
    assert plan_index.lookup(tiny_spec(src)) is None


def test_a_changed_rendered_source_misses(built, tmp_path: Path) -> None:
    src, _ = built
    generated = tmp_path / "gen.h"
    generated.write_text("#define G 1\n")
    spec = tiny_spec(src, generated_sources=[generated])
    plan_index.record(spec, spec.plan())
    assert plan_index.lookup(spec) is not None
    generated.write_text("#define G 22\n")
    assert plan_index.lookup(spec) is None


def test_a_replaced_compiler_misses(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text('#!/bin/sh\nexec nvcc "$@"\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("FLASHINFER_NVCC", str(nvcc))
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    plan_index.record(spec, spec.plan())
    assert plan_index.lookup(spec) is not None
    nvcc.write_text('#!/bin/sh\n# upgraded\nexec nvcc "$@"\n')
    assert plan_index.lookup(spec) is None


@pytest.mark.parametrize("content", ["", "{", "[]", '{"build_dir": 3}', '{"binaries": []}'])
def test_a_damaged_entry_misses_and_the_load_plans(built, content: str, jit_log) -> None:
    src, spec = built
    (entry,) = (spec.build_dir.parents[2] / "plans").glob("tiny_test_module-*.json")
    entry.write_text(content)
    assert plan_index.lookup(tiny_spec(src)) is None
    assert tiny_spec(src).build_and_load().a_value() == 1
    assert jit_log.compiles() == []
    assert plan_index.lookup(tiny_spec(src)) is not None  # rewritten by the full plan


def test_an_entry_pointing_at_a_damaged_library_rebuilds(built, jit_log) -> None:
    src, spec = built
    # A new file at the path: truncating in place would pull pages from under this process,
    # which has the library mapped (SIGBUS at the next touch).
    truncated = spec.library_path.with_name("truncated.tmp")
    truncated.write_bytes(spec.library_path.read_bytes()[:100])
    os.replace(truncated, spec.library_path)
    assert plan_index.lookup(tiny_spec(src)) is not None
    # A fresh process (the damaged file is not yet mapped in this one).
    from tests.conftest import REPO_ROOT, run_python

    proc = run_python(
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from pathlib import Path\n"
        "from tests.jit.tiny_module import tiny_spec\n"
        f"print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())\n"
    )
    assert proc.stdout.strip() == "1"
    assert "changed size" in proc.stderr
