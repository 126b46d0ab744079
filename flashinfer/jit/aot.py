"""Ahead-of-time layers: read-only dirs of precompiled modules, searched before the JIT.

A layer holds ``<uri>/<uri>.so`` and ``<uri>/aot.json`` per module. Layers come from
FLASHINFER_AOT_DIR (an os.pathsep list), from an installed ``flashinfer_aot`` package's
``modules/`` dir, and last from the download dir (FLASHINFER_CUBIN_DIR), where
``remote.py`` publishes the modules of a repository. A module is taken from a layer
without a compiler, without nvcc on PATH, when its record matches this process:
flashinfer and tvm-ffi versions, the build-affecting settings (debug, lineinfo, device
print, extra flags), archs that cover the visible GPUs (or FLASHINFER_CUDA_ARCH_LIST), and
the content of any recorded source that exists here (an edited kernel falls through to
the JIT). The library itself must match its recorded size and sha256 (see verify.py); a
damaged one is skipped with a warning.

Layers are written by ``precompile.py`` (the download dir by ``remote.py``); this module
only reads them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from ..config import config
from ..version import __version__
from . import env
from .arch import CudaArch, covers, parse_arch_list, visible_capabilities
from .manifest import FileRecord, Manifest
from .verify import library_problem

logger = logging.getLogger("flashinfer.jit")

AOT_RECORD = "aot.json"
RECORD_FORMAT = 2


@functools.cache
def _package_layer() -> Path | None:
    spec = importlib.util.find_spec("flashinfer_aot")
    if spec is None or not spec.submodule_search_locations:
        return None
    layer = Path(next(iter(spec.submodule_search_locations))) / "modules"
    return layer if layer.is_dir() else None


def aot_dirs() -> list[Path]:
    layers = list(config.aot_dir)
    package = _package_layer()
    if package is not None:
        layers.append(package)
    downloads = env.cubin_dir()
    if downloads.is_dir() and downloads not in layers:
        layers.append(downloads)
    return layers


def build_settings() -> dict[str, Any]:
    """The settings that change a binary and are known without a compiler."""
    return {
        "debug": config.jit_debug,
        "lineinfo": config.jit_lineinfo,
        "device_print": config.jit_device_print,
        "extra_cflags": list(config.extra_cflags),
        "extra_cudaflags": list(config.extra_cudaflags),
        "extra_ldflags": list(config.extra_ldflags),
    }


@dataclass(frozen=True)
class AotRecord:
    """``aot.json``: what a layer's module was built from and for, and its library."""

    uri: str
    flashinfer: str
    tvm_ffi: str
    archs: tuple[CudaArch, ...]
    settings: dict[str, Any]
    identity: dict[str, Any]
    inputs: dict[str, FileRecord]
    library_size: int
    library_sha256: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": RECORD_FORMAT,
                "uri": self.uri,
                "flashinfer": self.flashinfer,
                "tvm_ffi": self.tvm_ffi,
                "archs": [str(a) for a in self.archs],
                "settings": self.settings,
                "identity": self.identity,
                "inputs": {p: [r.size, r.mtime_ns, r.sha256] for p, r in self.inputs.items()},
                "library": {"size": self.library_size, "sha256": self.library_sha256},
            },
            indent=1,
        )

    @classmethod
    def load(cls, path: Path) -> AotRecord | None:
        """The record at ``path``; None when missing, of another format or malformed."""
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
                return None
            library = data["library"]
            return cls(
                uri=str(data["uri"]),
                flashinfer=str(data["flashinfer"]),
                tvm_ffi=str(data["tvm_ffi"]),
                archs=tuple(CudaArch.parse(str(a)) for a in data["archs"]),
                settings=dict(data["settings"]),
                identity=dict(data["identity"]),
                inputs={str(p): FileRecord.parse(r) for p, r in data["inputs"].items()},
                library_size=int(library["size"]),
                library_sha256=str(library["sha256"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


class BuiltFor(Protocol):
    """What a precompiled module records about its build (an ``AotRecord``, or its entry
    in a repository index)."""

    flashinfer: str
    tvm_ffi: str
    archs: tuple[CudaArch, ...]
    settings: dict[str, Any]


@dataclass(frozen=True)
class Target:
    """What a precompiled module must have been built for to serve this process."""

    listed: tuple[CudaArch, ...] | None  # explicit archs; None: the visible GPUs
    capabilities: tuple[tuple[int, int], ...]
    settings: dict[str, Any]
    tvm_ffi: str

    @classmethod
    def current(cls, archs: Sequence[CudaArch] | None = None) -> Target:
        """This process's target; ``archs`` replaces FLASHINFER_CUDA_ARCH_LIST and the GPUs."""
        import tvm_ffi

        listed = (
            tuple(archs)
            if archs is not None
            else parse_arch_list(config.cuda_arch_list)
            if config.cuda_arch_list
            else None
        )
        capabilities = visible_capabilities() if listed is None else ()
        return cls(listed, capabilities, build_settings(), tvm_ffi.__version__)

    def mismatch(self, built: BuiltFor) -> str | None:
        """What of ``built`` differs from this target (e.g. "archs"), or None."""
        if built.flashinfer != __version__ and not config.disable_version_check:
            return "flashinfer version"
        if built.tvm_ffi != self.tvm_ffi:
            return "tvm-ffi version"
        if built.settings != self.settings:
            return "build settings"
        if not covers(built.archs, self.listed, self.capabilities):
            return "archs"
        return None


def find(uri: str) -> Path | None:
    """The library of ``uri`` from the first AOT layer whose record matches, else None."""
    layers = aot_dirs()
    if not layers:
        return None
    target = Target.current()
    for layer in layers:
        library = layer_library(layer, uri, target)
        if library is not None:
            return library
    return None


def layer_library(layer: Path, uri: str, target: Target) -> Path | None:
    """The library of ``uri`` in ``layer`` when its record matches ``target`` and its
    sources here, and its bytes match the record; else None (a damaged one with a warning)."""
    record = AotRecord.load(layer / uri / AOT_RECORD)
    if record is None:
        return None
    problem = target.mismatch(record) or _changed_source(record.inputs)
    if problem:
        logger.debug("AOT layer %s: %s differs (%s); not used", layer, uri, problem)
        return None
    library = layer / uri / f"{uri}.so"
    damage = library_problem(library, record.library_size, record.library_sha256)
    if damage is None:
        return library
    logger.warning(
        "AOT layer %s: not using %s: %s (%s)",
        layer,
        uri,
        damage,
        "downloaded again if a repository is set"
        if layer == env.cubin_dir()
        else "precompile the layer again",
    )
    return None


def verify_layers(layers: Iterable[Path] | None = None) -> dict[Path, str | None]:
    """Every AOT library -> None when its bytes match the record, else the problem
    (hashes each file, ignoring memos)."""
    found: dict[Path, str | None] = {}
    for layer in aot_dirs() if layers is None else layers:
        for record_path in sorted(Path(layer).glob(f"*/{AOT_RECORD}")):
            if record_path.parent.name.startswith("."):
                continue  # a module being published or downloaded
            library = record_path.parent / f"{record_path.parent.name}.so"
            record = AotRecord.load(record_path)
            found[library] = (
                "its record is unreadable or from another format"
                if record is None
                else library_problem(
                    library, record.library_size, record.library_sha256, rehash=True
                )
            )
    return found


def _changed_source(inputs: dict[str, FileRecord]) -> str | None:
    present = {p: r for p, r in inputs.items() if os.path.exists(p)}
    changed, _ = Manifest({}, "", present).changed_inputs()
    return f"{changed[0]} changed" if changed else None
