"""Compare a public API's signature with the reference library's, recorded as text.

Each compat test records the reference's parameter list as it reads in the reference's
source (``"(input, weight, eps=1e-6, out=None, enable_pdl=None)"``) with the commit it was
read at. Names, order, kinds (positional, keyword-only, ``*args``, ``**kwargs``) and
defaults must match; annotations are not compared.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable


def _parse(params: str) -> inspect.Signature:
    namespace: dict[str, Any] = {}
    exec(f"def reference{params}: pass", {"torch": None}, namespace)  # noqa: S102 - test data
    return inspect.signature(namespace["reference"])


def _describe(param: inspect.Parameter) -> tuple[str, str, str]:
    default = "<required>" if param.default is inspect.Parameter.empty else repr(param.default)
    return param.name, param.kind.name, default


def assert_signature(func: Callable[..., Any], reference_params: str) -> None:
    """Fails with a per-parameter diff when ``func``'s parameters differ from the text."""
    ours = [_describe(p) for p in inspect.signature(func).parameters.values()]
    theirs = [_describe(p) for p in _parse(reference_params).parameters.values()]
    if ours != theirs:
        lines = [f"{getattr(func, '__qualname__', func)}: signature differs from the reference"]
        for i in range(max(len(ours), len(theirs))):
            a = ours[i] if i < len(ours) else None
            b = theirs[i] if i < len(theirs) else None
            mark = "  " if a == b else "!!"
            lines.append(f"{mark} ours={a} reference={b}")
        raise AssertionError("\n".join(lines))
