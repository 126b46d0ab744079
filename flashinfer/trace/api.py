"""``.fi_trace`` on decorated APIs, ``fi_trace(func_or_method, ...)`` and the auto-dump.

``@flashinfer_api(trace=template)`` attaches an :class:`ApiTrace` as the function's
``fi_trace`` attribute. With ``FLASHINFER_TRACE_DUMP=1`` set at import it also wraps the
function so that its first call per set of const-axis values writes ``<name>.json`` to
``FLASHINFER_TRACE_DUMP_DIR``; without it nothing wraps, so a call costs nothing extra. The
auto-dump is eager-only: while dynamo traces, the wrapper calls the function and nothing else.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from ..config import config
from .template import Kwargs, TraceTemplate

F = TypeVar("F", bound=Callable[..., Any])

_log = logging.getLogger("flashinfer.trace")

_dumped: set[tuple[str, tuple[tuple[str, int], ...]]] = set()  # (api, const axes) this process
_dumped_lock = threading.Lock()


def reset_dumped() -> None:
    """Forget which definitions this process has auto-dumped (tests)."""
    with _dumped_lock:
        _dumped.clear()


def write_definition(definition: dict[str, Any], directory: str | Path) -> Path:
    """Write ``<name>.json`` under ``directory`` (created); returns its path."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{definition['name']}.json"
    path.write_text(json.dumps(definition, indent=2) + "\n")
    return path


class ApiTrace:
    """The ``fi_trace`` attribute of one decorated API: ``api.fi_trace(**kwargs)``."""

    def __init__(self, func: Callable[..., Any], template: TraceTemplate) -> None:
        self.template = template
        self.fi_api = f"{func.__module__}.{func.__qualname__}"
        self.signature = inspect.signature(func)
        self.__doc__ = (
            f"The flashinfer-bench definition of a {self.fi_api} call "
            f"(op_type {template.op_type!r}) from its arguments' shapes and dtypes."
        )

    def __call__(self, save_dir: str | Path | None = None, **kwargs: Any) -> dict[str, Any]:
        return self.trace(kwargs, save_dir=save_dir)

    def trace(
        self, kwargs: Kwargs, instance: object = None, save_dir: str | Path | None = None
    ) -> dict[str, Any]:
        """The definition for ``kwargs``; ``instance``: the wrapper whose plan() state fills
        the template's ``plan_attrs``; ``save_dir``: also write it there (always)."""
        definition = self.template.definition(self.fi_api, self._complete(kwargs, instance))
        if save_dir is not None:
            write_definition(definition, save_dir)
        return definition

    def _complete(self, kwargs: Kwargs, instance: object) -> Kwargs:
        """``kwargs`` plus the wrapper's planned values and the defaults not passed."""
        full = dict(kwargs)
        if instance is not None:
            for param, attr in self.template.plan_attrs.items():
                if param not in full and getattr(instance, attr, None) is not None:
                    full[param] = getattr(instance, attr)
        for name, param in self.signature.parameters.items():
            if name not in full and param.default is not inspect.Parameter.empty:
                full[name] = param.default
        return full

    def call_kwargs(self, args: tuple[Any, ...], kwargs: Kwargs) -> tuple[Kwargs, object]:
        """A call's arguments by parameter name, and its ``self`` (None for functions)."""
        bound = self.signature.bind_partial(*args, **kwargs).arguments
        instance = bound.pop("self", None)
        named: Kwargs = {}
        for name, value in bound.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif kind is not inspect.Parameter.VAR_POSITIONAL:
                named[name] = value
        return named, instance

    def dump_once(self, args: tuple[Any, ...], kwargs: Kwargs) -> Path | None:
        """Write this call's definition unless one with its const axes already was."""
        named, instance = self.call_kwargs(args, kwargs)
        full = self._complete(named, instance)
        key = (self.fi_api, self.template.const_values(full))
        with _dumped_lock:
            if key in _dumped:
                return None
            _dumped.add(key)
        return write_definition(self.template.definition(self.fi_api, full), config.trace_dump_dir)


def attach_trace(func: F, template: TraceTemplate) -> ApiTrace:
    """Set ``func.fi_trace``; raise TypeError if ``template`` is not a TraceTemplate."""
    if not isinstance(template, TraceTemplate):
        raise TypeError(
            f"trace must be a flashinfer.trace.TraceTemplate, got {type(template).__name__}"
        )
    api_trace = ApiTrace(func, template)
    func.fi_trace = api_trace  # type: ignore[attr-defined]
    return api_trace


def with_auto_dump(func: F, api_trace: ApiTrace) -> F:
    """``func`` writing its definition before its first call per const-axis values.

    A failure to trace or write is logged once per API and never fails the call."""
    failed = False

    @functools.wraps(func)
    def dumping(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        if not failed and not torch.compiler.is_compiling():
            try:
                api_trace.dump_once(args, kwargs)
            except TypeError:
                pass  # arguments that do not bind: the call itself raises the error
            except Exception as err:  # noqa: BLE001 - tracing must never break the API
                failed = True
                _log.warning(
                    "fi_trace auto-dump of %s failed: %s: %s",
                    api_trace.fi_api,
                    type(err).__name__,
                    err,
                )
        return func(*args, **kwargs)

    return dumping  # type: ignore[return-value]


def fi_trace(
    func_or_method: Callable[..., Any], save_dir: str | Path | None = None, **kwargs: Any
) -> dict[str, Any]:
    """The definition of a call of a ``@flashinfer_api(trace=...)`` function or method.

    A bound method (``wrapper.run``) also reads what its wrapper's ``plan()`` stored
    (page table, layout, scale), which the class-level ``Wrapper.run.fi_trace`` cannot."""
    instance = getattr(func_or_method, "__self__", None)
    func = getattr(func_or_method, "__func__", func_or_method)
    api_trace = getattr(func, "fi_trace", None)
    if not isinstance(api_trace, ApiTrace):
        name = getattr(func, "__qualname__", repr(func))
        raise ValueError(
            f"func_or_method: {name} has no fi_trace; only @flashinfer_api(trace=...) functions do"
        )
    return api_trace.trace(kwargs, instance=instance, save_dir=save_dir)
