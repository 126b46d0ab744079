"""Replays level-10 dumps: re-runs each call on its saved inputs and compares the results.

Tensors load with ``torch.load(weights_only=True)`` or the safetensors reader, never
through arbitrary unpickling. A call whose dump has no outputs (it raised, or it crashed
the process) is re-run and reported without a comparison: that is how a crash is
reproduced from its dump.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import safetensors_io
from .dump import MANIFEST, tensors_equal


@dataclass
class ReplayResult:
    directory: Path
    function: str
    status: str  # PASS, FAIL, SKIP, ERROR, RAN (no saved outputs to compare with)
    detail: str = ""


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return safetensors_io.load_file(path)[0]
    return torch.load(path, weights_only=True, map_location="cpu")


def _resolve(module: str, qualname: str) -> Callable[..., Any]:
    if "<locals>" in qualname:
        raise LookupError(f"{qualname} is a local function; replay cannot import it")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _place(tensor: torch.Tensor, device: str) -> torch.Tensor:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"the call ran on {device}, and no GPU is visible")
    return tensor.to(device)


def _build_call(manifest: dict[str, Any], tensors: dict[str, torch.Tensor]
                ) -> tuple[list[Any], dict[str, Any], dict[str, torch.Tensor]]:
    """Positional args, keyword args, and key -> the live tensor passed in."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    live: dict[str, torch.Tensor] = {}
    for entry in manifest["args"]:
        kind = entry["kind"]
        if kind == "tensor":
            value: Any = _place(tensors[entry["key"]], entry["device"])
            live[entry["key"]] = value
        elif kind == "tensor_list":
            items = []
            for key in entry["keys"]:
                items.append(_place(tensors[key], str(tensors[key].device)))
                live[key] = items[-1]
            value = tuple(items) if entry.get("sequence") == "tuple" else items
        elif kind == "value":
            value = entry["value"]
        elif kind == "enum":
            value = getattr(_resolve(entry["enum_module"], entry["enum_qualname"]),
                            entry["member"])
        else:
            raise LookupError(f"argument {entry['name']} was not saved ({entry.get('repr', '')})")
        param_kind = entry.get("param_kind", "POSITIONAL_OR_KEYWORD")
        if param_kind == "POSITIONAL_ONLY":
            args.append(value)
        elif param_kind == "VAR_POSITIONAL":
            args.extend(value)
        elif param_kind == "VAR_KEYWORD":
            kwargs.update(value)
        else:
            kwargs[entry["name"]] = value
    return args, kwargs, live


def _compare(expected: torch.Tensor, actual: Any, rtol: float | None, atol: float | None
             ) -> str | None:
    """None when they match; else what differs."""
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor, got {type(actual).__name__}"
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (f"shape/dtype {tuple(actual.shape)}/{actual.dtype}, "
                f"expected {tuple(expected.shape)}/{expected.dtype}")
    if rtol is None and atol is None:
        if tensors_equal(actual, expected):
            return None
    elif torch.allclose(actual.double(), expected.double(), rtol=rtol or 0.0, atol=atol or 0.0,
                        equal_nan=True):
        return None
    if actual.is_floating_point() or actual.is_complex():
        diff = (actual.double() - expected.double()).abs().nan_to_num(0.0)
        return f"max abs diff {diff.max().item():.3g}" if diff.numel() else "differs"
    return f"{int((actual != expected).sum().item())} elements differ"


def replay_call(directory: Path, rtol: float | None = None, atol: float | None = None
                ) -> ReplayResult:
    manifest = json.loads((directory / MANIFEST).read_text())
    function = f"{manifest['function']['module']}.{manifest['function']['qualname']}"
    try:
        func = _resolve(manifest["function"]["module"], manifest["function"]["qualname"])
        suffix = "." + manifest.get("tensor_format", "pt")
        tensors = _load_tensors(directory / f"inputs{suffix}")
        args, kwargs, live = _build_call(manifest, tensors)
    except (LookupError, ImportError, AttributeError, RuntimeError, KeyError) as err:
        return ReplayResult(directory, function, "SKIP", str(err))
    try:
        result = func(*args, **kwargs)
    except Exception as err:
        status = "RAN" if manifest["status"] == "raised" else "ERROR"
        return ReplayResult(directory, function, status, f"raised {type(err).__name__}: {err}")
    outputs_path = directory / f"outputs{suffix}"
    if manifest["status"] != "completed" or not outputs_path.exists():
        return ReplayResult(directory, function, "RAN",
                            f"no saved outputs (dump status: {manifest['status']})")
    expected = _load_tensors(outputs_path)
    problems = []
    for key, tensor in expected.items():
        if key == "return":
            actual = result
        elif key.startswith("return."):
            index = int(key.split(".", 1)[1])
            actual = result[index] if isinstance(result, (list, tuple)) else None
        else:
            actual = live.get(key.removeprefix("mutated."))
        problem = _compare(tensor, actual, rtol, atol)
        if problem:
            problems.append(f"{key}: {problem}")
    if problems:
        return ReplayResult(directory, function, "FAIL", "; ".join(problems))
    return ReplayResult(directory, function, "PASS", f"{len(expected)} tensors match")


def replay(directory: Path | str, rtol: float | None = None, atol: float | None = None
           ) -> list[ReplayResult]:
    """Replay every call dumped under ``directory`` in call order."""
    root = Path(directory)
    if (root / MANIFEST).exists():
        calls = [root]
    else:
        calls = sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
    if not calls:
        raise FileNotFoundError(f"no dumped calls under {root}")
    return [replay_call(call, rtol, atol) for call in calls]


def format_results(results: list[ReplayResult]) -> str:
    rows = [("call", "function", "status", "detail")]
    rows += [(r.directory.name, r.function, r.status, r.detail) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3] for row in rows]
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "ERROR", "SKIP", "RAN")}
    lines.append(", ".join(f"{n} {s.lower()}" for s, n in counts.items() if n or s in ("PASS", "FAIL")))
    return "\n".join(lines)
