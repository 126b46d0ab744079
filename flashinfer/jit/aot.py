"""Ahead-of-time layers: read-only dirs of precompiled modules, searched before the JIT.

A layer holds ``<uri>/<uri>.so`` and ``<uri>/aot.json`` per module. Layers come from
FLASHINFER_AOT_DIR (an os.pathsep list) and from an installed ``flashinfer_aot``
package's ``modules/`` dir. A module is taken from a layer without a compiler, without
nvcc on PATH, when its record matches this process: flashinfer and tvm-ffi versions,
the build-affecting settings (debug, lineinfo, device print, extra flags), archs that
cover the visible GPUs (or FLASHINFER_CUDA_ARCH_LIST), and the content of any recorded
source that exists here (an edited kernel falls through to the JIT). The library itself
must match its recorded size and sha256 (see verify.py); a damaged one is skipped with a
warning.

``precompile`` builds every registered specialization for the given archs through one
ninja invocation (one subninja per module) and publishes each module into the layer.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..config import config
from ..version import __version__
from .arch import CudaArch, NoTargetArchError, parse_arch_list
from .builder import record_manifest, run_ninja
from .fileutil import sha256_file
from .manifest import FileRecord, Manifest
from .toolchain import nvcc_arch_problem
from .verify import library_problem

logger = logging.getLogger("flashinfer.jit")

AOT_RECORD = "aot.json"
_FORMAT = 2


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


def _wanted_archs() -> list[str] | None:
    """Archs the layer must cover: the arch list, else the visible GPUs, else no constraint."""
    if config.cuda_arch_list:
        return [str(a) for a in parse_arch_list(config.cuda_arch_list)]
    import torch

    if torch.cuda.is_available():
        return [f"{major}.{minor}" for major, minor in
                (torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))]
    return None


def _covers(built: list[str], wanted: list[str]) -> bool:
    # A GPU of capability 9.0 runs sm_90 and sm_90a code; an explicit "9.0a" needs "9.0a".
    return all(w in built or (w[-1].isdigit() and f"{w}a" in built) for w in wanted)


def find(uri: str) -> Path | None:
    """The library of ``uri`` from the first AOT layer whose record matches, else None."""
    layers = aot_dirs()
    if not layers:
        return None
    import tvm_ffi

    for layer in layers:
        record_path = layer / uri / AOT_RECORD
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        wanted = _wanted_archs()
        problem = (
            "record format" if record.get("format") != _FORMAT else
            "flashinfer version" if record.get("flashinfer") != __version__ else
            "tvm-ffi version" if record.get("tvm_ffi") != tvm_ffi.__version__ else
            "build settings" if record.get("settings") != build_settings() else
            "archs" if wanted is not None and not _covers(record.get("archs", []), wanted) else
            _changed_source(record.get("inputs", {}))
        )
        if problem:
            logger.debug("AOT layer %s: %s differs (%s); not used", layer, uri, problem)
            continue
        library = layer / uri / f"{uri}.so"
        damage = _library_damage(library, record.get("library"))
        if damage is None:
            return library
        logger.warning("AOT layer %s: not using %s: %s (precompile the layer again)",
                       layer, uri, damage)
    return None


def _library_damage(library: Path, recorded: Any, rehash: bool = False) -> str | None:
    try:
        size, sha = int(recorded["size"]), str(recorded["sha256"])
    except (TypeError, KeyError, ValueError):
        return "its record has no library size and sha256"
    return library_problem(library, size, sha, rehash=rehash)


def verify_layers(layers: Iterable[Path] | None = None) -> dict[Path, str | None]:
    """Every AOT library -> None when its bytes match the record, else the problem
    (hashes each file, ignoring memos)."""
    found: dict[Path, str | None] = {}
    for layer in aot_dirs() if layers is None else layers:
        for record_path in sorted(Path(layer).glob(f"*/{AOT_RECORD}")):
            uri = record_path.parent.name
            try:
                record = json.loads(record_path.read_text())
                recorded = record.get("library") if isinstance(record, dict) else None
            except (OSError, ValueError):
                recorded = None
            library = record_path.parent / f"{uri}.so"
            found[library] = _library_damage(library, recorded, rehash=True)
    return found


def _changed_source(inputs: dict[str, list[Any]]) -> str | None:
    present = {p: FileRecord(*r) for p, r in inputs.items() if os.path.exists(p)}
    changed, _ = Manifest({}, "", present).changed_inputs()
    return f"{changed[0]} changed" if changed else None


@dataclass(frozen=True)
class PrecompileResult:
    published: list[Path]  # the libraries now in the layer
    skipped: dict[str, str]  # module -> why it cannot target any of the requested archs


def precompile(out_dir: Path, archs: str | Iterable[CudaArch], ops: Iterable[str] | None = None
               ) -> PrecompileResult:
    """Build every specialization of ``ops`` for ``archs`` into the layer ``out_dir``. A
    module that supports none of ``archs`` (decode needs sm_80+) is skipped and reported;
    one that supports some of them is built for those."""
    from .registry import specs_for

    arch_list = parse_arch_list(archs, "--arch") if isinstance(archs, str) else tuple(archs)
    for arch in arch_list:
        problem = nvcc_arch_problem(arch)
        if problem is not None:
            raise ValueError(f"--arch: {problem}")
    specs = specs_for(ops)
    supported = []
    skipped: dict[str, str] = {}
    for spec in specs:
        try:
            supported.append((spec, spec.plan(arch_list)))
        except NoTargetArchError as err:
            skipped[spec.name] = str(err)
    if not supported:
        raise ValueError("no requested module can target "
                         f"{' '.join(str(a) for a in arch_list)}: {', '.join(skipped)}")
    out_dir = Path(out_dir)
    staging = out_dir / f".precompile-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        plans = []
        top = ["ninja_required_version = 1.10"]
        for spec, plan in supported:
            plan = type(plan)(plan.archs, plan.toolchain,
                              _prefixed(plan.ninja, f"{spec.name}/"), plan.identity,
                              plan.digest, plan.build_dir)
            (staging / spec.name).mkdir()
            (staging / spec.name / "build.ninja").write_text(plan.ninja.render())
            top.append(f"subninja {spec.name}/build.ninja")
            plans.append((spec, plan))
        top.append("build all: phony " + " ".join(p.ninja.target for _, p in plans))
        (staging / "build.ninja").write_text("\n".join(top) + "\n")
        logger.info("precompiling %d module(s) for %s into %s", len(plans),
                    " ".join(f"sm_{a.sm}" for a in arch_list), out_dir)
        run_ninja(staging, f"{len(plans)} modules", targets=["all"],
                  log_path=out_dir / "precompile.log")
        published = [_publish(out_dir, staging, spec, plan) for spec, plan in plans]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PrecompileResult(published, skipped)


def _prefixed(ninja: Any, prefix: str) -> Any:
    from dataclasses import replace

    return replace(ninja, prefix=prefix)


def _publish(out_dir: Path, staging: Path, spec: Any, plan: Any) -> Path:
    manifest = record_manifest(plan, spec.generated_sources, staging)
    fresh = out_dir / f".{spec.name}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    library = fresh / f"{spec.name}.so"
    os.replace(staging / plan.ninja.target, library)
    record = {
        "format": _FORMAT,
        "uri": spec.name,
        "flashinfer": __version__,
        "tvm_ffi": plan.identity["tvm_ffi"],
        "archs": [str(a) for a in plan.archs],
        "settings": build_settings(),
        "identity": plan.identity,
        "inputs": {p: [r.size, r.mtime_ns, r.sha256] for p, r in manifest.inputs.items()},
        "library": {"size": library.stat().st_size, "sha256": sha256_file(library)},
    }
    (fresh / AOT_RECORD).write_text(json.dumps(record, indent=1))
    target = out_dir / spec.name
    old = out_dir / f".{spec.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(fresh, target)
    shutil.rmtree(old, ignore_errors=True)
    return target / f"{spec.name}.so"
