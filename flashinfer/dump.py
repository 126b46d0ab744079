"""Level-10 API logging: each call's tensors on disk, inputs before the call runs.

One directory per call, ``<dump dir>/<call index>_<pid>_<api name>/``, holding

- ``call.json``: the function's module and qualified name (so replay can import it),
  the call index, pid, every argument (tensor metadata, the value when it is plain data,
  the class and member of an enum), the status (``inputs_saved``, then ``completed`` or ``raised``);
- ``inputs.pt`` / ``inputs.safetensors``: the tensor arguments, copied before the call;
- ``outputs.pt`` / ``outputs.safetensors``: returned tensors (``return``, ``return.0``...)
  and inputs the call changed in place (``mutated.<name>``).

``.pt`` keeps each tensor's strides; ``.safetensors`` (FLASHINFER_DUMP_SAFETENSORS=1, written
by the safetensors library) holds contiguous copies. ``call.json`` is replaced atomically, so
a reader never sees half a manifest.

Dumping never breaks the call: past FLASHINFER_DUMP_MAX_COUNT or _MAX_SIZE_GB, or when
the dump directory cannot be written (an OS error: not a directory, no permission, disk
full), dumps stop with a single warning; any other error skips that call's dump with a
warning. Calls made during CUDA graph capture are not dumped (copying to the host would
invalidate the capture).
"""

from __future__ import annotations

import datetime
import enum
import fnmatch
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file as save_safetensors

from .arguments import Argument
from .config import config
from .jit.fileutil import atomic_write_text
from .logdest import safe_filename
from .tensor_format import graph_capture_in_progress

logger = logging.getLogger("flashinfer.dump")

MANIFEST = "call.json"
FORMAT = 1
_PLAIN = (type(None), bool, int, float, str)


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "stride": list(t.stride()),
    }


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    # clone: a CPU tensor's .cpu() is itself, and the call may change it in place
    return t.detach().to("cpu", copy=True)


@dataclass
class CallDump:
    directory: Path
    manifest: dict[str, Any]
    inputs: dict[str, torch.Tensor]  # key -> CPU copy taken before the call
    sources: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> live tensor


