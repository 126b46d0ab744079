"""Emulated kernels under AddressSanitizer and UndefinedBehaviorSanitizer. The emulator checks
cp.async, ldmatrix and page-table addresses itself; the sanitizers add every plain load and
store outside its allocation (global memory as torch allocated it, static shared memory, a
thread's stack), signed overflow, overlong shifts and misaligned accesses, in kernels and
bindings alike, each failing the process with a report.

ASan's runtime must be the first library a process loads, so a sanitized run is a new
process with it preloaded, in which engine.py builds every library instrumented
(``engine.sanitized()``)::

    python -m tests.emu.sanitizers [pytest arguments]   # no test named: every emulated test
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from flashinfer.jit.toolchain import current_toolchain

from .engine import REPO_ROOT

# The emulator's own tests and every emulated module's (not test_sanitizers.py: it starts
# sanitized runs of its own)
EVERY_EMULATED_TEST = (
    "tests/emu/test_simt.py",
    "tests/emu/test_conversions.py",
    "tests/emu/test_sfu.py",
    *sorted(
        str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tests/ops").glob("test_*_emulated.py")
    ),
)


def runtime() -> Path | None:
    """The host compiler's AddressSanitizer runtime; None when it has none."""
    cxx = str(current_toolchain().cxx)
    found = subprocess.run(
        [cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    path = Path(found)
    return path.resolve() if path.is_absolute() and path.exists() else None


def environment() -> dict[str, str]:
    """This process's environment with the ASan runtime preloaded first."""
    asan = runtime()
    if asan is None:
        raise RuntimeError("the host compiler has no AddressSanitizer runtime (libasan.so)")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (str(asan), env.get("LD_PRELOAD", "")) if p)
    # the interpreter keeps its own allocations until exit: not leaks of the code under test
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1"
    return env


def run_python(
    arguments: Sequence[str], timeout: float | None = None, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python arguments...`` under the sanitizers, from the repository root."""
    return subprocess.run(
        [sys.executable, *arguments],
        env=environment(),
        cwd=REPO_ROOT,
        capture_output=capture,
        text=True,
        timeout=timeout,
        check=False,
    )


def pytest_command(arguments: Sequence[str]) -> list[str]:
    """``python -m pytest arguments``, on every emulated test unless an argument names a test
    file or directory (a node id's file counts). pytest captures only ``sys.stdout`` and
    ``sys.stderr`` unless the arguments say otherwise: a sanitizer writes its report to file
    descriptor 2 and ends the process, so pytest's default capture of the descriptors would
    swallow the report and leave only the exit status."""
    names_tests = any((REPO_ROOT / a.split("::")[0]).exists() for a in arguments if a[:1] != "-")
    chose_capture = any(a == "-s" or a.startswith("--capture") for a in arguments)
    capture = () if chose_capture else ("--capture=sys",)
    return ["-m", "pytest", *capture, *arguments, *(() if names_tests else EVERY_EMULATED_TEST)]


if __name__ == "__main__":
    sys.exit(run_python(pytest_command(sys.argv[1:]), capture=False).returncode)
