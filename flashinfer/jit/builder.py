"""Runs a module's build and publishes the result into the cache.

Two ways, one result:

- in place, under the module's lock: ninja builds in the module's cache dir, so only
  stale objects recompile; the link writes a temp file renamed onto the library;
- in a private staging dir, when no lock could be had: a full build there, then the
  library and the manifest are moved into the cache dir by atomic rename.

Either way the manifest is written (atomically) after the library, so a manifest that
exists always describes a complete library, and a published library is never written
in place: a process that has it mapped keeps its inode.

The manifest must describe what the compiler read, not what is on disk when it ends: the
inputs are hashed before the build starts, and one saved while it ran (a changed hash,
or, for a dependency first seen in this build, an mtime after the start) makes the
builder build again. If inputs keep changing, the manifest records the pre-build
state, so the next load sees the change and rebuilds.
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
from typing import Sequence

from ..config import config
from .fileutil import write_if_different
from .manifest import FileRecord, LibraryRecord, Manifest, read_ninja_deps
from .plan import BuildPlan
from .toolchain import default_max_jobs, find_ninja

logger = logging.getLogger("flashinfer.jit")

PROGRESS_INTERVAL_S = 5.0
BUILD_ATTEMPTS = 3
_ERROR_LINES = 60
_STOP_GRACE_S = 30.0
# gcc: "file:12:3: error: ..."; nvcc (EDG front end): "file(12): error: ..."
_DIAGNOSTIC_RE = re.compile(r"^\S.*?(?::\d+(?::\d+)?|\(\d+\)):\s*(?:fatal\s+)?error\b")
# Anything else that says it failed: "nvcc fatal   : Unsupported gpu architecture ...",
# "ld: cannot find -lfoo", "ninja: error: ...", "collect2: error: ...".
_ERROR_WORD_RE = re.compile(r"\b(?:error|fatal|cannot|undefined reference)\b", re.IGNORECASE)


class JitCompileError(RuntimeError):
    """A module failed to build; the message starts with the first compiler error and
    ends with the path of the full log."""


def run_ninja(
    build_dir: Path,
    name: str,
    targets: Sequence[str] = (),
    log_path: Path | None = None,
    *,
    keep_going: bool = False,
) -> None:
    """Run ninja in ``build_dir``; log progress; raise JitCompileError on failure.
    The full output goes to ``log_path`` (default ``build_dir/build.log``). ``keep_going``:
    a failed step stops only what depends on it (a precompile of many modules)."""
    cmd = [str(find_ninja()), "-C", str(build_dir), f"-j{default_max_jobs()}"]
    if keep_going:
        cmd += ["-k", "0"]
    cmd += targets
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
        try:
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
        except BaseException:
            # An exception here (a test's timeout, Ctrl-C) must not leave ninja building
            # after the caller has dropped the module's lock: the next build of the module
            # would run a second ninja in the same dir.
            _stop(proc)
            raise
        code = proc.wait()
    if code != 0:
        errors = [ln for ln in output if not ln.startswith(("[", "ninja: "))]
        body = "".join(errors[-_ERROR_LINES:]).rstrip()
        headline = _headline(output) or f"ninja exited with code {code}"
        raise JitCompileError(
            f"{headline}\nbuilding module {name} failed (build dir {build_dir}):\n"
            f"{body}\nfull log: {log_path}"
        )


def _stop(proc: subprocess.Popen[str]) -> None:
    """End ninja and what it runs: on SIGTERM ninja stops its commands (each runs in a
    process group of its own) and removes their partial outputs; SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _headline(output: list[str]) -> str | None:
    """The first error the tools printed: a file:line diagnostic if there is one, else the
    first line that says it failed (ninja's own only when nothing else did)."""
    lines = []
    after_failed = False
    for line in output:
        # Ninja prints "FAILED: <target>" then the command line, which may mention anything.
        if not after_failed and not line.startswith(("[", "FAILED: ")):
            lines.append(line.strip())
        after_failed = line.startswith("FAILED: ")
    for candidates in (
        [ln for ln in lines if _DIAGNOSTIC_RE.match(ln)],
        [ln for ln in lines if not ln.startswith("ninja: ") and _ERROR_WORD_RE.search(ln)],
        [ln for ln in lines if ln.startswith("ninja: ") and _ERROR_WORD_RE.search(ln)],
    ):
        if candidates:
            return candidates[0]
    return None


def record_manifest(plan: BuildPlan, generated: Sequence[Path], work_dir: Path) -> Manifest:
    """The manifest of a build that just succeeded in ``work_dir`` (its library record is
    added once the library is published)."""
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


