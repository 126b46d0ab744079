"""``@flashinfer_api``: logs every public API call at FLASHINFER_LOGLEVEL in the reference's format.

Levels (read once, at ``import flashinfer``; with an invalid value every decorated API
raises the ValueError naming the variable when called, so tools like ``doctor`` still start):

- 0: off; the decorator returns the function itself (no wrapper, no overhead), unless
  FLASHINFER_TRACE_DUMP=1 adds the fi_trace auto-dump (flashinfer/trace/api.py)
- 1: one line per call: ``[YYYY-MM-DD HH:MM:SS] FlashInfer API Call: <qualified name>``
- 3: the call in a block between ``=`` rules: its positional and keyword input arguments
  (tensors as multi-line ``Tensor(`` blocks), the defaults it did not pass, then the output
  value and the time the call took (ours)
- 5: level 3 + min, max, mean, nan_count, inf_count inside each ``Tensor(`` block
- 2 and 4 log as 1 and 3 (the reference's documents name 0, 1, 3 and 5)
- 10 (ours): level 5 + the call's tensors dumped to FLASHINFER_DUMP_DIR (see flashinfer/dump.py)

The first logged call of a process writes the system-information block first. Output goes
to FLASHINFER_LOGDEST (see flashinfer/logdest.py). Everything about the inputs is written
and flushed before the call runs, so it survives a crash of the call.

Logging is eager-only: while dynamo traces (``torch.compile``, ``torch.export``) a decorated
API runs undecorated, so a compiled model neither logs nor breaks its graph here; the
compiled code's calls are not logged (the kernel ops inside it still run the debug printer).
"""

from __future__ import annotations

import functools
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import torch

from .arguments import ArgumentBinder
from .config import config
from .logdest import Destination
from .tensor_format import value_lines
from .version import __version__

if TYPE_CHECKING:
    from .dump import Dumper
    from .trace.template import TraceTemplate

F = TypeVar("F", bound=Callable[..., Any])

API_MARKER = "__flashinfer_api__"  # set to True on every @flashinfer_api function, at any level
RULE = "=" * 80
THIN_RULE = "-" * 80
LOGS_AS = {2: 1, 4: 3}  # accepted levels the reference's documents do not name


def _cuda_toolkit_version() -> str:
    """The release of the nvcc that builds our kernels, else the one torch was built with."""
    try:
        from .jit.toolchain import current_toolchain  # here: `import flashinfer` skips the JIT

        found = re.search(r"release (\d+\.\d+)", current_toolchain().nvcc_version())
        if found:
            return found.group(1)
    except Exception:  # noqa: BLE001 - no nvcc: fall back to torch's build
        pass
    return torch.version.cuda or "<unavailable>"


def system_info(stamp: str) -> list[str]:
    """The block written once per process before its first logged call."""
    lines = [
        RULE,
        f"{stamp} FlashInfer API Logging - System Information",
        RULE,
        f"FlashInfer version: {__version__}",
        f"CUDA toolkit version: {_cuda_toolkit_version()}",
    ]
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for i in range(count):
            major, minor = torch.cuda.get_device_capability(i)
            lines += [
                f"GPU {i}: {torch.cuda.get_device_name(i)}",
                f"  Compute capability: {major}.{minor} (SM{major * 10 + minor})",
            ]
        if count == 0:
            lines.append("CUDA: Not available (CPU-only mode)")
    except Exception as err:  # noqa: BLE001 - a broken driver must not break the call
        lines.append(f"GPU: <error: {type(err).__name__}: {err}>")
    return lines + [f"PyTorch version: {torch.__version__}", RULE, ""]


