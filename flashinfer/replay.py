"""Replays level-10 dumps: re-runs each call on its saved inputs and compares the results.

A dump is data that may come from anywhere, so replay runs only the library's own entry
points: the function a ``call.json`` names must carry ``@flashinfer_api`` (its
``API_MARKER``) and live in the ``flashinfer`` package or in a module the caller allows
explicitly (``allow_modules``; ``--allow-module`` on the command line). The module is
checked before it is imported, and the qualified name is looked up statically
(``inspect.getattr_static``) through classes only, so a refused dump imports, looks up
dynamically or calls nothing. Enum arguments resolve only to ``enum.Enum`` classes of the
same modules. Tensors load with ``torch.load(weights_only=True)`` or the safetensors
library, never through arbitrary unpickling.

Every dump gives exactly one row: a malformed ``call.json``, an unreadable tensor file or
an unknown function is an ERROR, a function or enum outside those rules is REFUSED, and
the run goes on with the next dump. A call whose dump has no outputs (it raised, or it
crashed the process) is re-run and reported without a comparison: that is how a crash is
reproduced from its dump.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from safetensors.torch import load_file as load_safetensors

from .api_logging import API_MARKER
from .dump import MANIFEST, tensors_equal

STATUSES = ("PASS", "FAIL", "ERROR", "REFUSED", "SKIP", "RAN")
FAILED = ("FAIL", "ERROR", "REFUSED")  # statuses that make the command exit with 1
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_TENSOR_FORMATS = ("pt", "safetensors")
_PARAM_KINDS = (
    "POSITIONAL_ONLY",
    "POSITIONAL_OR_KEYWORD",
    "VAR_POSITIONAL",
    "KEYWORD_ONLY",
    "VAR_KEYWORD",
)


@dataclass
class ReplayResult:
    directory: Path
    function: str
    status: str  # one of STATUSES; RAN: no saved outputs to compare with
    detail: str = ""


class _Unusable(Exception):
    """Ends one dump's replay; its row reports ``status`` and the message."""

    status = "ERROR"


class _Refused(_Unusable):
    status = "REFUSED"


class _Unreplayable(_Unusable):
    """A faithful dump that cannot be replayed here (an unsaved argument, no GPU)."""

    status = "SKIP"