class InputSnapshot:
    """The inputs known before a build, hashed, and the build's start on the file clock."""

    def __init__(self, paths: set[str], marker: Path) -> None:
        self.records: dict[str, FileRecord] = {}
        for path in paths:
            try:
                self.records[path] = FileRecord.of(Path(path))
            except OSError:
                continue
        # The marker's mtime comes from the same (coarse) clock as the inputs' mtimes.
        marker.touch()
        self.started_ns = marker.stat().st_mtime_ns
        marker.unlink()

    def moved(self, manifest: Manifest) -> list[str]:
        """Inputs the compiler may have read in another version than the manifest records."""
        moved = []
        for path, after in manifest.inputs.items():
            before = self.records.get(path)
            if before is None:
                if after.mtime_ns > self.started_ns:
                    moved.append(path)
            elif before.sha256 != after.sha256:
                moved.append(path)
        return moved

    def pin(self, manifest: Manifest, moved: list[str]) -> None:
        """Record ``moved`` as they were before the build (unknown: a record no file matches),
        so the manifest says they changed and their objects rebuild."""
        for path in moved:
            manifest.inputs[path] = self.records.get(path, FileRecord(-1, -1, ""))


def _known_inputs(
    plan: BuildPlan, generated: Sequence[Path], manifest: Manifest | None
) -> set[str]:
    known = {str(s) for s in plan.ninja.sources} | {str(p) for p in generated}
    if manifest is not None:
        known.update(manifest.inputs)
    return known


def _report_moved(name: str, moved: list[str], attempt: int) -> None:
    shown = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
    if attempt + 1 < BUILD_ATTEMPTS:
        logger.info("%s changed while %s compiled; compiling again", shown, name)
    else:
        logger.warning(
            "%s kept changing while %s compiled (%d builds); loading the last build, "
            "the next load rebuilds it",
            shown,
            name,
            BUILD_ATTEMPTS,
        )


def _remove_failure_logs(build_dir: Path) -> None:
    """Logs of failed staging builds are obsolete once the module builds."""
    for log in build_dir.glob("build-*.log"):
        log.unlink(missing_ok=True)


def write_build_file(plan: BuildPlan) -> Path:
    """The module's build.ninja in its cache dir, rewritten only when it changes."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    path = plan.build_dir / "build.ninja"
    write_if_different(path, plan.ninja.render())
    return path


def build_in_place(
    plan: BuildPlan, name: str, generated: Sequence[Path], manifest: Manifest | None
) -> None:
    """Incremental build in the cache dir; the caller holds the module's lock."""
    record = manifest.library_record if manifest is not None else None
    if record is None or record.check(plan.library_path)[0] is not None:
        # Ninja would take a truncated or rewritten library (or one no manifest vouches
        # for) as up to date; without it, it links again.
        plan.library_path.unlink(missing_ok=True)
    for attempt in range(BUILD_ATTEMPTS):
        if manifest is not None:
            changed, _ = manifest.changed_inputs()
            # Dependents of changed files rebuild even if the new files carry older mtimes
            # than the objects (a reinstall, or a save during the last build, does that);
            # ninja alone would miss them.
            for obj in manifest.objects_depending_on(changed):
                (plan.build_dir / obj).unlink(missing_ok=True)
        write_build_file(plan)
        snapshot = InputSnapshot(
            _known_inputs(plan, generated, manifest), plan.build_dir / ".build-start"
        )
        run_ninja(plan.build_dir, name)
        manifest = record_manifest(plan, generated, plan.build_dir)
        moved = snapshot.moved(manifest)
        snapshot.pin(manifest, moved)
        if moved:
            _report_moved(name, moved, attempt)
        if not moved or attempt + 1 == BUILD_ATTEMPTS:
            break
    manifest.library_record = LibraryRecord.of(plan.library_path)
    manifest.save(plan.build_dir)
    _remove_failure_logs(plan.build_dir)


def build_in_staging(plan: BuildPlan, name: str, generated: Sequence[Path]) -> None:
    """Full build in a private dir beside the cache dir, then atomic publish."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(BUILD_ATTEMPTS):
        staging = plan.build_dir.parent / (
            f".staging-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        staging.mkdir()
        try:
            (staging / "build.ninja").write_text(plan.ninja.render())
            snapshot = InputSnapshot(_known_inputs(plan, generated, None), staging / ".build-start")
            # The log outlives the staging dir, so a failure's message points at a real file.
            run_ninja(staging, name, log_path=plan.build_dir / f"build-{staging.name[9:]}.log")
            manifest = record_manifest(plan, generated, staging)
            moved = snapshot.moved(manifest)
            snapshot.pin(manifest, moved)
            if moved:
                _report_moved(name, moved, attempt)
                if attempt + 1 < BUILD_ATTEMPTS:
                    continue
            os.replace(staging / plan.ninja.output, plan.library_path)
            manifest.library_record = LibraryRecord.of(plan.library_path)
            manifest.save(plan.build_dir)
            _remove_failure_logs(plan.build_dir)
            return
        finally:
            shutil.rmtree(staging, ignore_errors=True)
