"""@flashinfer_api: every level's output, destinations, crash safety (CPU)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer import api_logging
from flashinfer.api_logging import ApiLogger
from flashinfer.logdest import Destination
from tests.conftest import REPO_ROOT, run_python
from tests.debug import sample_api

STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]"


def _logger(level: int, path: Path) -> ApiLogger:
    return ApiLogger(level, Destination(str(path)))


def _body(path: Path) -> list[str]:
    """The log's lines after the once-per-process header."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("=== FlashInfer API logging, level ")
    assert lines[1].startswith("  flashinfer ") and "torch " in lines[1]
    assert lines[2].startswith("  GPU")
    return lines[3:]


def test_level_0_returns_the_function_itself(tmp_path: Path) -> None:
    assert _logger(0, tmp_path / "log").decorate(sample_api.scale_) is sample_api.scale_
    if api_logging._API_LOGGER.level == 0:
        assert not hasattr(flashinfer.rmsnorm, "__wrapped__")  # the real APIs: no wrapper


def test_level_1_one_line_per_call_and_one_header(tmp_path: Path) -> None:
    log = tmp_path / "log"
    logger = _logger(1, log)
    plan = logger.decorate(sample_api.Wrapper.plan)
    wrapper = sample_api.Wrapper(3)
    assert plan(wrapper, 2) == 6
    assert plan(wrapper, 5) == 15
    body = _body(log)
    assert len(body) == 2
    assert all(re.fullmatch(f"{STAMP} FlashInfer API Call: Wrapper.plan", ln) for ln in body)


def test_level_3_arguments_and_return(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(3, log).decorate(sample_api.add_and_sub)
    a = torch.ones(3, 4)
    b = torch.ones(4, 3).t()
    func(a, b, 2.0, mode=sample_api.Mode.EXACT)
    body = _body(log)
    assert re.fullmatch(f"{STAMP} FlashInfer API Call: add_and_sub", body[0])
    assert body[1] == ("  a: Tensor(shape=(3, 4), dtype=float32, device=cpu, "
                       "requires_grad=False, is_contiguous=True)")
    assert body[2] == ("  b: Tensor(shape=(3, 4), dtype=float32, device=cpu, "
                       "requires_grad=False, is_contiguous=False, stride=(1, 3))")
    assert body[3] == "  alpha: 2.0"
    assert body[4] == "  mode: Mode.EXACT"
    assert re.fullmatch(f"{STAMP} FlashInfer API Return: add_and_sub \\(\\d+\\.\\d+ ms\\)", body[5])
    assert body[6].startswith("  return: (Tensor(shape=(3, 4)") and body[6].count("Tensor(") == 2
    assert len(body) == 7


def test_level_3_shows_odd_values_readably_and_never_raises(tmp_path: Path) -> None:
    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    def takes_anything(*values, **options):  # noqa: ANN002, ANN003, ANN202
        return None

    log = tmp_path / "log"
    func = _logger(3, log).decorate(takes_anything)
    func(None, "text", list(range(20)), {"k": 1}, torch.float16, Unprintable(),
         nested=[(1, 2), [3]])
    text = log.read_text()
    assert "  values: (None, 'text', [0, 1, 2, 3, 4, 5, 6, 7, ... (+12 more, 20 total)]" in text
    assert "{'k': 1}, torch.float16, <Unprintable: unprintable (RuntimeError)>)" in text
    assert "  options: {'nested': [(1, 2), [3]]}" in text
    assert "  return: None" in text


def _stats(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-\w.+]+)", line)}


def test_level_5_statistics_match_torch(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.scale_)
    clean = torch.randn(5, 7)
    func(clean, 1.0)
    stats = _stats(_body(log)[2])
    assert stats["min"] == pytest.approx(clean.min().item(), rel=1e-5)
    assert stats["max"] == pytest.approx(clean.max().item(), rel=1e-5)
    assert stats["mean"] == pytest.approx(clean.mean().item(), rel=1e-5, abs=1e-6)
    assert stats["nan_count"] == 0 and stats["inf_count"] == 0


def test_level_5_counts_nan_and_inf_and_describes_the_finite_values(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.scale_)
    x = torch.randn(64, 33, dtype=torch.bfloat16)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), float("-inf")
    finite = x.float()[torch.isfinite(x.float())]
    func(x, 1.0)
    stats = _stats(_body(log)[2])
    assert stats["nan_count"] == 1 and stats["inf_count"] == 2
    assert stats["min"] == pytest.approx(finite.min().item(), rel=1e-5)
    assert stats["max"] == pytest.approx(finite.max().item(), rel=1e-5)
    assert stats["mean"] == pytest.approx(finite.mean().item(), rel=1e-4, abs=1e-5)
    func(torch.full((3,), float("nan")), 1.0)
    assert "[min=nan, max=nan, mean=nan, nan_count=3, inf_count=0]" in log.read_text()


