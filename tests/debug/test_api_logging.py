"""@flashinfer_api: the log format of the reference's crash-debugging tutorial
(debug-cuda-crash.md) and logging.rst, line by line, at every level (CPU, fake CUDA tensors)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashinfer
from flashinfer import api_logging, tensor_format
from flashinfer.api_logging import ApiLogger
from flashinfer.config import config
from flashinfer.logdest import Destination
from tests.conftest import REPO_ROOT, run_python
from tests.debug import sample_api

STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]"
RULE, THIN = "=" * 80, "-" * 80

# The tutorial's samples (debug-cuda-crash.md, reference docs), verbatim but for the stamps.
TUTORIAL_HEADER = """\
================================================================================
[2025-12-18 10:30:45] FlashInfer API Logging - System Information
================================================================================
FlashInfer version: 0.6.0
CUDA toolkit version: 12.1
GPU 0: NVIDIA H100 PCIe
  Compute capability: 9.0 (SM90)
PyTorch version: 2.1.0
================================================================================
"""
TUTORIAL_LEVEL_3 = """\
================================================================================
[2025-12-18 10:30:46] FlashInfer API Call: batch_decode_with_padded_kv_cache
--------------------------------------------------------------------------------
Positional input arguments:
  arg[0]:
    Tensor(
      shape=(32, 8, 128)
      dtype=torch.bfloat16
      device=cuda:0
      requires_grad=False
      is_contiguous=True
    )
Keyword input arguments:
  kv_cache=
    Tensor(
      shape=(1024, 2, 8, 128)
      dtype=torch.bfloat16
      device=cuda:0
      requires_grad=False
      is_contiguous=True
    )
"""
TUTORIAL_LEVEL_5_BLOCK = """\
  Tensor(
    shape=(32, 8, 128)
    dtype=torch.bfloat16
    device=cuda:0
    requires_grad=False
    is_contiguous=True
    min=-3.125000
    max=4.250000
    mean=0.015625
    nan_count=0
    inf_count=0
  )
"""


def _unstamped(text: str) -> list[str]:
    """Lines with every ``[YYYY-MM-DD HH:MM:SS]`` replaced by ``[ts]``."""
    return [re.sub(STAMP, "[ts]", line) for line in text.splitlines()]


def _logger(level: int, path: Path) -> ApiLogger:
    return ApiLogger(level, Destination(str(path)))


def _split(path: Path) -> tuple[list[str], list[str]]:
    """(the system-information block, the lines after it); the block is checked here."""
    lines = _unstamped(path.read_text())
    end = lines.index(RULE, 3) + 2  # the closing rule and the blank line after it
    header, body = lines[:end], lines[end:]
    assert header[:3] == [RULE, "[ts] FlashInfer API Logging - System Information", RULE]
    assert header[-2:] == [RULE, ""]
    return header, body


def _body(path: Path) -> list[str]:
    return _split(path)[1]


def _calls(path: Path) -> list[list[str]]:
    """The body cut into calls: each from its opening rule to its closing rule (levels 3+)."""
    body, calls = _body(path), []
    while body:
        assert body[0] == RULE and body[2] == THIN, body[:3]
        end = body.index(RULE, 1)
        calls.append(body[: end + 1])
        assert body[end + 1] == "", "a blank line after each call"
        body = body[end + 2 :]
    return calls


def _doc_tensor(*shape: int) -> torch.Tensor:
    """bf16 values whose statistics are the tutorial's: min -3.125, max 4.25, mean 1/64."""
    x = torch.zeros(*shape, dtype=torch.bfloat16)
    flat = x.view(-1)
    flat[0], flat[1], flat[2] = -3.125, 4.25, 0.875
    flat[3:513] = 1.0  # sum 512 over 32768 elements
    return x


# -- levels --------------------------------------------------------------------------------


