"""``python -m flashinfer doctor``: checks what JIT compilation and kernels need, and says
what to fix."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from .config import config
from .version import __version__


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _nvcc() -> Check:
    from .jit.toolchain import current_toolchain

    try:
        tc = current_toolchain()
        version = tc.nvcc_version()
    except Exception as err:
        return Check("nvcc", False, str(err), "install the CUDA toolkit or set FLASHINFER_NVCC")
    return Check("nvcc", True, f"{tc.nvcc}: {version.split(' | ')[0]}")


def _host_compiler() -> Check:
    from .jit.toolchain import current_toolchain
    from .utils import get_nvcc_version

    try:
        tc = current_toolchain()
        version = tc.cxx_version()
    except Exception as err:
        return Check("host compiler", False, str(err), "install g++ or set CXX")
    match = re.search(r"\b(\d+)\.\d+\.\d+", version)
    gcc = int(match[1]) if match and "clang" not in version else None
    nvcc = get_nvcc_version()
    # nvcc 12.x accepts gcc up to 13 (12.4+), nvcc 13.x up to 15.
    limit = 15 if nvcc and nvcc[0] >= 13 else 13
    if gcc is not None and gcc > limit:
        return Check("host compiler", False, f"{tc.cxx}: gcc {gcc}",
                     f"nvcc {nvcc} supports gcc <= {limit}; set CXX to an older g++")
    return Check("host compiler", True, f"{tc.cxx}: {version}")


def _ninja() -> Check:
    from .jit.toolchain import find_ninja

    try:
        return Check("ninja", True, str(find_ninja()))
    except Exception as err:
        return Check("ninja", False, str(err), "pip install ninja")


def _gpu() -> Check:
    if not torch.cuda.is_available():
        archs = config.cuda_arch_list
        if archs:
            return Check("GPU", True, f"none visible; compiling for FLASHINFER_CUDA_ARCH_LIST={archs}")
        return Check("GPU", False, "none visible and FLASHINFER_CUDA_ARCH_LIST is not set",
                     'set FLASHINFER_CUDA_ARCH_LIST (e.g. "9.0a") to build without a GPU')
    names = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        names.append(f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return Check("GPU", True, "; ".join(names))


def _workspace() -> Check:
    from .jit import env

    path = env.workspace_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".doctor-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        return Check("workspace", False, f"{path}: {err}", "set FLASHINFER_WORKSPACE_BASE")
    used = shutil.disk_usage(path)
    return Check("workspace", True, f"{path} (writable, {used.free / 1e9:.0f} GB free)")


def _versions() -> Check:
    import tvm_ffi

    return Check("versions", True, f"flashinfer {__version__}, torch {torch.__version__}, "
                 f"tvm-ffi {tvm_ffi.__version__}, Python {sys.version.split()[0]}")


def _config() -> Check:
    from .config import Config

    problems = []
    for var in Config.variables():
        try:
            var.read()
        except ValueError as err:
            problems.append(str(err))
    if problems:
        return Check("configuration", False, "; ".join(problems), "fix or unset those variables")
    return Check("configuration", True, "every FLASHINFER_* variable parses")


CHECKS: list[Callable[[], Check]] = [_versions, _config, _nvcc, _host_compiler, _ninja, _gpu,
                                     _workspace]


def run_checks() -> int:
    """Print one line per check; 1 when any failed."""
    failed = 0
    for check_fn in CHECKS:
        try:
            check = check_fn()
        except Exception as err:  # a broken check is itself a finding
            check = Check(check_fn.__name__.strip("_"), False, f"check crashed: {err}")
        print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            if check.fix:
                print(f"       fix: {check.fix}")
    print("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0