class _Scope:
    """The modules whose ``@flashinfer_api`` functions and enums a replay may use."""

    def __init__(self, allow_modules: str | Sequence[str]) -> None:
        names = (allow_modules,) if isinstance(allow_modules, str) else tuple(allow_modules)
        for name in names:
            if not isinstance(name, str) or not _DOTTED.match(name):
                raise ValueError(f"allow_modules: {name!r} is not a module name to allow")
        self.modules = ("flashinfer", *names)

    def allows(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def __str__(self) -> str:
        return ", ".join(self.modules)


def check_tolerance(name: str, value: float | None) -> None:
    """``value`` is None or a finite number >= 0 (a ValueError naming ``name`` otherwise)."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _field(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise _Unusable(f"call.json: {where} has no {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise _Unusable(f"call.json: {where}: {key!r} is a {type(value).__name__}")
    return value


def _lookup(module: str, qualname: str, scope: _Scope, what: str) -> Any:
    """What ``qualname`` names in ``module``; the module is imported only when in scope."""
    if not _DOTTED.match(module):
        raise _Unusable(f"call.json: {what} module {module!r} is not a module name")
    if not scope.allows(module):
        raise _Refused(
            f"{what} {module}.{qualname} is outside the modules replay may use "
            f"({scope}; more with --allow-module)"
        )
    if "<locals>" in qualname:
        raise _Unreplayable(f"{qualname} is a local function; replay cannot import it")
    if not _DOTTED.match(qualname):
        raise _Unusable(f"call.json: {what} name {qualname!r} is not a qualified name")
    try:
        target: Any = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the import raised is this row's reason
        raise _Unusable(f"cannot import {module}: {type(err).__name__}: {err}") from None
    parts = qualname.split(".")
    for depth, part in enumerate(parts):
        if depth and not isinstance(target, type):
            raise _Refused(f"{what} {module}.{qualname}: {'.'.join(parts[:depth])} is not a class")
        try:
            target = inspect.getattr_static(target, part)
        except AttributeError:
            raise _Unusable(f"{module} has no {what} {qualname}") from None
    return target


def _resolve_api(function: Any, scope: _Scope) -> Callable[..., Any]:
    module = _field(function, "module", str, "function")
    qualname = _field(function, "qualname", str, "function")
    target = _lookup(module, qualname, scope, "function")
    if not (
        inspect.isfunction(target)
        and getattr(target, API_MARKER, False) is True
        and isinstance(target.__module__, str)
        and scope.allows(target.__module__)
    ):
        raise _Refused(f"{module}.{qualname} is not a @flashinfer_api function")
    return target


def _resolve_enum(entry: dict[str, Any], scope: _Scope, where: str) -> enum.Enum:
    module = _field(entry, "enum_module", str, where)
    qualname = _field(entry, "enum_qualname", str, where)
    member = _field(entry, "member", str, where)
    cls = _lookup(module, qualname, scope, f"{where}: enum")
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise _Refused(f"{where}: {module}.{qualname} is not an enum class")
    try:
        return cls[member]
    except KeyError:
        raise _Unusable(f"{where}: {module}.{qualname} has no member {member!r}") from None


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            tensors: Any = load_safetensors(str(path), device="cpu")
        else:
            tensors = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - a corrupt file is this row's reason
        raise _Unusable(
            f"{path.name} is unreadable ({type(err).__name__}: {_load_error(err)})"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise _Unusable(f"{path.name} does not hold named tensors")
    return tensors


def _load_error(err: Exception) -> str:
    """The reason in a loader's message (torch's weights-only refusal buries it)."""
    text = str(err).split("WeightsUnpickler error:", 1)[-1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:200] if lines else "empty or truncated"


def _place(tensor: torch.Tensor, device: str) -> torch.Tensor:
    try:
        target = torch.device(device)
    except RuntimeError:
        raise _Unusable(f"call.json: unknown device {device!r}") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise _Unreplayable(f"the call ran on {device}, and no GPU is visible")
    if target.type == "cuda" and (target.index or 0) >= torch.cuda.device_count():
        raise _Unreplayable(
            f"the call ran on {device}, and {torch.cuda.device_count()} GPU(s) are visible"
        )
    return tensor.to(target)


def _saved(tensors: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in tensors:
        raise _Unusable(f"the inputs file has no tensor {key!r}")
    return tensors[key]


def _argument(
    entry: dict[str, Any],
    where: str,
    tensors: dict[str, torch.Tensor],
    live: dict[str, torch.Tensor],
    scope: _Scope,
) -> Any:
    """One argument's value; tensors placed on their device are recorded in ``live``."""
    kind = _field(entry, "kind", str, where)
    if kind == "tensor":
        key = _field(entry, "key", str, where)
        live[key] = _place(_saved(tensors, key), _field(entry, "device", str, where))
        return live[key]
    if kind == "tensor_list":
        keys = _field(entry, "keys", list, where)
        if not all(isinstance(k, str) for k in keys):
            raise _Unusable(f"call.json: {where}: 'keys' holds a non-string")
        if "devices" not in entry:
            raise _Unreplayable(f"{where}: its tensors' devices were not recorded (an old dump)")
        devices = _field(entry, "devices", list, where)
        if len(devices) != len(keys) or not all(isinstance(d, str) for d in devices):
            raise _Unusable(f"call.json: {where}: 'devices' does not match 'keys'")
        for key, device in zip(keys, devices):
            live[key] = _place(_saved(tensors, key), device)
        items = [live[key] for key in keys]
        return tuple(items) if entry.get("sequence") == "tuple" else items
    if kind == "value":
        if "value" not in entry:
            raise _Unusable(f"call.json: {where} has no 'value'")
        return entry["value"]
    if kind == "enum":
        return _resolve_enum(entry, scope, where)
    if kind == "unsupported":
        raise _Unreplayable(f"{where} was not saved ({entry.get('repr', '')})")
    raise _Unusable(f"call.json: {where} has an unknown kind {kind!r}")


