"""``python -m flashinfer doctor``: checks each setting the way the code uses it, prints one
line per check (and the fix for each problem), and exits non-zero when any check fails.

It must start whatever the environment holds (an invalid setting is a finding, not a
crash) and stay fast: it asks the compilers for their versions and archs, builds nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

import torch

from .config import Config, config
from .jit.arch import CudaArch, runs_on, visible_capabilities
from .version import __version__


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


# A check reports one line, or one line per independent problem it found.
CheckResult = Union[Check, list[Check]]

_ARCH_LIST_FIX = (
    'set FLASHINFER_CUDA_ARCH_LIST to archs like "9.0a" or "8.0 9.0a 10.0a", '
    "or unset it to target the visible GPUs"
)


def _versions() -> Check:
    import tvm_ffi

    return Check(
        "versions",
        True,
        f"flashinfer {__version__}, torch {torch.__version__}, "
        f"tvm-ffi {tvm_ffi.__version__}, Python {sys.version.split()[0]}",
    )


def _config() -> Check:
    problems = config.problems()
    if problems:
        return Check(
            "configuration",
            False,
            "; ".join(problems),
            "set each to a valid value or unset it (show-config lists them all)",
        )
    return Check("configuration", True, "every FLASHINFER_* variable parses")


def _nvcc_or_none() -> Path | None:
    """The nvcc builds would use, or None when there is none (other checks then skip
    what depends on it; the nvcc check reports why)."""
    from .jit.toolchain import ToolchainError, find_nvcc, tool_version

    try:
        nvcc = find_nvcc()
        tool_version(nvcc)
    except (ToolchainError, OSError):
        return None
    return nvcc


def _nvcc() -> Check:
    from .jit.toolchain import ToolchainError, find_cuda_home, find_nvcc, tool_version

    try:
        nvcc = find_nvcc()
        version = tool_version(nvcc)
    except (ToolchainError, OSError) as err:
        return Check(
            "nvcc",
            False,
            str(err),
            "install the CUDA toolkit and put its bin/ on "
            "PATH, or set FLASHINFER_NVCC to nvcc's path",
        )
    try:
        home = find_cuda_home(nvcc)
    except ToolchainError as err:
        return Check("nvcc", False, str(err), "set CUDA_HOME to the toolkit root")
    if not (home / "include" / "cuda_runtime_api.h").is_file():
        return Check(
            "nvcc",
            False,
            f"CUDA_HOME={home} has no include/cuda_runtime_api.h",
            "set CUDA_HOME to the toolkit root (the dir holding include/), or unset it",
        )
    return Check("nvcc", True, f"{nvcc}: {version.split(' | ')[0]}; toolkit {home}")


# Newest gcc major each nvcc release accepts (its host_config.h), newest release first.
_MAX_GCC = (((13, 0), 15), ((12, 8), 14), ((12, 4), 13), ((12, 0), 12), ((11, 0), 11))


def _max_gcc(release: tuple[int, int]) -> int | None:
    return next((gcc for since, gcc in _MAX_GCC if release >= since), None)


def _host_compiler() -> Check:
    from .jit.toolchain import ToolchainError, find_cxx, nvcc_release, tool_version

    try:
        cxx = find_cxx()
        version = tool_version(cxx)
    except (ToolchainError, OSError) as err:
        return Check("host compiler", False, str(err), "install g++, or set CXX to a C++ compiler")
    detail = f"{cxx}: {version}"
    match = re.search(r"\b(\d+)\.\d+\.\d+", version)
    gcc = int(match[1]) if match and "clang" not in version else None
    nvcc = _nvcc_or_none()
    release = nvcc_release(nvcc) if nvcc is not None else None
    if release is None:
        return Check("host compiler", True, f"{detail} (no usable nvcc to check it against)")
    limit = _max_gcc(release)
    if gcc is not None and limit is not None and gcc > limit:
        return Check(
            "host compiler",
            False,
            f"{detail}: gcc {gcc} is too new for nvcc "
            f"{release[0]}.{release[1]} (it accepts gcc <= {limit})",
            f"set CXX to g++-{limit} or older, or use a newer CUDA toolkit",
        )
    return Check("host compiler", True, detail)


def _ninja() -> Check:
    from .jit.toolchain import find_ninja

    try:
        return Check("ninja", True, str(find_ninja()))
    except Exception as err:
        return Check("ninja", False, str(err), "pip install ninja")


def _gpu() -> Check:
    """What is visible; whether that leaves an arch to build for is the archs check's call."""
    if not torch.cuda.is_available():
        cuda = "" if torch.version.cuda else f" (torch {torch.__version__} is a CPU build)"
        return Check("GPU", True, f"none visible{cuda}")
    names = [
        f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor})"
        for i, (major, minor) in enumerate(visible_capabilities())
    ]
    return Check("GPU", True, "; ".join(names))


