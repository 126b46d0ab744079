"""Kernel-launch debug printer on a real JIT module with host-side functions (CPU),
the device printf helpers (nvcc), and the out-of-bounds kernel hunt (GPU)."""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path

import pytest
import torch

from flashinfer import debug_printer
from flashinfer.debug_printer import InstrumentedModule, LaunchPrinter
from flashinfer.jit import env as jit_env
from flashinfer.jit.toolchain import current_toolchain
from flashinfer.logdest import Destination
from tests.conftest import REPO_ROOT, LogRecorder, run_python
from tests.debug.debug_module import debug_spec


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Loads the test module with the given printer settings; returns (module, log path)."""

    def loader(level: int, **env: str):
        log = tmp_path / "printer.log"
        monkeypatch.setenv("FLASHINFER_DEBUG_PRINTER", str(level))
        monkeypatch.setenv("FLASHINFER_LOGDEST", str(log))
        monkeypatch.setenv("FLASHINFER_DEBUG_PRINTER_DIR", str(tmp_path / "saved"))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return debug_spec().build_and_load(), log

    return loader


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(2, 3), torch.arange(6.0).reshape(2, 3)


def test_level_0_returns_the_module_itself(load) -> None:
    module, log = load(0)
    assert not isinstance(module, InstrumentedModule)
    printer = LaunchPrinter(0)
    assert printer.instrument(module, "m") is module
    out, x = _inputs()
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2) and not log.exists()


def test_invalid_level_names_the_valid_ones(load) -> None:
    with pytest.raises(
        ValueError,
        match=r"FLASHINFER_DEBUG_PRINTER.*0 \(off\), 1 \(save\), "
        r"2 \(print\), 3 \(kernel names only\)",
    ):
        load(4)


def test_level_2_prints_every_argument_before_and_after(load) -> None:
    module, log = load(2)
    out, x = _inputs()
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)
    lines = log.read_text().splitlines()
    assert lines[0] == (
        "[ before_launch: debug_test.scale ] out: numel=6, shape=(2, 3), "
        "dtype=float32, device=cpu, mean=0, min=0, max=0, std=0, "
        "nan_count=0, inf_count=0"
    )
    assert lines[1] == "    values: [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]"
    assert lines[2].startswith("[ before_launch: debug_test.scale ] x: numel=6")
    assert "mean=2.5, min=0, max=5, std=1.87083" in lines[2]
    assert lines[4] == "[ before_launch: debug_test.scale ] factor: 2.0"
    assert lines[5].startswith("[ after_launch: debug_test.scale ] out: numel=6")
    assert "mean=5, min=0, max=10" in lines[5]
    assert lines[6] == "    values: [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]"
    module.poison(out)
    assert "[ after_launch: debug_test.poison ] out: numel=6" in log.read_text()
    assert "nan_count=6" in log.read_text()


def test_level_2_omits_values_of_large_tensors(load) -> None:
    module, log = load(2)
    out, x = torch.zeros(65), torch.ones(65)
    module.scale(out, x, 1.0)
    assert "values:" not in log.read_text() and "numel=65" in log.read_text()


def test_level_1_saves_tensors_before_and_after(load, tmp_path: Path) -> None:
    module, _ = load(1)
    out, x = _inputs()
    recorder = LogRecorder()
    logging.getLogger("flashinfer").addHandler(recorder)  # the printer's logger is under it
    try:
        module.scale(out, x, 3.0)
    finally:
        logging.getLogger("flashinfer").removeHandler(recorder)
    saved = tmp_path / "saved"
    names = sorted(p.name for p in saved.iterdir())
    assert names == [
        "after_launch_debug_test.scale_out_cpu.pt",
        "after_launch_debug_test.scale_x_cpu.pt",
        "before_launch_debug_test.scale_out_cpu.pt",
        "before_launch_debug_test.scale_x_cpu.pt",
    ]
    assert recorder.messages(logging.INFO) == [
        f"Saved intermediate tensor {arg} for debug_test.scale to {saved / name}"
        for arg, name in (
            ("out", "before_launch_debug_test.scale_out_cpu.pt"),
            ("x", "before_launch_debug_test.scale_x_cpu.pt"),
            ("out", "after_launch_debug_test.scale_out_cpu.pt"),
            ("x", "after_launch_debug_test.scale_x_cpu.pt"),
        )
    ]
    assert all(r.name == "flashinfer.debug_printer" for r in recorder.records)

    def read(name: str) -> torch.Tensor:
        return torch.load(saved / name, weights_only=True)

    assert torch.equal(read("before_launch_debug_test.scale_out_cpu.pt"), torch.zeros(2, 3))
    assert torch.equal(read("after_launch_debug_test.scale_out_cpu.pt"), x * 3)
    assert torch.equal(read("before_launch_debug_test.scale_x_cpu.pt"), x)


def test_a_statistics_error_is_printed_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Level 2 describes a tensor whose statistics fail (a dtype torch cannot reduce) with
    the error in place of the statistics; the launch goes on."""

    def refuse(*args: object, **kwargs: object) -> dict[str, object]:
        raise NotImplementedError("\"aminmax_cuda\" not implemented for 'UInt64'")

    monkeypatch.setattr(debug_printer, "tensor_stats", refuse)
    lines = debug_printer._describe_tensor_line(torch.zeros(3, dtype=torch.uint64), False)
    assert lines[0].startswith("numel=3, shape=(3,), dtype=")
    assert lines[1] == (
        "    [statistics error: NotImplementedError: \"aminmax_cuda\" not implemented for 'UInt64']"
    )