def _build_call(
    entries: list[Any], tensors: dict[str, torch.Tensor], scope: _Scope
) -> tuple[list[Any], dict[str, Any], dict[str, torch.Tensor]]:
    """Positional args, keyword args, and key -> the live tensor passed in."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    live: dict[str, torch.Tensor] = {}
    for index, entry in enumerate(entries):
        name = _field(entry, "name", str, f"argument {index}")
        where = f"argument {name!r}"
        value = _argument(entry, where, tensors, live, scope)
        param_kind = entry.get("param_kind", "POSITIONAL_OR_KEYWORD")
        if param_kind not in _PARAM_KINDS:
            raise _Unusable(f"call.json: {where} has an unknown param_kind {param_kind!r}")
        if param_kind == "POSITIONAL_ONLY":
            args.append(value)
        elif param_kind == "VAR_POSITIONAL":
            if not isinstance(value, (list, tuple)):
                raise _Unusable(f"call.json: {where} (*args) is not a sequence")
            args.extend(value)
        elif param_kind == "VAR_KEYWORD":
            if not isinstance(value, dict):
                raise _Unusable(f"call.json: {where} (**kwargs) is not a mapping")
            kwargs.update(value)
        else:
            kwargs[name] = value
    return args, kwargs, live


def _compare(
    expected: torch.Tensor, actual: Any, rtol: float | None, atol: float | None
) -> str | None:
    """None when they match; else what differs."""
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor, got {type(actual).__name__}"
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (
            f"shape/dtype {tuple(actual.shape)}/{actual.dtype}, "
            f"expected {tuple(expected.shape)}/{expected.dtype}"
        )
    if rtol is None and atol is None:
        if tensors_equal(actual, expected):
            return None
    elif torch.allclose(
        actual.double(), expected.double(), rtol=rtol or 0.0, atol=atol or 0.0, equal_nan=True
    ):
        return None
    if actual.is_floating_point() or actual.is_complex():
        diff = (actual.double() - expected.double()).abs().nan_to_num(0.0)
        return f"max abs diff {diff.max().item():.3g}" if diff.numel() else "differs"
    return f"{int((actual != expected).sum().item())} elements differ"


def _produced(key: str, result: Any, live: dict[str, torch.Tensor]) -> Any:
    """What the replayed call produced for a saved output ``key``."""
    if key == "return":
        return result
    if key.startswith("return."):
        index = key.split(".", 1)[1]
        if isinstance(result, (list, tuple)) and index.isdigit() and int(index) < len(result):
            return result[int(index)]
        return None
    return live.get(key.removeprefix("mutated."))


def _label(manifest: Any) -> str:
    function = manifest.get("function") if isinstance(manifest, dict) else None
    if isinstance(function, dict) and all(
        isinstance(function.get(k), str) for k in ("module", "qualname")
    ):
        return f"{function['module']}.{function['qualname']}"
    return "?"


def _read_manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _Unusable(f"call.json is unreadable ({type(err).__name__}: {err})") from None
    if not isinstance(manifest, dict):
        raise _Unusable("call.json does not hold a JSON object")
    return manifest


def _replay_one(
    directory: Path, rtol: float | None, atol: float | None, scope: _Scope
) -> ReplayResult:
    function = "?"
    try:
        manifest = _read_manifest(directory)
        function = _label(manifest)
        func = _resolve_api(_field(manifest, "function", dict, "the call"), scope)
        dumped = _field(manifest, "status", str, "the call")
        tensor_format = manifest.get("tensor_format", "pt")
        if tensor_format not in _TENSOR_FORMATS:
            raise _Unusable(f"call.json: unknown tensor_format {tensor_format!r}")
        tensors = _load_tensors(directory / f"inputs.{tensor_format}")
        args, kwargs, live = _build_call(_field(manifest, "args", list, "the call"), tensors, scope)
    except _Unusable as err:
        return ReplayResult(directory, function, err.status, str(err))
    except Exception as err:  # noqa: BLE001 - a dump is untrusted data: its fault, its row
        return ReplayResult(
            directory, function, "ERROR", f"unusable dump ({type(err).__name__}: {err})"
        )
    try:
        result = func(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported, and the run goes on
        status = "RAN" if dumped == "raised" else "ERROR"
        return ReplayResult(directory, function, status, f"raised {type(err).__name__}: {err}")
    outputs_path = directory / f"outputs.{tensor_format}"
    if dumped != "completed" or not outputs_path.exists():
        return ReplayResult(directory, function, "RAN", f"no saved outputs (dump status: {dumped})")
    try:
        expected = _load_tensors(outputs_path)
    except _Unusable as err:
        return ReplayResult(directory, function, "ERROR", str(err))
    problems = []
    for key, tensor in expected.items():
        problem = _compare(tensor, _produced(key, result, live), rtol, atol)
        if problem:
            problems.append(f"{key}: {problem}")
    if problems:
        return ReplayResult(directory, function, "FAIL", "; ".join(problems))
    return ReplayResult(directory, function, "PASS", f"{len(expected)} tensors match")


def replay_call(
    directory: Path | str,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    allow_modules: str | Sequence[str] = (),
) -> ReplayResult:
    """Replay the one call dumped in ``directory``."""
    check_tolerance("rtol", rtol)
    check_tolerance("atol", atol)
    return _replay_one(Path(directory), rtol, atol, _Scope(allow_modules))


def replay(
    directory: Path | str,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    allow_modules: str | Sequence[str] = (),
) -> list[ReplayResult]:
    """Replay every call dumped under ``directory`` in call order, one row per dump.

    ``allow_modules``: modules (with their submodules) whose ``@flashinfer_api`` functions
    may run besides flashinfer's. A bad tolerance or module name raises ValueError before
    anything runs; a directory without dumps, FileNotFoundError."""
    check_tolerance("rtol", rtol)
    check_tolerance("atol", atol)
    scope = _Scope(allow_modules)
    root = Path(directory)
    if (root / MANIFEST).exists():
        calls = [root]
    else:
        calls = sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
    if not calls:
        raise FileNotFoundError(f"no dumped calls under {root}")
    return [_replay_one(call, rtol, atol, scope) for call in calls]


def format_results(results: list[ReplayResult]) -> str:
    rows = [("call", "function", "status", "detail")]
    rows += [(r.directory.name, r.function, r.status, " ".join(r.detail.split())) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    shown = [f"{n} {s.lower()}" for s, n in counts.items() if n or s in ("PASS", "FAIL")]
    lines.append(", ".join(shown))
    return "\n".join(lines)