class _Clock:
    """``[YYYY-MM-DD HH:MM:SS]``, formatted once per second (strftime costs ~1 us)."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._text = time.strftime("[%Y-%m-%d %H:%M:%S]", time.localtime(second))
        return self._text


def _section(title: str, entries: list[tuple[str, Any]], stats: bool) -> list[str]:
    """``title`` then, per entry, its label line and its value two levels in."""
    lines = [title]
    for label, value in entries:
        lines.append(f"  {label}")
        lines += value_lines(value, "    ", stats)
    return lines


class ApiLogger:
    """Decorates APIs for one level, destination and dumper."""

    def __init__(self, level: int, dest: Destination, dumper: Dumper | None = None) -> None:
        self.level = level
        self.effective_level = LOGS_AS.get(level, level)
        self.dest = dest
        self.dumper = dumper
        self._clock = _Clock()
        self._header_pid: int | None = None

    @classmethod
    def from_config(cls) -> ApiLogger:
        level = config.api_log_level
        dumper = None
        if level >= 10:
            from .dump import Dumper  # only here: dumps need safetensors and jit's file helpers

            dumper = Dumper.from_config()
        return cls(level, Destination(config.api_log_dest), dumper)

    def _write(self, lines: list[str]) -> None:
        if self._header_pid != os.getpid():  # once per process, forks included
            self._header_pid = os.getpid()
            lines = system_info(self._clock.now()) + lines
        self.dest.write("\n".join(lines) + "\n")  # a trailing "" ends with a blank line

    def _inputs(
        self,
        name: str,
        binder: ArgumentBinder,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stats: bool,
    ) -> list[str]:
        """The call's opening: what it was passed, then the defaults it left out."""
        lines = [RULE, f"{self._clock.now()} FlashInfer API Call: {name}", THIN_RULE]
        if args:
            lines += _section(
                "Positional input arguments:",
                [(f"arg[{i}]:", v) for i, v in enumerate(args)],
                stats,
            )
        if kwargs:
            lines += _section(
                "Keyword input arguments:", [(f"{k}=", v) for k, v in kwargs.items()], stats
            )
        if not args and not kwargs:
            lines.append("(No explicit arguments)")
        defaults = binder.defaults_not_passed(args, kwargs)
        if defaults:
            lines += _section(
                "Default parameters (not explicitly provided):",
                [(f"{k}= [DEFAULT]", v) for k, v in defaults],
                stats,
            )
        return lines

    def decorate(self, func: F) -> F:
        if self.effective_level == 0:
            return func
        name = func.__qualname__
        if self.effective_level == 1:

            @functools.wraps(func)
            def log_name(*args: Any, **kwargs: Any) -> Any:
                if torch.compiler.is_compiling():
                    return func(*args, **kwargs)
                self._write([f"{self._clock.now()} FlashInfer API Call: {name}"])
                return func(*args, **kwargs)

            return log_name  # type: ignore[return-value]

        binder = ArgumentBinder(func)
        stats = self.effective_level >= 5

        @functools.wraps(func)
        def log_call(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return func(*args, **kwargs)
            lines = self._inputs(name, binder, args, kwargs, stats)
            dump = None
            if self.dumper is not None:
                dump = self.dumper.dump_inputs(func, binder.bind(args, kwargs))
                if dump is not None:
                    lines.append(f"Inputs dumped to: {dump.directory}")
            self._write(lines)
            start = time.perf_counter()
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                self._write([f"Call raised {type(exc).__name__}: {exc}", _elapsed(start), RULE, ""])
                if dump is not None:
                    self.dumper.dump_exception(dump, exc)  # type: ignore[union-attr]
                raise
            elapsed = _elapsed(start)
            if dump is not None:
                self.dumper.dump_outputs(dump, result)  # type: ignore[union-attr]
            self._write(["Output value:", *value_lines(result, "  ", stats), elapsed, RULE, ""])
            return result

        return log_call  # type: ignore[return-value]


def _elapsed(start: float) -> str:
    return f"Host time: {(time.perf_counter() - start) * 1e3:.3f} ms"


def _refuse_calls(func: F) -> F:
    """``func`` raising the configuration error instead of running."""

    @functools.wraps(func)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        config.validate()
        return func(*args, **kwargs)  # the variable was fixed since the import

    return refuse  # type: ignore[return-value]


try:
    _API_LOGGER: ApiLogger | None = ApiLogger.from_config()
    _TRACE_DUMP = config.trace_dump  # read once, like the level: off means no wrapper at all
except ValueError:
    _API_LOGGER, _TRACE_DUMP = None, False


def flashinfer_api(func: F | None = None, *, trace: TraceTemplate | None = None) -> Any:
    """Decorate a public API for logging at FLASHINFER_LOGLEVEL (identity at level 0).

    ``@flashinfer_api`` or ``@flashinfer_api(trace=template)``: a template gives the function
    a ``fi_trace`` attribute (flashinfer/trace/) and, with FLASHINFER_TRACE_DUMP=1, the
    auto-dump wrapper. Marks ``func`` (and so its wrappers) with ``API_MARKER``: replay runs
    only marked functions."""
    if func is None:
        return functools.partial(flashinfer_api, trace=trace)
    setattr(func, API_MARKER, True)
    api_trace = None
    if trace is not None:
        from .trace.api import attach_trace  # here: `import flashinfer` skips the trace package

        api_trace = attach_trace(func, trace)  # wrappers below copy the attribute
    if _API_LOGGER is None:
        return _refuse_calls(func)
    if api_trace is not None and _TRACE_DUMP:
        from .trace.api import with_auto_dump

        func = with_auto_dump(func, api_trace)
    return _API_LOGGER.decorate(func)
