"""The JIT pipeline with real nvcc and host compiles: build, cache, rebuild rules, errors."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer.jit import JitCompileError, JitDisabledError, gen_jit_spec, render_template
from flashinfer.jit import env as jit_env
from flashinfer.jit.manifest import Manifest
from flashinfer.jit.norm import gen_norm_module
from tests.conftest import REPO_ROOT, run_python
from tests.jit.tiny_module import load_fresh, tiny_spec, write_tiny_sources


def _ninja_vars(build_dir: Path) -> dict[str, list[str]]:
    values = {}
    for line in (build_dir / "build.ninja").read_text().splitlines():
        if " = " in line and not line.startswith(" "):
            key, value = line.split(" = ", 1)
            values[key] = shlex.split(value)
    return values


def test_norm_module_builds_for_sm90a_and_loads_through_tvm_ffi() -> None:
    module = flashinfer.get_norm_module(torch.bfloat16)
    assert module.dtype() == "bfloat16"  # a host-only exported function answers
    assert flashinfer.get_norm_module(torch.bfloat16) is module  # memoized in memory

    spec = gen_norm_module(torch.bfloat16)
    assert spec.name == "norm_dtype_bf16"
    assert spec.library_path.is_file() and spec.library_path.name == "norm_dtype_bf16.so"
    assert spec.build_dir.parent == jit_env.cached_ops_dir() / "norm_dtype_bf16"
    assert not spec.is_stale

    flags = _ninja_vars(spec.build_dir)
    for flag in (
        "-O3",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-gencode=arch=compute_90a,code=sm_90a",
        "--threads=1",
    ):
        assert flag in flags["cuda_cflags"]
    assert "-lcudart" in flags["ldflags"] and "-lcuda" not in flags["ldflags"]
    assert Path(flags["nvcc"][-1]).name == "nvcc"
    text = (spec.build_dir / "build.ninja").read_text()
    assert "compile_cuda " + str(jit_env.FLASHINFER_CSRC_DIR / "norm_kernel.cu") in text
    assert "compile_cxx " + str(jit_env.FLASHINFER_CSRC_DIR / "norm.cc") in text


def test_norm_manifest_tracks_headers_per_translation_unit() -> None:
    spec = gen_norm_module(torch.bfloat16)
    flashinfer.get_norm_module(torch.bfloat16)
    manifest = Manifest.load(spec.build_dir)
    assert manifest is not None
    norm_cuh = str(jit_env.FLASHINFER_INCLUDE_DIR / "flashinfer" / "norm.cuh")
    assert norm_cuh in manifest.inputs
    kernel_obj = next(o for o in manifest.objects if o.startswith("norm_kernel"))
    binding_obj = next(o for o in manifest.objects if o.startswith("norm."))
    assert norm_cuh in manifest.objects[kernel_obj]
    # Editing norm.cuh rebuilds the kernel TU only; the binding TU never sees it.
    assert manifest.objects_depending_on([norm_cuh]) == [kernel_obj]
    # The kernel TU stays free of tvm-ffi headers (that is what keeps it fast to compile).
    assert not any("tvm/ffi" in dep for dep in manifest.objects[kernel_obj])
    assert any(dep.endswith("norm_config.h") for dep in manifest.objects[binding_obj])


def test_every_binding_tu_exports_through_ffi_export() -> None:
    """Binding TUs export with FLASHINFER_EXPORT_FUNC (csrc/ffi_export.h): tvm-ffi's typed
    export inlines each argument's conversion into one function, and the prefill binding's
    host compile took four times as long with it (docs/jit.md)."""
    from flashinfer.jit.registry import specs_for

    bindings = {Path(s) for spec in specs_for() for s in spec.sources if Path(s).suffix != ".cu"}
    assert {b.name for b in bindings} >= {"norm.cc", "prefill.cc", "decode.cc", "sampling.cc"}
    for binding in bindings:
        text = binding.read_text()
        assert "FLASHINFER_EXPORT_FUNC(" in text, binding
        assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC" not in text, binding


def test_binding_checks_raise_python_exceptions_on_the_cpu() -> None:
    module = flashinfer.get_norm_module(torch.bfloat16)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="input must be a CUDA tensor"):
        module.rmsnorm(torch.empty_like(x), x, w, 1e-6, False)
    with pytest.raises(ValueError, match="weight has 7 elements"):
        module.rmsnorm(torch.empty_like(x), x, w[:7], 1e-6, False)
    with pytest.raises(TypeError, match="weight has dtype float32"):
        module.rmsnorm(torch.empty_like(x), x, w.float(), 1e-6, False)
    with pytest.raises(ValueError, match="input must be 2-D"):
        module.rmsnorm(torch.empty_like(x), x[0], w, 1e-6, False)
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        module.rmsnorm(torch.empty(8, 4, dtype=torch.bfloat16).t(), x, w, 1e-6, False)


def test_fresh_process_loads_from_disk_without_any_subprocess() -> None:
    flashinfer.get_norm_module(torch.float16)  # make sure it is built
    code = """
