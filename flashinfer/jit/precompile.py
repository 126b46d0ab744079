"""``python -m flashinfer precompile``: builds every registered specialization for the given
archs through one ninja invocation (one subninja per module) and publishes each module, with
its record, into an AOT layer (read by ``aot.py``). The layer's repository index is then
rewritten, so the same dir can be served as a module repository (read by ``remote.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator

from ..version import __version__
from .aot import AOT_RECORD, AotRecord, build_settings
from .arch import CudaArch, NoTargetArchError, parse_arch_list
from .builder import record_manifest, run_ninja
from .core import JitSpec
from .fileutil import atomic_write_text, sha256_file
from .plan import BuildPlan
from .registry import registered_ops, specs_for
from .remote import REPOSITORY_INDEX, IndexEntry, RepositoryIndex
from .toolchain import nvcc_arch_problem

logger = logging.getLogger("flashinfer.jit")


@dataclass(frozen=True)
class PrecompileResult:
    published: list[Path]  # the libraries now in the layer
    skipped: dict[str, str]  # module -> why it cannot target any of the requested archs


def precompile(
    out_dir: Path,
    archs: str | Iterable[CudaArch],
    ops: Iterable[str] | None = None,
    *,
    extra: Iterable[tuple[str, JitSpec]] = (),
) -> PrecompileResult:
    """Build every specialization of ``ops`` for ``archs`` into the layer ``out_dir``. A
    module that supports none of ``archs`` (decode needs sm_80+) is skipped and reported;
    one that supports some of them is built for those. ``extra``: (op, spec) pairs of
    modules no op registers (a prefill tiling that is not a default, say), built along.
    A module that fails to build (or an interrupt) does not cost the others: the modules
    that built are published and indexed, then the error is raised."""
    arch_list = parse_arch_list(archs, "--arch") if isinstance(archs, str) else tuple(archs)
    for arch in arch_list:
        problem = nvcc_arch_problem(arch)
        if problem is not None:
            raise ValueError(f"--arch: {problem}")
    names = list(registered_ops()) if ops is None else list(ops)
    specs = specs_for(names)
    op_of = {spec.name: op for op in names for spec in specs_for([op])}
    for op, spec in extra:
        if spec.name not in op_of:  # a registered module is built once
            op_of[spec.name] = op
            specs.append(spec)
    supported = []
    skipped: dict[str, str] = {}
    for spec in specs:
        try:
            supported.append((spec, spec.plan(arch_list)))
        except NoTargetArchError as err:
            skipped[spec.name] = str(err)
    if not supported:
        raise ValueError(
            "no requested module can target "
            f"{' '.join(str(a) for a in arch_list)}: {', '.join(skipped)}"
        )
    out_dir = Path(out_dir)
    staging = out_dir / f".precompile-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        plans = []
        top = ["ninja_required_version = 1.10"]
        for spec, plan in supported:
            plan = replace(plan, ninja=replace(plan.ninja, prefix=f"{spec.name}/"))
            (staging / spec.name).mkdir()
            (staging / spec.name / "build.ninja").write_text(plan.ninja.render())
            top.append(f"subninja {spec.name}/build.ninja")
            plans.append((spec, plan))
        top.append("build all: phony " + " ".join(p.ninja.target for _, p in plans))
        (staging / "build.ninja").write_text("\n".join(top) + "\n")
        logger.info(
            "precompiling %d module(s) for %s into %s",
            len(plans),
            " ".join(f"sm_{a.sm}" for a in arch_list),
            out_dir,
        )
        failure: BaseException | None = None
        try:
            run_ninja(
                staging,
                f"{len(plans)} modules",
                targets=["all"],
                log_path=out_dir / "precompile.log",
                keep_going=True,
            )
        except BaseException as err:  # a failed module or an interrupt: keep what built
            failure = err
        # The link writes a temp file renamed onto the target: one that exists is whole.
        built = [(spec, plan) for spec, plan in plans if (staging / plan.ninja.target).exists()]
        with _interrupts_deferred():  # a second interrupt must not drop built modules
            published = [_publish(out_dir, staging, spec, plan) for spec, plan in built]
            write_index(out_dir, {spec.name: op_of[spec.name] for spec, _ in built})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if failure is not None:
        logger.warning(
            "precompile: %d of %d module(s) built and published into %s; the rest did not: %s",
            len(built),
            len(plans),
            out_dir,
            " ".join(sorted({spec.name for spec, _ in plans} - {spec.name for spec, _ in built})),
        )
        raise failure
    return PrecompileResult(published, skipped)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block act when it ends (in this thread)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_index(out_dir: Path, ops: dict[str, str]) -> RepositoryIndex:
    """Rewrite the layer's repository index from the modules in it, so a precompile into an
    existing layer keeps the others: ``ops`` gives the op of modules just published, the
    others keep the op the previous index gave them. Written atomically."""
    previous = RepositoryIndex.load(out_dir / REPOSITORY_INDEX)
    op_of = {uri: entry.op for uri, entry in previous.modules.items()} if previous else {}
    op_of.update(ops)
    entries = {}
    for record in sorted(out_dir.glob(f"*/{AOT_RECORD}")):
        if record.parent.name.startswith("."):
            continue  # a module being published
        entry = IndexEntry.of(record.parent, op_of.get(record.parent.name, ""))
        if entry is not None:
            entries[entry.uri] = entry
    index = RepositoryIndex(entries)
    atomic_write_text(out_dir / REPOSITORY_INDEX, index.to_json())
    return index


def _publish(out_dir: Path, staging: Path, spec: JitSpec, plan: BuildPlan) -> Path:
    manifest = record_manifest(plan, spec.generated_files(), staging)
    fresh = out_dir / f".{spec.name}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    library = fresh / f"{spec.name}.so"
    os.replace(staging / plan.ninja.target, library)
    record = AotRecord(
        uri=spec.name,
        flashinfer=__version__,
        tvm_ffi=plan.toolchain.tvm_ffi_version,
        archs=plan.archs,
        settings=build_settings(),
        identity=plan.identity,
        inputs=manifest.inputs,
        library_size=library.stat().st_size,
        library_sha256=sha256_file(library),
    )
    (fresh / AOT_RECORD).write_text(record.to_json())
    target = out_dir / spec.name
    old = out_dir / f".{spec.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(fresh, target)
    shutil.rmtree(old, ignore_errors=True)
    return target / f"{spec.name}.so"