def test_saved_file_names_carry_the_device_as_torch_prints_it() -> None:
    """As the AOTI printer's manual shows: ``before_launch_<kernel>_<arg>_cuda:0.pt``;
    the kernel and argument parts go through the one file-name sanitizer of the tools."""
    assert (
        debug_printer.save_name(
            "before_launch", "norm_dtype_bf16.rmsnorm", "out", torch.device("cuda", 0)
        )
        == "before_launch_norm_dtype_bf16.rmsnorm_out_cuda:0.pt"
    )
    assert (
        debug_printer.save_name("after_launch", "m/x y", "a[0]", torch.device("cpu"))
        == "after_launch_m_x_y_a_0__cpu.pt"
    )


def test_level_3_prints_syncs_then_prints(load, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    module, log = load(3)

    def fake_sync(args) -> None:  # noqa: ANN001
        events.append(f"sync after out={args[0].tolist()[0][1]}")

    monkeypatch.setattr(debug_printer, "synchronize", fake_sync)
    real_write = Destination.write

    def write(self, text: str) -> None:  # noqa: ANN001
        events.append(text)
        real_write(self, text)

    monkeypatch.setattr(Destination, "write", write)
    out, x = _inputs()
    module.scale(out, x, 2.0)
    assert events == [
        "[ before_launch: debug_test.scale ]",
        "sync after out=2.0",
        "[ after_launch: debug_test.scale ]",
    ]
    assert log.read_text().splitlines() == [events[0], events[2]]


def test_kernel_filter_full_or_bare_name_case_insensitive(load) -> None:
    module, log = load(3, FLASHINFER_DEBUG_PRINTER_KERNELS="POISON, Debug_Test.Fill")
    out, x = _inputs()
    module.scale(out, x, 2.0)
    module.poison(out)
    assert log.read_text().splitlines() == [
        "[ before_launch: debug_test.poison ]",
        "[ after_launch: debug_test.poison ]",
    ]
    printer = LaunchPrinter(3, ["debug_test.scale"])
    assert printer.selects("debug_test.scale") and not printer.selects("other.scale")
    assert LaunchPrinter(3, ["scale"]).selects("other.scale")


def test_unknown_argument_names_are_numbered(tmp_path: Path) -> None:
    log = tmp_path / "log"
    printer = LaunchPrinter(2, dest=Destination(str(log)))
    wrapped = printer.wrap("m.f", lambda a, b: None, names=("first",))
    wrapped(torch.ones(1), 7)
    text = log.read_text()
    assert "[ before_launch: m.f ] first: numel=1" in text
    assert "[ before_launch: m.f ] arg1: 7" in text


@pytest.mark.parametrize("level", [1, 2, 3])
def test_graph_capture_skips_syncs_statistics_and_saves(
    level: int, load, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module, log = load(level)
    monkeypatch.setattr(debug_printer, "graph_capture_in_progress", lambda: True)

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("synchronized or computed statistics during capture")

    monkeypatch.setattr(debug_printer, "synchronize", refuse)
    monkeypatch.setattr(debug_printer, "tensor_stats", refuse)
    out, x = _inputs()
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)
    assert "CUDA graph capture in progress" in log.read_text()
    assert not (tmp_path / "saved").exists()


def test_norm_module_names_its_arguments(
    load, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flashinfer.jit.norm import gen_norm_module

    monkeypatch.setenv("FLASHINFER_DEBUG_PRINTER", "2")
    monkeypatch.setenv("FLASHINFER_LOGDEST", str(tmp_path / "log"))
    module = gen_norm_module(torch.float16).build_and_load()
    x = torch.ones(2, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        module.rmsnorm(torch.empty_like(x), x, torch.ones(4, dtype=torch.float16), 1e-6, False)
    text = (tmp_path / "log").read_text()
    for name in ("out", "input", "weight"):
        assert f"[ before_launch: norm_dtype_f16.rmsnorm ] {name}: numel=" in text
    assert "[ before_launch: norm_dtype_f16.rmsnorm ] eps: 1e-06" in text
    assert "after_launch" not in text  # the call raised


# -- device printf helpers -----------------------------------------------------------------


def test_device_print_changes_the_hash_and_builds_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = debug_spec()
    plain = spec.build_dir
    monkeypatch.setenv("FLASHINFER_JIT_DEVICE_PRINT", "1")
    assert spec.build_dir != plain
    assert "-DFLASHINFER_DEVICE_PRINT=1" in spec.plan().ninja.cuda_cflags
    module = spec.build_and_load()
    out, x = _inputs()
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)
    assert spec.library_path.is_file()


@pytest.mark.parametrize("enabled", [False, True])
def test_printf_helpers_compile_to_nothing_unless_enabled(enabled: bool, tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text(
        '#include "flashinfer/debug.cuh"\n'
        "__global__ void k(int v) {\n"
        '  FLASHINFER_PRINTF_ONCE("once %d\\n", v);\n'
        '  FLASHINFER_PRINTF_BLOCK("block %d\\n", v);\n'
        '  FLASHINFER_PRINTF_WARP("warp %d\\n", v);\n'
        '  FLASHINFER_PRINTF_GROUP(64, "group %d\\n", v);\n'
        "}\n"
    )
    ptx = tmp_path / "k.ptx"
    cmd = [
        str(current_toolchain().nvcc),
        "-std=c++17",
        "-arch=sm_90a",
        "-ptx",
        f"-I{jit_env.FLASHINFER_INCLUDE_DIR}",
        str(source),
        "-o",
        str(ptx),
    ]
    if enabled:
        cmd.insert(1, "-DFLASHINFER_DEVICE_PRINT=1")
    subprocess.run(cmd, check=True, capture_output=True)
    calls = len(re.findall(r"call\.uni[^\n]*\n?[^\n]*vprintf", ptx.read_text()))
    if enabled:
        assert calls == 4
    else:
        assert "vprintf" not in ptx.read_text()


# -- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_level_3_names_the_kernel_that_writes_out_of_bounds(tmp_path: Path) -> None:
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
from tests.debug.debug_module import debug_spec
module = debug_spec().build_and_load()
x = torch.zeros(1024, device="cuda")
module.fill(x, 1.0)
module.write_out_of_bounds(x)
module.fill(x, 2.0)
torch.cuda.synchronize()
print("survived")
"""
    proc = run_python(code, env={"FLASHINFER_DEBUG_PRINTER": "3"}, check=False, timeout=600)
    assert proc.returncode != 0 and "survived" not in proc.stdout
    launches = [ln for ln in proc.stdout.splitlines() if ln.startswith("[ ")]
    assert launches == [
        "[ before_launch: debug_test.fill ]",
        "[ after_launch: debug_test.fill ]",
        "[ before_launch: debug_test.write_out_of_bounds ]",
    ]
    assert "illegal" in proc.stderr.lower()


@pytest.mark.gpu
def test_device_printf_prints_from_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
from tests.debug.debug_module import debug_spec
x = torch.zeros(100, device="cuda")
debug_spec().build_and_load().fill(x, 3.0)
torch.cuda.synchronize()
assert bool((x == 3.0).all())
"""
    proc = run_python(code, env={"FLASHINFER_JIT_DEVICE_PRINT": "1"}, timeout=600)
    assert proc.stdout.count("fill: n=100 value=3.000000") == 1
    assert proc.stdout.count("fill: warp starting at") == 8  # one block of 256 threads: 8 warps


@pytest.mark.gpu
def test_level_1_names_cuda_saves_as_the_aoti_printer_does(load, tmp_path: Path) -> None:
    module, _ = load(1)
    x = torch.zeros(100, device="cuda")
    module.fill(x, 3.0)
    torch.cuda.synchronize()
    device = str(x.device)
    assert re.fullmatch(r"cuda:\d+", device)
    saved = tmp_path / "saved"
    names = [
        f"{phase}_debug_test.fill_x_{device}.pt" for phase in ("after_launch", "before_launch")
    ]
    assert sorted(p.name for p in saved.iterdir()) == names
    after = torch.load(saved / names[0], weights_only=True)
    assert after.device.type == "cpu" and torch.equal(after, torch.full((100,), 3.0))
    before = torch.load(saved / names[1], weights_only=True)
    assert torch.equal(before, torch.zeros(100))
