"""Names the arguments of a call, for API logging and its level-10 dumps.

The log shows what the caller passed (positional arguments by index, keywords by name)
and, apart, the defaults the caller did not pass; a dump needs every parameter by name
with the defaults applied, so that replay can call the function again the same way.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

Argument = tuple[str, str, Any]  # (parameter name, parameter kind name, value)

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ArgumentBinder:
    """Built once per decorated function; cheap per call."""

    def __init__(self, func: Callable[..., Any]) -> None:
        try:
            self.signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # some builtins and extension functions have none
            self.signature = None
        params = self.signature.parameters.values() if self.signature else ()
        # (position when it can be passed positionally, else None; name; default)
        self._defaults = [
            (index if p.kind in _POSITIONAL else None, p.name, p.default)
            for index, p in enumerate(params)
            if p.default is not inspect.Parameter.empty
        ]

    def defaults_not_passed(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[str, Any]]:
        """(name, default) of each defaulted parameter the call leaves out, in order."""
        return [
            (name, default)
            for position, name, default in self._defaults
            if not (position is not None and position < len(args)) and name not in kwargs
        ]

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Argument]:
        """Every parameter of the call, defaults applied. A call that does not bind (it will
        raise when run) or a function without a signature names positional arguments
        ``arg<i>``."""
        if self.signature is not None:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError:
                pass
            else:
                bound.apply_defaults()
                params = self.signature.parameters
                return [
                    (name, params[name].kind.name, value) for name, value in bound.arguments.items()
                ]
        named = [(f"arg{i}", "POSITIONAL_ONLY", value) for i, value in enumerate(args)]
        return named + [(name, "KEYWORD_ONLY", value) for name, value in kwargs.items()]