def test_level_0_returns_the_function_itself(tmp_path: Path) -> None:
    assert _logger(0, tmp_path / "log").decorate(sample_api.scale_) is sample_api.scale_
    if api_logging._API_LOGGER is not None and api_logging._API_LOGGER.level == 0:
        assert not hasattr(flashinfer.rmsnorm, "__wrapped__")  # the real APIs: no wrapper
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize(
    "raw,level",
    [("", 0), ("0", 0), ("1", 1), ("2", 2), ("3", 3), ("4", 4), ("5", 5), ("10", 10), (" 3 ", 3)],
)
def test_levels_0_to_5_and_10_are_accepted(
    raw: str, level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", raw)
    assert config.api_log_level == level


@pytest.mark.parametrize("raw", ["6", "7", "9", "11", "-1", "3.0", "debug"])
def test_other_levels_are_refused_naming_the_valid_ones(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", raw)
    with pytest.raises(
        ValueError,
        match=f"invalid value '{re.escape(raw)}' for "
        r"FLASHINFER_LOGLEVEL: expected one of 0 \(off\), "
        r"1 \(names\), 2 \(as 1\), 3 .*, 4 \(as 3\), 5 .*, 10",
    ):
        config.api_log_level  # noqa: B018


@pytest.mark.parametrize("level,same_as", [(2, 1), (4, 3)])
def test_level_2_logs_as_1_and_4_as_3(level: int, same_as: int, tmp_path: Path) -> None:
    logs = {}
    for lv in (level, same_as):
        log = tmp_path / f"log{lv}"
        func = _logger(lv, log).decorate(sample_api.add_and_sub)
        func(torch.ones(2), torch.ones(2), 2.0)
        logs[lv] = [re.sub(r"Host time: .*", "Host time", ln) for ln in _body(log)]
    assert logs[level] == logs[same_as]
    assert _logger(level, tmp_path / "x").effective_level == same_as


# -- the system-information block ----------------------------------------------------------


def test_system_information_block_is_the_tutorials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the tutorial's machine faked in, the block is its sample line for line."""
    monkeypatch.setattr(api_logging, "__version__", "0.6.0")
    monkeypatch.setattr(api_logging, "_cuda_toolkit_version", lambda: "12.1")
    monkeypatch.setattr(torch, "__version__", "2.1.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 PCIe")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(tensor_format, "graph_capture_in_progress", lambda: False)
    log = tmp_path / "log"
    _logger(1, log).decorate(sample_api.no_arguments)()
    header, body = _split(log)
    assert header == _unstamped(TUTORIAL_HEADER) + [""]
    assert body == ["[ts] FlashInfer API Call: no_arguments"]


def test_system_information_without_a_gpu_and_once_per_process(tmp_path: Path) -> None:
    log = tmp_path / "log"
    logger = _logger(3, log)
    logger.decorate(sample_api.no_arguments)()
    logger.decorate(sample_api.concat)([torch.ones(1)])
    header, _ = _split(log)
    assert header[3] == f"FlashInfer version: {flashinfer.__version__}"
    assert re.fullmatch(r"CUDA toolkit version: (\d+\.\d+|<unavailable>)", header[4])
    if torch.cuda.is_available():
        assert header[5].startswith("GPU 0: ")
        assert re.fullmatch(r"  Compute capability: \d+\.\d+ \(SM\d+\)", header[6])
    else:
        assert header[5] == "CUDA: Not available (CPU-only mode)"
    assert header[-3] == f"PyTorch version: {torch.__version__}"
    assert log.read_text().count("System Information") == 1
    assert len(_calls(log)) == 2


# -- per call: the tutorial's samples --------------------------------------------------------


def test_level_1_is_the_tutorials_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(1, log).decorate(sample_api.batch_decode_with_padded_kv_cache)
    q, kv = torch.ones(2), torch.ones(3)
    assert func(q, kv_cache=kv) is q
    func(q, kv)
    assert _body(log) == ["[ts] FlashInfer API Call: batch_decode_with_padded_kv_cache"] * 2
    assert re.fullmatch(
        f"{STAMP} FlashInfer API Call: batch_decode_with_padded_kv_cache",
        log.read_text().splitlines()[-1],
    )


def test_level_3_is_the_tutorials_sample_then_the_output(tmp_path: Path) -> None:
    """Fake CUDA tensors (no GPU needed): the inputs are the sample, line for line."""
    with FakeTensorMode():
        q = torch.empty(32, 8, 128, dtype=torch.bfloat16, device="cuda")
        kv = torch.empty(1024, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    log = tmp_path / "log"
    _logger(3, log).decorate(sample_api.batch_decode_with_padded_kv_cache)(q, kv_cache=kv)
    (call,) = _calls(log)
    inputs = _unstamped(TUTORIAL_LEVEL_3)
    assert call[: len(inputs)] == inputs
    assert call[len(inputs) : -2] == [
        "Output value:",
        "  Tensor(",
        "    shape=(32, 8, 128)",
        "    dtype=torch.bfloat16",
        "    device=cuda:0",
        "    requires_grad=False",
        "    is_contiguous=True",
        "  )",
    ]
    assert re.fullmatch(r"Host time: \d+\.\d{3} ms", call[-2]) and call[-1] == RULE


def test_level_5_block_is_the_tutorials_sample(tmp_path: Path) -> None:
    """CPU tensors: the sample's block but for its device line."""
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.batch_decode_with_padded_kv_cache)
    func(_doc_tensor(32, 8, 128), _doc_tensor(4, 4))
    (call,) = _calls(log)
    expected = TUTORIAL_LEVEL_5_BLOCK.replace("device=cuda:0", "device=cpu").splitlines()
    start = call.index("Output value:") + 1
    assert call[start : start + len(expected)] == expected
    assert call[3:5] == ["Positional input arguments:", "  arg[0]:"]
    assert call[5 : 5 + len(expected)] == ["  " + line for line in expected]  # one level further in


def test_level_5_nan_and_inf_show_as_the_tutorial_teaches(tmp_path: Path) -> None:
    """Over all elements: one NaN makes min, max and mean nan; nan_count counts them."""
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.scale_)
    x = torch.full((64, 32), 2.0)
    x.view(-1)[:128] = float("nan")
    func(x, 1.0)
    y = torch.tensor([1.0, float("inf"), -3.0, float("-inf"), 4.0])
    func(y, 1.0)
    first, second = _calls(log)
    assert first[11:16] == [
        "      min=nan",
        "      max=nan",
        "      mean=nan",
        "      nan_count=128",
        "      inf_count=0",
    ]
    assert second[11:16] == [
        "      min=-inf",
        "      max=inf",
        "      mean=nan",
        "      nan_count=0",
        "      inf_count=2",
    ]


def test_level_5_statistics_match_torch_to_six_decimals(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.scale_)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = (torch.randn(300, 7) * 5).to(dtype)
        func(x, 1.0)
        (call,) = _calls(log)[-1:]
        f = x.double() if dtype == torch.float64 else x.float()
        assert call[11:16] == [
            f"      min={f.min().item():.6f}",
            f"      max={f.max().item():.6f}",
            f"      mean={f.mean().item():.6f}",
            "      nan_count=0",
            "      inf_count=0",
        ], dtype


def test_level_5_integer_bool_and_empty_tensors(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.concat)
    func([torch.tensor([1, 5, 9]), torch.tensor([], dtype=torch.int64)])
    func([torch.tensor([True, False, True])])
    first, second = _calls(log)
    assert first[3:24] == [
        "Positional input arguments:",
        "  arg[0]:",
        "    [",
        "      [0]:",
        "        Tensor(",
        "          shape=(3,)",
        "          dtype=torch.int64",
        "          device=cpu",
        "          requires_grad=False",
        "          is_contiguous=True",
        "          min=1",
        "          max=9",
        "          mean=5.000000",
        "        )",
        "      [1]:",
        "        Tensor(",
        "          shape=(0,)",
        "          dtype=torch.int64",
        "          device=cpu",
        "          requires_grad=False",
        "          is_contiguous=True",
    ]
    assert first[24:26] == ["        )", "    ]"]  # empty: no statistics
    assert "          true_count=2" in second and "          false_count=1" in second
    assert not any("nan_count" in line for line in first + second)


def test_level_5_skips_statistics_during_graph_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tensor_format, "graph_capture_in_progress", lambda: True)

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("statistics computed during capture")

    monkeypatch.setattr(tensor_format, "tensor_stats", refuse)
    log = tmp_path / "log"
    _logger(5, log).decorate(sample_api.scale_)(torch.ones(2), 2.0)
    (call,) = _calls(log)
    assert call[5:13] == [
        "    Tensor(",
        "      shape=(2,)",
        "      dtype=torch.float32",
        "      device=cpu",
        "      requires_grad=False",
        "      is_contiguous=True",
        "      [statistics skipped: CUDA graph capture in progress]",
        "    )",
    ]