class Dumper:
    """Writes per-call dumps under ``directory`` within the count and size caps."""

    def __init__(
        self,
        directory: Path,
        include: tuple[str, ...] = (),
        exclude: tuple[str, ...] = (),
        max_count: int = 1000,
        max_bytes: float = 20e9,
        safetensors: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.include = include
        self.exclude = exclude
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.safetensors = safetensors
        self.count = 0
        self.bytes = 0
        self.stopped: str | None = None
        self._capture_warned = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls) -> Dumper:
        return cls(
            config.dump_dir,
            config.dump_include,
            config.dump_exclude,
            config.dump_max_count,
            config.dump_max_size_gb * 1e9,
            config.dump_safetensors,
        )

    @property
    def suffix(self) -> str:
        return ".safetensors" if self.safetensors else ".pt"

    def wants(self, func: Callable[..., Any]) -> bool:
        names = (func.__qualname__, func.__name__)
        if self.include and not any(fnmatch.fnmatchcase(n, p) for n in names for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(n, p) for n in names for p in self.exclude)

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            logger.warning("flashinfer dumps stopped: %s", reason)

    def _failed(self, err: Exception, what: str) -> None:
        """An unwritable dump directory stops dumps (one warning, not one per call); a name
        taken by an earlier process (pids are reused) or another error skips this dump."""
        if isinstance(err, OSError) and not isinstance(err, FileExistsError):
            self._stop(
                f"cannot write to FLASHINFER_DUMP_DIR={self.directory} "
                f"({type(err).__name__}: {err}); the calls run without dumps"
            )
        else:
            logger.warning("flashinfer %s failed: %s", what, err)

    def _save(self, tensors: dict[str, torch.Tensor], path: Path) -> int:
        """Write ``tensors``; returns the bytes written. ``.pt`` keeps strides; safetensors
        stores contiguous data only."""
        if self.safetensors:
            save_safetensors({k: t.contiguous() for k, t in tensors.items()}, str(path))
        else:
            torch.save(tensors, path)
        return path.stat().st_size

    def dump_inputs(self, func: Callable[..., Any], arguments: list[Argument]) -> CallDump | None:
        """Save the call's tensors and manifest before it runs. ``arguments`` holds
        (name, parameter kind, value) triples. Returns None when this call is not dumped."""
        if self.stopped or not self.wants(func):
            return None
        if graph_capture_in_progress():  # a device-to-host copy would break the capture
            if not self._capture_warned:
                self._capture_warned = True
                logger.warning("flashinfer dumps skip calls made during CUDA graph capture")
            return None
        try:
            with self._lock:
                if self.count >= self.max_count:
                    self._stop(f"FLASHINFER_DUMP_MAX_COUNT={self.max_count} calls dumped")
                    return None
                inputs: dict[str, torch.Tensor] = {}
                sources: dict[str, torch.Tensor] = {}
                args_meta = []
                for name, kind, value in arguments:
                    entry: dict[str, Any] = {"name": name, "param_kind": kind}
                    if isinstance(value, torch.Tensor):
                        entry.update(kind="tensor", key=name, **_tensor_meta(value))
                        inputs[name], sources[name] = _snapshot(value), value
                    elif (
                        isinstance(value, (list, tuple))
                        and value
                        and all(isinstance(v, torch.Tensor) for v in value)
                    ):
                        keys = [f"{name}.{i}" for i in range(len(value))]
                        entry.update(
                            kind="tensor_list",
                            keys=keys,
                            sequence=type(value).__name__,
                            devices=[str(v.device) for v in value],
                        )
                        for key, tensor in zip(keys, value):
                            inputs[key], sources[key] = _snapshot(tensor), tensor
                    elif _is_plain(value):
                        entry.update(kind="value", value=value)
                    elif isinstance(value, enum.Enum):
                        cls = type(value)
                        entry.update(
                            kind="enum",
                            enum_module=cls.__module__,
                            enum_qualname=cls.__qualname__,
                            member=value.name,
                        )
                    else:
                        entry.update(kind="unsupported", repr=repr(value)[:200])
                    args_meta.append(entry)
                size = sum(t.numel() * t.element_size() for t in inputs.values())
                if self.bytes + size > self.max_bytes:
                    self._stop(
                        f"FLASHINFER_DUMP_MAX_SIZE_GB={self.max_bytes / 1e9:g} would be exceeded"
                    )
                    return None
                index = self.count
                self.count += 1
                directory = self.directory / safe_filename(
                    f"{index:06d}_{os.getpid()}_{func.__qualname__}"
                )
                directory.mkdir(parents=True, exist_ok=False)
                manifest = {
                    "format": FORMAT,
                    "function": {"module": func.__module__, "qualname": func.__qualname__},
                    "call_index": index,
                    "pid": os.getpid(),
                    "timestamp": datetime.datetime.now().isoformat(timespec="milliseconds"),
                    "tensor_format": self.suffix.lstrip("."),
                    "args": args_meta,
                    "status": "inputs_saved",
                }
                self.bytes += self._save(inputs, directory / f"inputs{self.suffix}")
                _write_manifest(directory, manifest)
                return CallDump(directory, manifest, inputs, sources)
        except Exception as err:  # never break the user's call
            self._failed(err, f"dump of {func.__qualname__}")
            return None

    def dump_outputs(self, call: CallDump, result: Any) -> None:
        try:
            outputs: dict[str, torch.Tensor] = {}
            if isinstance(result, torch.Tensor):
                outputs["return"] = _snapshot(result)
            elif isinstance(result, (list, tuple)):
                for i, item in enumerate(result):
                    if isinstance(item, torch.Tensor):
                        outputs[f"return.{i}"] = _snapshot(item)
            for key, live in call.sources.items():
                after = _snapshot(live)
                if not tensors_equal(after, call.inputs[key]):
                    outputs[f"mutated.{key}"] = after
            with self._lock:
                self.bytes += self._save(outputs, call.directory / f"outputs{self.suffix}")
            call.manifest["outputs"] = {k: _tensor_meta(v) for k, v in outputs.items()}
            call.manifest["returned"] = _describe_return(result)
            call.manifest["status"] = "completed"
            _write_manifest(call.directory, call.manifest)
        except Exception as err:
            self._failed(err, f"dump of outputs to {call.directory}")

    def dump_exception(self, call: CallDump, exc: BaseException) -> None:
        try:
            call.manifest["status"] = "raised"
            call.manifest["exception"] = f"{type(exc).__name__}: {exc}"[:2000]
            _write_manifest(call.directory, call.manifest)
        except Exception as err:
            self._failed(err, f"dump of an exception to {call.directory}")


def _describe_return(result: Any) -> str:
    if result is None:
        return "none"
    if isinstance(result, torch.Tensor):
        return "tensor"
    if isinstance(result, (list, tuple)):
        return "sequence"
    return "other"


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and values, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return False


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1, default=str))