def _archs() -> Check:
    from .jit.arch import NoTargetArchError, parse_arch_list, target_archs
    from .jit.toolchain import ToolchainError, nvcc_arch_problem

    listed = config.cuda_arch_list
    try:
        archs: tuple[CudaArch, ...] = (
            parse_arch_list(listed) if listed is not None else target_archs()
        )
    except ValueError as err:
        return Check("target archs", False, str(err), _ARCH_LIST_FIX)
    except NoTargetArchError:
        return Check(
            "target archs",
            False,
            "none: no GPU is visible and FLASHINFER_CUDA_ARCH_LIST is not set",
            'set FLASHINFER_CUDA_ARCH_LIST (e.g. "9.0a") to build without a GPU',
        )
    source = "FLASHINFER_CUDA_ARCH_LIST" if listed is not None else "the visible GPUs"
    names = " ".join(str(a) for a in archs)
    problems: list[str] = []
    nvcc = _nvcc_or_none()
    if nvcc is not None:
        try:
            problems += [p for p in (nvcc_arch_problem(a, nvcc) for a in archs) if p]
        except ToolchainError as err:
            problems.append(str(err))
    if listed is not None:
        for index, gpu in enumerate(visible_capabilities()):
            if not any(runs_on(a, gpu) for a in archs):
                problems.append(f"GPU {index} (sm_{gpu[0]}{gpu[1]}) runs none of them")
    if problems:
        fix = (
            _ARCH_LIST_FIX
            if listed is not None
            else "use a CUDA toolkit that supports these GPUs (FLASHINFER_NVCC)"
        )
        return Check("target archs", False, f"{names} (from {source}): " + "; ".join(problems), fix)
    checked = "" if nvcc is not None else " (not checked against nvcc: none usable)"
    return Check("target archs", True, f"{names} (from {source}){checked}")


def _workspace() -> list[Check]:
    from .jit import env

    found = []
    raw = (Config.workspace_base.raw() or "").strip()
    base = config.workspace_base
    if raw and not os.path.isabs(os.path.expanduser(raw)):
        found.append(
            Check(
                "workspace",
                False,
                f"FLASHINFER_WORKSPACE_BASE={raw!r} is relative: here it is {base}, but processes "
                "started from other directories use (and compile into) other workspaces",
                f"set FLASHINFER_WORKSPACE_BASE to an absolute path (e.g. {base})",
            )
        )
        return found  # probing would create a workspace under the current directory
    path = env.workspace_dir()  # where this process would really build
    if path.parent != base:
        found.append(
            Check(
                "workspace",
                False,
                f"{base} (FLASHINFER_WORKSPACE_BASE) is unusable ({env._problem(base)}); builds "
                f"fall back to {path.parent}",
                f"make {base} a writable directory, or set FLASHINFER_WORKSPACE_BASE to one",
            )
        )
        return found
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".doctor-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        found.append(
            Check(
                "workspace",
                False,
                f"{path}: {err.strerror or err}",
                f"make {path} writable, or set FLASHINFER_WORKSPACE_BASE",
            )
        )
        return found
    if not found:
        free = shutil.disk_usage(path).free
        found.append(Check("workspace", True, f"{path} (writable, {free / 1e9:.0f} GB free)"))
    return found


def _writable_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be opened for append as the log destination opens it (creating
    missing parents), or None. Leaves nothing behind: what the probe created it removes."""
    missing = []
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    created: list[Path] = []
    try:
        for directory in reversed(missing):
            directory.mkdir()
            created.append(directory)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            os.unlink(path)
        except FileExistsError:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as err:
        return err.strerror or str(err)
    finally:
        for directory in reversed(created):
            try:
                directory.rmdir()
            except OSError:
                pass
    return None


def _log_destination() -> Check:
    from .logdest import resolve_path

    spec = config.api_log_dest
    if spec in ("stdout", "stderr"):
        return Check("log destination", True, spec)
    path = resolve_path(spec)
    problem = _writable_file_problem(path)
    if problem is not None:
        return Check(
            "log destination",
            False,
            f"FLASHINFER_LOGDEST={spec!r}: cannot write {path}: {problem}",
            "set FLASHINFER_LOGDEST to stdout, stderr or a writable file path",
        )
    return Check("log destination", True, f"{path} (writable)")


def _repository() -> Check:
    """The module repository answers with an index (one request; downloads nothing)."""
    from .jit import aot, env, remote

    name = "module repository"
    try:
        base = config.cubins_repository
        if base is None:
            return Check(name, True, "none (FLASHINFER_CUBINS_REPOSITORY is unset)")
        if config.no_download:
            return Check(name, True, f"{base} (not contacted: FLASHINFER_NO_DOWNLOAD=1)")
        index = remote.read_index(base)
        target = aot.Target.current()
    except ValueError as err:
        return Check(name, False, str(err), "fix the setting it names (show-config lists them)")
    except remote.DownloadError as err:
        return Check(
            name,
            False,
            str(err),
            "serve what `python -m flashinfer precompile --out DIR` wrote at "
            "FLASHINFER_CUBINS_REPOSITORY, or unset it",
        )
    usable = sum(target.mismatch(entry) is None for entry in index.modules.values())
    return Check(
        name,
        True,
        f"{base}: {len(index.modules)} module(s), {usable} for this machine; "
        f"downloads go to {env.cubin_dir()}",
    )


CHECKS: list[Callable[[], CheckResult]] = [
    _versions,
    _config,
    _nvcc,
    _host_compiler,
    _ninja,
    _gpu,
    _archs,
    _workspace,
    _log_destination,
    _repository,
]


def run_checks() -> int:
    """Print one line per check (and a fix per problem); 1 when any failed."""
    failed = 0
    for check_fn in CHECKS:
        try:
            result = check_fn()
        except Exception as err:  # a broken check is itself a finding
            result = Check(check_fn.__name__.strip("_"), False, f"check crashed: {err!r}")
        checks = result if isinstance(result, list) else [result]
        for check in checks:
            print(f"[{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
            if check.fix:
                print(f"       fix: {check.fix}")
        failed += not all(check.ok for check in checks)
    print("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0
