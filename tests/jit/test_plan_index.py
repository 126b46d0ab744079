"""The plan index: a warm load skips planning, rendering and the manifest, and anything
that could change the library (a setting, a compiler binary, a template, an input, the
library itself) misses it, so the full path decides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashinfer.jit import core, plan_index
from flashinfer.jit.manifest import Manifest
from flashinfer.jit.render import PendingRender
from tests.conftest import REPO_ROOT, run_python
from tests.jit.tiny_module import tiny_spec, write_tiny_sources

TEMPLATE = "#pragma once\n#define GEN_VALUE {{ value }}\n"


@pytest.fixture
def built(workspace: Path, tmp_path: Path):  # noqa: ANN201 - (sources, spec)
    src = write_tiny_sources(tmp_path / "src")
    spec = tiny_spec(src)
    spec.build_and_load()
    return src, spec


def _entry(spec: core.JitSpec) -> Path:
    (entry,) = (Path(spec.build_dir).parents[2] / "plans").glob(f"{spec.name}-*")
    return entry


def _refuse(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError(f"{name} was called")

    monkeypatch.setattr(module, name, refuse)


def test_a_warm_load_plans_renders_and_reads_no_manifest(
    built, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    src, spec = built
    known = plan_index.lookup(tiny_spec(src))
    assert known is not None and known.build_dir == str(spec.build_dir)
    assert known.library_path == str(spec.library_path)
    _refuse(monkeypatch, core, "make_plan")
    _refuse(monkeypatch, PendingRender, "render")
    _refuse(monkeypatch, Manifest, "load")
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


def test_an_edited_input_misses_and_the_load_rebuilds(built, tmp_path: Path, jit_log) -> None:
    src, _ = built
    (src / "include" / "tiny" / "a.cuh").write_text("#pragma once\n#define A_VALUE 7\n")
    assert plan_index.lookup(tiny_spec(src)) is None
    spec = tiny_spec(src)
    spec.build_and_load()
    assert len(jit_log.compiles()) == 1
    assert plan_index.lookup(tiny_spec(src)) is not None


def test_a_template_edit_or_other_parameters_miss_before_anything_is_rendered(
    workspace: Path, tmp_path: Path, jit_log
) -> None:
    src = write_tiny_sources(tmp_path / "src")
    template = tmp_path / "gen.jinja"
    template.write_text(TEMPLATE)

    def spec(value: int) -> core.JitSpec:
        render = PendingRender.of(template, "tiny_gen_module", "gen.h", value=value)
        return tiny_spec(src, name="tiny_gen_module", generated_sources=[render])

    first = spec(1)
    assert first.renders and not first.generated_files()[0].exists()  # nothing rendered yet
    first.build_and_load()
    assert plan_index.lookup(spec(1)) is not None
    assert plan_index.lookup(spec(2)) is None
    template.write_text(TEMPLATE.replace("GEN_VALUE", "GEN_VALUE_RENAMED"))
    assert plan_index.lookup(spec(1)) is None
    spec(1).build_and_load()  # re-rendered: new text, so a rebuild
    assert len(jit_log.compiles()) == 2
    assert "GEN_VALUE_RENAMED" in spec(1).generated_files()[0].read_text()


def test_a_replaced_compiler_misses(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit_log
) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text('#!/bin/sh\nexec nvcc "$@"\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("FLASHINFER_NVCC", str(nvcc))
    src = write_tiny_sources(tmp_path / "src")
    tiny_spec(src).build_and_load()
    assert plan_index.lookup(tiny_spec(src)) is not None
    nvcc.write_text('#!/bin/sh\n# upgraded\nexec nvcc "$@"\n')
    assert plan_index.lookup(tiny_spec(src)) is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "garbage",
        "flashinfer plan index 3\n",
        "flashinfer plan index 3\n/x\nlib.so\nd\n1 2 - \n",
        "flashinfer plan index 3\n/x\nlib.so\nd\nnot numbers here /x\n",
        '{"format": 2, "build_dir": "/x"}',
    ],
)
def test_a_damaged_entry_misses_and_the_load_plans(built, content: str, jit_log) -> None:
    src, spec = built
    entry = _entry(spec)
    entry.write_text(content)
    assert plan_index.lookup(tiny_spec(src)) is None
    assert tiny_spec(src).build_and_load().a_value() == 1
    assert jit_log.compiles() == []
    assert plan_index.lookup(tiny_spec(src)) is not None  # rewritten by the full path


def test_invalid_settings_get_no_entry_and_are_reported(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, spec = built
    _entry(spec).unlink()
    monkeypatch.setenv("MAX_JOBS", "0")
    plan_index.record(spec, spec.plan())
    assert not list((Path(spec.build_dir).parents[2] / "plans").glob(f"{spec.name}-*"))
    with pytest.raises(ValueError, match="MAX_JOBS"):
        tiny_spec(src).build_and_load()


def test_a_damaged_library_misses_and_a_fresh_process_rebuilds(built) -> None:
    src, spec = built
    # A new file at the path: truncating in place would pull pages from under this process,
    # which has the library mapped (SIGBUS at the next touch).
    truncated = spec.library_path.with_name("truncated.tmp")
    truncated.write_bytes(spec.library_path.read_bytes()[:100])
    os.replace(truncated, spec.library_path)
    assert plan_index.lookup(tiny_spec(src)) is None
    proc = run_python(
        f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from pathlib import Path\n"
        "from tests.jit.tiny_module import tiny_spec\n"
        f"print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())\n"
    )
    assert proc.stdout.strip() == "1"
    assert "changed size" in proc.stderr
