"""Runs a module's build and publishes the result into the cache.

Two ways, one result:

- in place, under the module's lock: ninja builds in the module's cache dir, so only
  stale objects recompile; the link writes a temp file renamed onto the library;
- in a private staging dir, when no lock could be had: a full build there, then the
  library and the manifest are moved into the cache dir by atomic rename.

Either way the manifest is written (atomically) after the library, so a manifest that
exists always describes a complete library, and a published library is never written
in place: a process that has it mapped keeps its inode.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..config import config
from .fileutil import write_if_different
from .manifest import FileRecord, Manifest, read_ninja_deps
from .toolchain import default_max_jobs, find_ninja

if TYPE_CHECKING:
    from .core import BuildPlan

logger = logging.getLogger("flashinfer.jit")

PROGRESS_INTERVAL_S = 5.0
_ERROR_LINES = 60
# gcc: "file:12:3: error: ..."; nvcc (EDG front end): "file(12): error: ..."
_DIAGNOSTIC_RE = re.compile(r"^\S.*?(?::\d+(?::\d+)?|\(\d+\)):\s*(?:fatal\s+)?error\b")


class JitCompileError(RuntimeError):
    """A module failed to build; the message starts with the first compiler error and
    ends with the path of the full log."""


def run_ninja(build_dir: Path, name: str, targets: Sequence[str] = (),
              log_path: Path | None = None) -> None:
    """Run ninja in ``build_dir``; log progress; raise JitCompileError on failure.
    The full output goes to ``log_path`` (default ``build_dir/build.log``)."""
    cmd = [str(find_ninja()), "-C", str(build_dir), f"-j{default_max_jobs()}", *targets]
    verbose = config.jit_verbose
    if verbose:
        cmd.append("-v")
    log_path = log_path or build_dir / "build.log"
    child_env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    start = last_report = time.monotonic()
    output: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            output.append(line)
            if verbose:
                sys.stderr.write(line)
            now = time.monotonic()
            if line.startswith("[") and now - last_report >= PROGRESS_INTERVAL_S:
                done = line[1 : line.index("]")] if "]" in line else "?"
                logger.info("compiling %s: %s steps done, %.0f s", name, done, now - start)
                last_report = now
        code = proc.wait()
    if code != 0:
        errors = [ln for ln in output if not ln.startswith(("[", "ninja: "))]
        first = next((ln.strip() for ln in errors if _DIAGNOSTIC_RE.match(ln)), None)
        body = "".join(errors[-_ERROR_LINES:]).rstrip()
        headline = first or f"ninja exited with code {code}"
        raise JitCompileError(
            f"{headline}\nbuilding module {name} failed (build dir {build_dir}):\n"
            f"{body}\nfull log: {log_path}"
        )


def record_manifest(plan: BuildPlan, generated: Sequence[Path], work_dir: Path) -> Manifest:
    """The manifest of a build that just succeeded in ``work_dir``."""
    deps = read_ninja_deps(find_ninja(), work_dir)
    # Toolkit and tvm-ffi headers are covered by their versions in the identity;
    # leaving them out keeps the warm path to a few stats.
    versioned = tuple(
        str(root) + os.sep
        for d in (plan.toolchain.cuda_home, *plan.toolchain.tvm_ffi_include_dirs)
        for root in {d, d.resolve()}
    )
    objects = {
        obj: [d for d in deps.get(obj, []) if not d.startswith(versioned)]
        for obj in plan.ninja.objects()
    }
    inputs = {str(s) for s in plan.ninja.sources}
    inputs.update(str(p) for p in generated)
    for obj_deps in objects.values():
        inputs.update(obj_deps)
    return Manifest(
        identity=plan.identity,
        library=plan.ninja.output,
        inputs={p: FileRecord.of(Path(p)) for p in sorted(inputs)},
        objects=objects,
    )


def write_build_file(plan: BuildPlan) -> Path:
    """The module's build.ninja in its cache dir, rewritten only when it changes."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    path = plan.build_dir / "build.ninja"
    write_if_different(path, plan.ninja.render())
    return path


def build_in_place(plan: BuildPlan, name: str, generated: Sequence[Path],
                   manifest: Manifest | None) -> None:
    """Incremental build in the cache dir; the caller holds the module's lock."""
    if manifest is not None:
        changed, _ = manifest.changed_inputs()
        # Dependents of changed files rebuild even if the new files carry older mtimes
        # than the objects (a reinstall does that); ninja alone would miss them.
        for obj in manifest.objects_depending_on(changed):
            (plan.build_dir / obj).unlink(missing_ok=True)
    write_build_file(plan)
    run_ninja(plan.build_dir, name)
    record_manifest(plan, generated, plan.build_dir).save(plan.build_dir)


def build_in_staging(plan: BuildPlan, name: str, generated: Sequence[Path]) -> None:
    """Full build in a private dir beside the cache dir, then atomic publish."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    staging = plan.build_dir.parent / (
        f".staging-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        (staging / "build.ninja").write_text(plan.ninja.render())
        # The log outlives the staging dir, so a failure's message points at a real file.
        run_ninja(staging, name, log_path=plan.build_dir / f"build-{staging.name[9:]}.log")
        manifest = record_manifest(plan, generated, staging)
        os.replace(staging / plan.ninja.output, plan.library_path)
        manifest.save(plan.build_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