def test_level_5_statistics_that_cannot_be_computed_say_why(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _logger(5, log).decorate(sample_api.scale_)(torch.empty(2, device="meta"), 1.0)
    (call,) = _calls(log)
    assert call[8] == "      device=meta"
    assert call[11].startswith("      [statistics error: ")


# -- per call: which arguments are inputs ----------------------------------------------------


def test_positional_keyword_and_default_arguments(tmp_path: Path) -> None:
    """What the caller passed by position is arg[i], by name name=; defaults it did not
    pass are not inputs: they follow in their own section, marked [DEFAULT]."""
    log = tmp_path / "log"
    func = _logger(3, log).decorate(sample_api.add_and_sub)
    a, b = torch.ones(2), torch.ones(2)
    func(a, b)
    func(a, b, 1.0, mode=sample_api.Mode.FAST)  # the defaults' values, passed: inputs
    func(b=b, a=a, mode=sample_api.Mode.EXACT)
    defaults, explicit, by_name = _calls(log)

    def labels(call: list[str]) -> list[str]:
        return [ln for ln in call if not ln.startswith("    ") and ln not in (RULE, THIN)][1:]

    assert labels(defaults) == [
        "Positional input arguments:",
        "  arg[0]:",
        "  arg[1]:",
        "Default parameters (not explicitly provided):",
        "  alpha= [DEFAULT]",
        "  mode= [DEFAULT]",
        "Output value:",
        "  (",
        "  )",
        defaults[-2],
    ]
    assert defaults[defaults.index("  alpha= [DEFAULT]") + 1] == "    1.0"
    assert defaults[defaults.index("  mode= [DEFAULT]") + 1] == "    Mode.FAST (value=1)"
    assert labels(explicit)[:6] == [
        "Positional input arguments:",
        "  arg[0]:",
        "  arg[1]:",
        "  arg[2]:",
        "Keyword input arguments:",
        "  mode=",
    ]
    assert "Default parameters (not explicitly provided):" not in explicit
    assert labels(by_name)[:5] == [
        "Keyword input arguments:",
        "  b=",
        "  a=",
        "  mode=",
        "Default parameters (not explicitly provided):",
    ]
    assert "Positional input arguments:" not in by_name
    assert by_name[by_name.index("  mode=") + 1] == "    Mode.EXACT (value=2)"


def test_a_call_without_arguments(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert _logger(3, log).decorate(sample_api.no_arguments)() == 7
    (call,) = _calls(log)
    assert call[3:6] == ["(No explicit arguments)", "Output value:", "  7"]


def test_outputs_come_after_the_call(tmp_path: Path) -> None:
    """Inputs are on disk while the call runs; the output value and host time after it."""
    log = tmp_path / "log"
    seen = {}

    def peek(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        seen["log"] = log.read_text()
        return x, 3

    _logger(3, log).decorate(peek)(torch.zeros(2, 2)[:, :1])
    assert seen["log"].rstrip("\n").endswith("    )") and "Output value:" not in seen["log"]
    (call,) = _calls(log)
    out = call[call.index("Output value:") :]
    assert out[:2] == ["Output value:", "  ("] and out[2] == "    [0]:"
    assert "        stride=(2, 1)" in out and "    [1]:" in out and "      3" in out
    assert out[-3] == "  )" and out[-1] == RULE


def test_exceptions_are_logged_and_reraised_unchanged(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(3, log).decorate(sample_api.fail)
    with pytest.raises(ValueError, match=r"bad x of shape \(2,\)"):
        func(torch.ones(2))
    (call,) = _calls(log)
    assert call[-3] == "Call raised ValueError: bad x of shape (2,)"
    assert call[-2].startswith("Host time: ") and "Output value:" not in call


def test_odd_values_are_readable_and_never_raise(tmp_path: Path) -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    def takes_anything(*values, **options):  # noqa: ANN002, ANN003, ANN202
        return None

    log = tmp_path / "log"
    func = _logger(3, log).decorate(takes_anything)
    func(
        None,
        "text",
        list(range(20)),
        {"k": 1},
        torch.float16,
        Unprintable(),
        1e-6,
        nested=[(1, 2), [3]],
        tensors={"t": torch.ones(1)},
    )
    (call,) = _calls(log)
    values = [call[i + 1] for i, line in enumerate(call) if line.startswith("  arg[")]
    assert values == [
        "    None",
        "    'text'",
        "    [0, 1, 2, 3, 4, 5, 6, 7, ... (+12 more, 20 total)]",
        "    {'k': 1}",
        "    torch.float16",
        "    <Unprintable: unprintable (RuntimeError)>",
        "    1e-06",
    ]
    assert call[call.index("  nested=") + 1] == "    [(1, 2), [3]]"
    assert call[call.index("  tensors=") + 1 : call.index("  tensors=") + 4] == [
        "    {",
        "      't':",
        "        Tensor(",
    ]
    assert call[call.index("Output value:") + 1] == "  None"


def test_long_sequences_of_tensors_are_cut(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _logger(3, log).decorate(sample_api.concat)([torch.ones(1)] * 10)
    (call,) = _calls(log)
    assert "      [7]:" in call and "      [8]:" not in call
    assert "      ... (+2 more, 10 total)" in call


# -- the decorator ---------------------------------------------------------------------------


def test_wrapper_preserves_name_doc_and_signature(tmp_path: Path) -> None:
    for level in (1, 2, 3, 4, 5):
        func = _logger(level, tmp_path / "log").decorate(sample_api.add_and_sub)
        assert func.__name__ == "add_and_sub"
        assert func.__doc__ == sample_api.add_and_sub.__doc__
        assert inspect.signature(func) == inspect.signature(sample_api.add_and_sub)


def test_methods_and_init_are_logged_by_qualified_name(tmp_path: Path) -> None:
    log = tmp_path / "log"
    logger = _logger(3, log)

    class Decorated(sample_api.Wrapper):
        __init__ = logger.decorate(sample_api.Wrapper.__init__)
        run = logger.decorate(sample_api.Wrapper.run)

    obj = Decorated(4)
    assert torch.equal(obj.run(torch.ones(2)), torch.full((2,), 4.0))
    init, run = _calls(log)
    assert init[1] == "[ts] FlashInfer API Call: Wrapper.__init__"
    assert init[4:8] == ["  arg[0]:", f"    {obj!r}", "  arg[1]:", "    4"]
    assert run[1] == "[ts] FlashInfer API Call: Wrapper.run"


def test_logging_never_changes_results(tmp_path: Path) -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    plain = sample_api.add_and_sub(a, b, 0.5)
    for level in (1, 3, 5):
        logged = _logger(level, tmp_path / "log").decorate(sample_api.add_and_sub)(a, b, 0.5)
        assert all(torch.equal(p, q) for p, q in zip(plain, logged))


# -- the environment, in fresh processes -----------------------------------------------------

_CHILD = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch, flashinfer
from tests.debug import sample_api
"""


def test_env_level_and_destination_with_pid_and_parent_dirs(tmp_path: Path) -> None:
    dest = tmp_path / "nested" / "dir" / "log_%i.txt"
    proc = run_python(
        _CHILD + "sample_api.scale_(torch.ones(2), 2.0)\nimport os; print(os.getpid())",
        env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": str(dest)},
    )
    pid = proc.stdout.strip()
    log = tmp_path / "nested" / "dir" / f"log_{pid}.txt"
    assert log.is_file()
    (call,) = _calls(log)
    assert call[1] == "[ts] FlashInfer API Call: scale_"
    assert "FlashInfer API" not in proc.stdout


def test_stdout_is_the_default_and_stderr_is_accepted(tmp_path: Path) -> None:
    code = _CHILD + "sample_api.scale_(torch.ones(2), 2.0)"
    out = run_python(code, env={"FLASHINFER_LOGLEVEL": "1"})
    assert "FlashInfer API Call: scale_" in out.stdout
    assert "FlashInfer API Logging - System Information" in out.stdout
    err = run_python(code, env={"FLASHINFER_LOGLEVEL": "1", "FLASHINFER_LOGDEST": "stderr"})
    assert "FlashInfer API Call: scale_" in err.stderr and "FlashInfer" not in err.stdout


def test_invalid_level_imports_and_each_api_call_names_the_valid_levels() -> None:
    code = (
        _CHILD
        + """
@flashinfer.flashinfer_api
def scale(x):
    return x * 2
try:
    scale(torch.ones(2))
except ValueError as err:
    print("refused:", err)
"""
    )
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "7"})
    assert "refused: invalid value '7' for FLASHINFER_LOGLEVEL" in proc.stdout
    assert (
        "0 (off), 1 (names), 2 (as 1), 3 (inputs/outputs), 4 (as 3), 5 (statistics), "
        "10 (dumps)" in proc.stdout
    )


@pytest.mark.parametrize("how", ["os._exit", "SIGKILL"])
def test_inputs_are_on_disk_before_a_call_that_kills_the_process(tmp_path: Path, how: str) -> None:
    log = tmp_path / "log.txt"
    kill = "os._exit(3)" if how == "os._exit" else "os.kill(os.getpid(), signal.SIGKILL)"
    code = (
        _CHILD
        + f"""
import os, signal
@flashinfer.flashinfer_api
def crashes(x, note):
    {kill}
crashes(torch.arange(6.0).reshape(2, 3), note="about to die")
"""
    )
    proc = run_python(
        code, env={"FLASHINFER_LOGLEVEL": "5", "FLASHINFER_LOGDEST": str(log)}, check=False
    )
    assert proc.returncode != 0
    body = _body(log)
    assert body[1] == "[ts] FlashInfer API Call: crashes"
    assert body[3:5] == ["Positional input arguments:", "  arg[0]:"]
    assert "      min=0.000000" in body and "      mean=2.500000" in body
    assert body[-2:] == ["  note=", "    'about to die'"]  # the last thing written


def test_a_real_api_at_level_3(tmp_path: Path) -> None:
    log = tmp_path / "log"
    code = (
        _CHILD
        + """
try:
    flashinfer.rmsnorm(torch.ones(2, 4, dtype=torch.float16), torch.ones(4, dtype=torch.float16))
except ValueError as err:
    print(err)
"""
    )
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": str(log)})
    assert "must be a CUDA tensor" in proc.stdout
    (call,) = _calls(log)
    assert call[1] == "[ts] FlashInfer API Call: rmsnorm"
    assert call[call.index("  eps= [DEFAULT]") + 1] == "    1e-06"
    assert call[-3].startswith("Call raised ValueError: input must be a CUDA tensor")
    assert os.path.getsize(log) > 0


# -- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_tensors_at_level_5(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.batch_decode_with_padded_kv_cache)
    q = _doc_tensor(32, 8, 128).cuda()
    func(q, kv_cache=q[:, :, :64])
    header, _ = _split(log)
    major, minor = torch.cuda.get_device_capability(0)
    assert header[5] == f"GPU 0: {torch.cuda.get_device_name(0)}"
    assert header[6] == f"  Compute capability: {major}.{minor} (SM{major * 10 + minor})"
    (call,) = _calls(log)
    expected = TUTORIAL_LEVEL_5_BLOCK.splitlines()
    assert call[5 : 5 + len(expected)] == ["  " + line for line in expected]
    kv = call[call.index("  kv_cache=") + 1 :]
    assert kv[:8] == [
        "    Tensor(",
        "      shape=(32, 8, 64)",
        "      dtype=torch.bfloat16",
        "      device=cuda:0",
        "      requires_grad=False",
        "      is_contiguous=False",
        "      stride=(1024, 128, 1)",
        f"      min={q[:, :, :64].float().min().item():.6f}",
    ]
