"""``@flashinfer_api``: logs every public API call at FLASHINFER_LOGLEVEL.

Levels (read once, at ``import flashinfer``; with an invalid value every decorated API
raises the ValueError naming the variable when called, so tools like ``doctor`` still start):

- 0: off; the decorator returns the function itself (no wrapper, no overhead)
- 1: one line per call: ``[YYYY-MM-DD HH:MM:SS] FlashInfer API Call: <qualified name>``
- 3: level 1 + every argument and the return value (tensors as metadata)
- 5: level 3 + tensor statistics (min, max, mean, nan/inf counts; skipped during graph capture)
- 10: level 5 + the call's tensors dumped to FLASHINFER_DUMP_DIR (see flashinfer/dump.py)

Output goes to FLASHINFER_LOGDEST (see flashinfer/logdest.py). Everything about the
inputs is written and flushed before the call runs, so it survives a crash of the call.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, TypeVar

import torch

from .config import config
from .dump import ArgumentBinder, Dumper
from .logdest import Destination
from .tensor_format import format_stats, format_value, graph_capture_in_progress, tensor_stats
from .version import __version__

F = TypeVar("F", bound=Callable[..., Any])

_CAPTURE_NOTE = "[statistics skipped: CUDA graph capture in progress]"
API_MARKER = "__flashinfer_api__"  # set to True on every @flashinfer_api function, at any level


def system_info() -> list[str]:
    """The header written once per process before the first logged call."""
    try:
        from .jit.toolchain import current_toolchain

        nvcc = current_toolchain().nvcc_version().split(" | ")[0]
    except Exception as err:
        nvcc = f"not found ({type(err).__name__})"
    lines = [
        f"flashinfer {__version__}, torch {torch.__version__} "
        f"(CUDA runtime {torch.version.cuda or 'none'}), CUDA toolkit: {nvcc}",
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)} "
                         f"(compute capability {major}.{minor})")
    else:
        lines.append("GPU: no GPU")
    return lines


class _Clock:
    """``YYYY-MM-DD HH:MM:SS``, formatted once per second (strftime costs ~1 us)."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return self._text


class ApiLogger:
    """Decorates APIs for one level, destination and dumper."""

    def __init__(self, level: int, dest: Destination, dumper: Dumper | None = None) -> None:
        self.level = level
        self.dest = dest
        self.dumper = dumper
        self._clock = _Clock()
        self._header_pid: int | None = None

    @classmethod
    def from_config(cls) -> ApiLogger:
        level = config.api_log_level
        dumper = Dumper.from_config() if level >= 10 else None
        return cls(level, Destination(config.api_log_dest), dumper)

    def _write(self, lines: list[str]) -> None:
        if self._header_pid != os.getpid():  # once per process, forks included
            self._header_pid = os.getpid()
            header = [f"=== FlashInfer API logging, level {self.level}, pid {os.getpid()} ==="]
            lines = header + [f"  {ln}" for ln in system_info()] + lines
        self.dest.write("\n".join(lines))

    def _describe(self, label: str, value: Any, stats: bool) -> list[str]:
        lines = [f"  {label}: {format_value(value)}"]
        if stats:
            tensors = [value] if isinstance(value, torch.Tensor) else (
                [v for v in value if isinstance(v, torch.Tensor)]
                if isinstance(value, (list, tuple)) else []
            )
            for tensor in tensors:
                if graph_capture_in_progress():
                    lines.append(f"    {_CAPTURE_NOTE}")
                    break
                try:
                    lines.append(f"    {format_stats(tensor_stats(tensor))}")
                except Exception as err:
                    lines.append(f"    [statistics unavailable: {type(err).__name__}]")
        return lines

    def decorate(self, func: F) -> F:
        if self.level == 0:
            return func
        name = func.__qualname__
        if self.level == 1:

            @functools.wraps(func)
            def log_name(*args: Any, **kwargs: Any) -> Any:
                self._write([f"[{self._clock.now()}] FlashInfer API Call: {name}"])
                return func(*args, **kwargs)

            return log_name  # type: ignore[return-value]

        binder = ArgumentBinder(func)
        stats = self.level >= 5

        @functools.wraps(func)
        def log_call(*args: Any, **kwargs: Any) -> Any:
            arguments = binder.bind(args, kwargs)
            lines = [f"[{self._clock.now()}] FlashInfer API Call: {name}"]
            for arg_name, _kind, value in arguments:
                lines += self._describe(arg_name, value, stats)
            dump = None
            if self.dumper is not None:
                dump = self.dumper.dump_inputs(func, arguments)
                if dump is not None:
                    lines.append(f"  [inputs dumped to {dump.directory}]")
            self._write(lines)
            start = time.perf_counter()
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                self._write([f"  raised {type(exc).__name__}: {exc}"])
                if dump is not None:
                    self.dumper.dump_exception(dump, exc)  # type: ignore[union-attr]
                raise
            elapsed = (time.perf_counter() - start) * 1e3
            out = [f"[{self._clock.now()}] FlashInfer API Return: {name} ({elapsed:.3f} ms)"]
            out += self._describe("return", result, stats)
            if dump is not None:
                self.dumper.dump_outputs(dump, result)  # type: ignore[union-attr]
            self._write(out)
            return result

        return log_call  # type: ignore[return-value]


def _refuse_calls(func: F) -> F:
    """``func`` raising the configuration error instead of running."""

    @functools.wraps(func)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        config.validate()
        return func(*args, **kwargs)  # the variable was fixed since the import

    return refuse  # type: ignore[return-value]


try:
    _API_LOGGER: ApiLogger | None = ApiLogger.from_config()
except ValueError:
    _API_LOGGER = None


def flashinfer_api(func: F) -> F:
    """Decorate a public API for logging at FLASHINFER_LOGLEVEL (identity at level 0).

    Marks ``func`` (and so its wrapper) with ``API_MARKER``: replay runs only marked functions."""
    setattr(func, API_MARKER, True)
    if _API_LOGGER is None:
        return _refuse_calls(func)
    return _API_LOGGER.decorate(func)