import subprocess, os, sys, torch, flashinfer
def refuse(*a, **k):
    raise AssertionError("warm load spawned a subprocess")
subprocess.Popen = refuse
os.posix_spawn = refuse
os.fork = refuse
m = flashinfer.get_norm_module(torch.float16)
print(m.dtype())
"""
    proc = run_python(code)
    assert proc.stdout.strip() == "float16"
    assert "compiling" not in proc.stderr


@pytest.fixture
def built_tiny(workspace: Path, tmp_path: Path) -> tuple[Path, object]:
    """The tiny module's sources and its spec, built once in a fresh workspace."""
    src = write_tiny_sources(tmp_path / "src")
    spec = tiny_spec(src)
    spec.build_and_load()
    return src, spec


def test_second_call_in_process_does_not_rebuild(workspace: Path, tmp_path: Path, jit_log) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    assert spec.is_stale and not spec.is_compiled
    assert spec.build_and_load().a_value() == 1
    assert len(jit_log.compiles()) == 1
    assert "first build" in jit_log.compiles()[0]
    assert spec.is_compiled and not spec.is_stale
    assert spec.build_and_load().a_value() == 1
    assert len(jit_log.compiles()) == 1


def test_header_edits_rebuild_exactly_the_dependent_objects(
    built_tiny, jit_log, tmp_path: Path
) -> None:
    src, spec = built_tiny
    build_dir = spec.build_dir
    binding_obj = next(build_dir.glob("binding.*.o"))
    kernel_obj = next(build_dir.glob("kernel.*.o"))
    binding_mtime = binding_obj.stat().st_mtime_ns

    # An unrelated header: nothing to do.
    (src / "include" / "tiny" / "b.cuh").write_text("#pragma once\n#define B_VALUE 3\n")
    assert not spec.is_stale
    spec.build_and_load()
    assert jit_log.compiles() == []

    # The included header: the kernel TU rebuilds, the binding TU does not.
    kernel_mtime = kernel_obj.stat().st_mtime_ns
    (src / "include" / "tiny" / "a.cuh").write_text("#pragma once\n#define A_VALUE 42\n")
    assert spec.is_stale
    spec.build()
    assert len(jit_log.compiles()) == 1
    assert "include/tiny/a.cuh changed" in jit_log.compiles()[0]
    assert spec.build_dir == build_dir  # headers are tracked by depfiles, not the hash
    assert kernel_obj.stat().st_mtime_ns != kernel_mtime
    assert binding_obj.stat().st_mtime_ns == binding_mtime
    assert load_fresh(spec.library_path, tmp_path).a_value() == 42


def test_touch_without_content_change_does_not_rebuild(built_tiny, jit_log) -> None:
    src, spec = built_tiny
    header = src / "include" / "tiny" / "a.cuh"
    later = time.time() + 100
    os.utime(header, (later, later))
    assert not spec.is_stale
    spec.build_and_load()
    assert jit_log.compiles() == []


def test_new_content_with_an_older_mtime_still_rebuilds(
    built_tiny, jit_log, tmp_path: Path
) -> None:
    """A reinstall can write new files with old mtimes; ninja alone would miss it."""
    src, spec = built_tiny
    header = src / "include" / "tiny" / "a.cuh"
    old = header.stat().st_mtime - 1000
    header.write_text("#pragma once\n#define A_VALUE 77\n")
    os.utime(header, (old, old))
    spec.build()
    assert len(jit_log.compiles()) == 1
    assert load_fresh(spec.library_path, tmp_path).a_value() == 77