def test_level_5_integer_bool_and_empty_tensors(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(5, log).decorate(sample_api.concat)
    func([torch.tensor([1, 5, 9]), torch.tensor([], dtype=torch.int64)])
    func([torch.tensor([True, False, True])])
    text = log.read_text()
    assert "[min=1, max=9, mean=5]" in text
    assert "[statistics: empty tensor]" in text
    assert "[true_count=2, false_count=1]" in text
    assert "nan_count" not in text  # not meaningful for integers and bools


def test_level_5_skips_statistics_during_graph_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_logging, "graph_capture_in_progress", lambda: True)

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("statistics computed during capture")

    monkeypatch.setattr(api_logging, "tensor_stats", refuse)
    log = tmp_path / "log"
    _logger(5, log).decorate(sample_api.scale_)(torch.ones(2), 2.0)
    assert "    [statistics skipped: CUDA graph capture in progress]" in _body(log)


def test_exceptions_are_logged_and_reraised_unchanged(tmp_path: Path) -> None:
    log = tmp_path / "log"
    func = _logger(3, log).decorate(sample_api.fail)
    with pytest.raises(ValueError, match=r"bad x of shape \(2,\)"):
        func(torch.ones(2))
    assert "  raised ValueError: bad x of shape (2,)" in log.read_text()


def test_wrapper_preserves_name_doc_and_signature(tmp_path: Path) -> None:
    for level in (1, 3, 5):
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
    text = log.read_text()
    assert "FlashInfer API Call: Wrapper.__init__" in text and "  size: 4" in text
    assert "FlashInfer API Call: Wrapper.run" in text


def test_logging_never_changes_results(tmp_path: Path) -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    plain = sample_api.add_and_sub(a, b, 0.5)
    for level in (1, 3, 5):
        logged = _logger(level, tmp_path / "log").decorate(sample_api.add_and_sub)(a, b, 0.5)
        assert all(torch.equal(p, q) for p, q in zip(plain, logged))


_CHILD = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch, flashinfer
from tests.debug import sample_api
"""


def test_env_level_and_destination_with_pid_and_parent_dirs(tmp_path: Path) -> None:
    dest = tmp_path / "nested" / "dir" / "log_%i.txt"
    proc = run_python(
        _CHILD + "f = flashinfer.flashinfer_api(sample_api.scale_)\n"
        "f(torch.ones(2), 2.0)\nimport os; print(os.getpid())",
        env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": str(dest)},
    )
    pid = proc.stdout.strip()
    log = tmp_path / "nested" / "dir" / f"log_{pid}.txt"
    assert log.is_file()
    assert "FlashInfer API Call: scale_" in log.read_text()
    assert "FlashInfer API" not in proc.stdout


def test_stdout_is_the_default_and_stderr_is_accepted(tmp_path: Path) -> None:
    code = _CHILD + "flashinfer.flashinfer_api(sample_api.scale_)(torch.ones(2), 2.0)"
    out = run_python(code, env={"FLASHINFER_LOGLEVEL": "1"})
    assert "FlashInfer API Call: scale_" in out.stdout
    err = run_python(code, env={"FLASHINFER_LOGLEVEL": "1", "FLASHINFER_LOGDEST": "stderr"})
    assert "FlashInfer API Call: scale_" in err.stderr and "FlashInfer" not in err.stdout


def test_invalid_level_imports_and_each_api_call_names_the_valid_levels() -> None:
    code = _CHILD + """
@flashinfer.flashinfer_api
def scale(x):
    return x * 2
try:
    scale(torch.ones(2))
except ValueError as err:
    print("refused:", err)
"""
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "4"})
    assert "refused: " in proc.stdout
    assert "FLASHINFER_LOGLEVEL" in proc.stdout and "0, 1, 3, 5, 10" in proc.stdout


@pytest.mark.parametrize("how", ["os._exit", "SIGKILL"])
def test_inputs_are_on_disk_before_a_call_that_kills_the_process(tmp_path: Path, how: str) -> None:
    log = tmp_path / "log.txt"
    kill = "os._exit(3)" if how == "os._exit" else "os.kill(os.getpid(), signal.SIGKILL)"
    code = _CHILD + f"""
import os, signal
@flashinfer.flashinfer_api
def crashes(x, note):
    {kill}
crashes(torch.arange(6.0).reshape(2, 3), "about to die")
"""
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "5", "FLASHINFER_LOGDEST": str(log)},
                      check=False)
    assert proc.returncode != 0
    text = log.read_text()
    assert "FlashInfer API Call: crashes" in text
    assert "  x: Tensor(shape=(2, 3)" in text and "[min=0, max=5, mean=2.5" in text
    assert "  note: 'about to die'" in text
    assert "Return" not in text


def test_real_api_logs_at_level_1(tmp_path: Path) -> None:
    log = tmp_path / "log"
    code = _CHILD + """
try:
    flashinfer.rmsnorm(torch.ones(2, 4, dtype=torch.float16), torch.ones(4, dtype=torch.float16))
except ValueError as err:
    print(err)
"""
    proc = run_python(code, env={"FLASHINFER_LOGLEVEL": "3", "FLASHINFER_LOGDEST": str(log)})
    assert "must be a CUDA tensor" in proc.stdout
    text = log.read_text()
    assert "FlashInfer API Call: rmsnorm" in text and "  eps: 1e-06" in text
    assert "  raised ValueError: input must be a CUDA tensor" in text
    assert os.path.getsize(log) > 0