def test_flags_and_archs_change_the_build_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    base = spec.build_dir
    changed = {}
    for var, value in [
        ("FLASHINFER_CUDA_ARCH_LIST", "9.0a 10.0a"),
        ("FLASHINFER_EXTRA_CUDAFLAGS", "-DEXTRA=1"),
        ("FLASHINFER_EXTRA_CFLAGS", "-DEXTRA=1"),
        ("FLASHINFER_EXTRA_LDFLAGS", "-Wl,--as-needed"),
        ("FLASHINFER_JIT_DEBUG", "1"),
        ("FLASHINFER_JIT_LINEINFO", "1"),
        ("FLASHINFER_NVCC_THREADS", "2"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            changed[var] = spec.build_dir
    assert all(d != base and d.parent == base.parent for d in changed.values())
    assert len(set(changed.values())) == len(changed)
    # Output-neutral settings keep the identity.
    for var, value in [
        ("FLASHINFER_JIT_VERBOSE", "1"),
        ("FLASHINFER_NVCC_LAUNCHER", "env"),
        ("MAX_JOBS", "3"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            assert spec.build_dir == base
    # Rendered sources are part of the identity.
    config = render_template(tmp_path / "src" / "binding.cc", "tiny_gen", "gen.h")
    with_gen = tiny_spec(tmp_path / "src", generated_sources=[config])
    assert with_gen.build_dir != base


def test_debug_build_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    monkeypatch.setenv("FLASHINFER_JIT_DEBUG", "1")
    monkeypatch.setenv("FLASHINFER_JIT_LINEINFO", "1")
    plan = spec.plan()
    assert {"-g", "-G", "-O0", "-lineinfo"} <= set(plan.ninja.cuda_cflags)
    assert "-O3" not in plan.ninja.cuda_cflags


def test_compile_error_names_file_line_and_build_dir_and_a_fix_rebuilds(
    workspace: Path, tmp_path: Path
) -> None:
    src = write_tiny_sources(tmp_path / "src")
    header = src / "include" / "tiny" / "a.cuh"
    header.write_text("#pragma once\n#define A_VALUE 1\nthis is not C++;\n")
    spec = tiny_spec(src)
    with pytest.raises(JitCompileError) as info:
        spec.build_and_load()
    message = str(info.value)
    assert message.splitlines()[0].startswith(str(header))
    assert "a.cuh(3)" in message or "a.cuh:3" in message
    assert str(spec.build_dir) in message
    log_path = spec.build_dir / "build.log"
    assert message.rstrip().endswith(f"full log: {log_path}") and log_path.is_file()
    assert not spec.library_path.exists()

    header.write_text("#pragma once\n#define A_VALUE 5\n")
    assert spec.build_and_load().a_value() == 5


def test_verbose_shows_the_compiler_commands(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "1")
    tiny_spec(write_tiny_sources(tmp_path / "src")).build_and_load()
    err = capfd.readouterr().err
    assert "nvcc" in err and "--generate-nonsystem-dependencies-with-compile" in err
    assert "-MMD" in err  # the host compiler's command line


def test_launcher_prefixes_compiler_commands(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "launched"
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(f'#!/bin/sh\necho "$1" >> {marker}\nexec "$@"\n')
    launcher.chmod(0o755)
    monkeypatch.setenv("FLASHINFER_NVCC_LAUNCHER", str(launcher))
    monkeypatch.setenv("FLASHINFER_CXX_LAUNCHER", str(launcher))
    assert tiny_spec(write_tiny_sources(tmp_path / "src")).build_and_load().a_value() == 1
    launched = marker.read_text().split()
    assert any(Path(p).name == "nvcc" for p in launched) and len(launched) == 3  # 2 TUs + link


def test_disable_jit_refuses_to_compile(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tiny_spec(write_tiny_sources(tmp_path / "src"))
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError, match="FLASHINFER_DISABLE_JIT"):
        spec.build_and_load()
    monkeypatch.delenv("FLASHINFER_DISABLE_JIT")
    spec.build_and_load()
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    assert spec.build_and_load().a_value() == 1  # built modules still load


def test_render_writes_only_when_different(workspace: Path, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("constexpr int kValue = {{ value }};\n")
    out = render_template(template, "render_test", "cfg.h", value=1)
    assert out == jit_env.generated_dir("render_test") / "cfg.h"
    assert out.read_text() == "constexpr int kValue = 1;\n"
    before = out.stat().st_mtime_ns
    time.sleep(0.01)
    assert render_template(template, "render_test", "cfg.h", value=1) == out
    assert out.stat().st_mtime_ns == before
    render_template(template, "render_test", "cfg.h", value=2)
    assert out.read_text() == "constexpr int kValue = 2;\n"
    with pytest.raises(Exception, match="undefined"):
        render_template(template, "render_test", "cfg.h")


def test_an_edited_template_renders_again_and_a_touched_one_keeps_the_output(
    workspace: Path, tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("constexpr int kValue = {{ value }};\n")
    out = render_template(template, "render_test", "cfg.h", value=1)
    before = out.stat().st_mtime_ns
    later = time.time() + 10
    os.utime(template, (later, later))  # same bytes, new stat: rendered again, output kept
    assert render_template(template, "render_test", "cfg.h", value=1) == out
    assert out.stat().st_mtime_ns == before
    template.write_text("constexpr int kValue = {{ value }}; // !\n")  # same params
    assert render_template(template, "render_test", "cfg.h", value=1).read_text() == (
        "constexpr int kValue = 1; // !\n"
    )


def test_missing_source_is_a_clear_error_when_planned(tmp_path: Path) -> None:
    spec = gen_jit_spec("m", [tmp_path / "nope.cu"])  # specs are descriptions: no I/O
    with pytest.raises(FileNotFoundError, match="nope.cu of module m"):
        spec.build_and_load()


def test_compile_messages_go_to_stderr_at_info_and_obey_the_level(tmp_path: Path) -> None:
    src = write_tiny_sources(tmp_path / "src")
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from pathlib import Path
from tests.jit.tiny_module import tiny_spec
print(tiny_spec(Path({str(src)!r})).build_and_load().a_value())
"""
    loud = run_python(code, env={"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws1")})
    assert "[flashinfer] compiling tiny_test_module for sm_90a (first build)" in loud.stderr
    assert "[flashinfer] compiled tiny_test_module in" in loud.stderr
    quiet = run_python(
        code,
        env={
            "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws2"),
            "FLASHINFER_LOGGING_LEVEL": "WARNING",
        },
    )
    assert quiet.stdout.strip() == "1" and "compil" not in quiet.stderr


def test_a_new_variant_explains_what_changed(
    built_tiny, jit_log, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, spec = built_tiny
    monkeypatch.setenv("FLASHINFER_EXTRA_CUDAFLAGS", "-DFOO=1")
    assert spec.build_and_load().a_value() == 1
    (message,) = jit_log.compiles()
    assert message == "compiling tiny_test_module for sm_90a (nvcc flags changed (+-DFOO=1))"
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a 10.0a")
    assert "target archs changed (9.0a -> 9.0a 10.0a)" in spec._stale_reason(spec.plan())


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["stops", "is-killed"])
def test_an_exception_during_a_build_stops_ninja_before_it_propagates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ignores_sigterm: bool
) -> None:
    """A test's timeout (a signal handler raising, as pytest-timeout's) or Ctrl-C inside the
    build: ninja is gone when the exception leaves run_ninja, so the caller's lock is never
    released over a running build; one that ignores SIGTERM is killed after the grace."""
    import signal

    from flashinfer.jit import builder

    pid_file = tmp_path / "ninja.pid"
    fake = tmp_path / "ninja"
    trap = "trap '' TERM\n" if ignores_sigterm else ""
    fake.write_text(
        f"#!/bin/sh\n{trap}echo $$ > {pid_file}\necho '[1/2] compiling'\n"
        "while :; do sleep 0.05; done\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(builder, "find_ninja", lambda: fake)
    monkeypatch.setattr(builder, "_STOP_GRACE_S", 0.5)

    def timed_out(signum: int, frame: object) -> None:
        raise TimeoutError("the test's time is up")

    previous = signal.signal(signal.SIGALRM, timed_out)
    outer_timer = signal.setitimer(signal.ITIMER_REAL, 0.5)  # pytest-timeout's, if any
    try:
        with pytest.raises(TimeoutError):
            builder.run_ninja(tmp_path, "fake")
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *outer_timer)
    with pytest.raises(ProcessLookupError):  # exited and reaped, not a zombie
        os.kill(int(pid_file.read_text()), 0)
