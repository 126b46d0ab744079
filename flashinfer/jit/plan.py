"""A module's build plan: target archs, toolchain, full flags, identity hash and build dir,
all derived from its spec and the environment before anything is written."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..config import config
from ..version import __version__
from . import env
from .arch import CudaArch, filter_archs, target_archs
from .fileutil import sha256_file
from .ninja import NinjaBuild
from .render import PendingRender
from .toolchain import Toolchain, current_toolchain


class PlannedSpec(Protocol):
    """What planning reads of a :class:`~flashinfer.jit.core.JitSpec`."""

    name: str
    sources: list[Path]
    extra_cflags: list[str]
    extra_cuda_cflags: list[str]
    extra_ldflags: list[str]
    extra_include_paths: list[Path]
    supported_major_versions: list[int] | None
    generated_sources: list[Path]
    renders: list[PendingRender]

    def generated_files(self) -> list[Path]: ...


@dataclass(frozen=True)
class BuildPlan:
    """Everything derived from a spec and the environment before anything is written."""

    archs: tuple[CudaArch, ...]
    toolchain: Toolchain
    ninja: NinjaBuild
    identity: dict[str, Any]
    digest: str
    build_dir: Path

    @property
    def library_path(self) -> Path:
        return self.build_dir / self.ninja.output


def make_plan(spec: PlannedSpec, archs: Sequence[CudaArch] | None = None) -> BuildPlan:
    """Flags, identity and build dir of ``spec`` for ``archs`` (default: the target archs)."""
    archs = filter_archs(archs or target_archs(), spec.supported_major_versions, spec.name)
    tc = current_toolchain()
    includes = [
        env.FLASHINFER_INCLUDE_DIR,
        env.FLASHINFER_CSRC_DIR,
        env.generated_dir(spec.name),
        *map(Path, spec.extra_include_paths),
    ]
    include_flags = [f"-I{p}" for p in includes]
    if config.jit_debug:
        cuda_opt, host_opt = ["-g", "-G", "-O0"], ["-g", "-O0"]
    else:
        cuda_opt, host_opt = ["-O3", "-DNDEBUG"], ["-O2", "-DNDEBUG"]
    cuda_cflags = [
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-Xcompiler=-fPIC",
        *cuda_opt,
        *(["-lineinfo"] if config.jit_lineinfo else []),
        *(["-DFLASHINFER_DEVICE_PRINT=1"] if config.jit_device_print else []),
        f"--threads={config.nvcc_threads}",
        *(a.gencode for a in archs),
        *include_flags,
        *spec.extra_cuda_cflags,
        *config.extra_cudaflags,
    ]
    cflags = [
        "-std=c++17",
        "-fPIC",
        *host_opt,
        *include_flags,
        *(f"-isystem{p}" for p in (*tc.tvm_ffi_include_dirs, tc.cuda_include_dir)),
        *spec.extra_cflags,
        *config.extra_cflags,
    ]
    ldflags = [
        "-shared",
        f"-L{tc.cuda_lib_dir}",
        "-lcudart",
        f"-Wl,-rpath,{tc.cuda_lib_dir}",
        f"-L{tc.tvm_ffi_lib_dir}",
        "-ltvm_ffi",
        f"-Wl,-rpath,{tc.tvm_ffi_lib_dir}",
        *spec.extra_ldflags,
        *config.extra_ldflags,
    ]
    sources = tuple(Path(s) for s in spec.sources)
    workspace = str(env.workspace_dir())

    def portable(text: str) -> str:  # the workspace path out of the identity
        return text.replace(workspace, "$WORKSPACE")

    identity = {
        "name": spec.name,
        "sources": [str(s) for s in sources],
        "generated": {portable(str(p)): sha256_file(Path(p)) for p in spec.generated_files()},
        "cuda_cflags": [portable(f) for f in cuda_cflags],
        "cflags": [portable(f) for f in cflags],
        "ldflags": ldflags,
        "archs": [str(a) for a in archs],
        "nvcc": tc.nvcc_version(),
        "cxx": tc.cxx_version(),
        "flashinfer": __version__,
        "tvm_ffi": tc.tvm_ffi_version,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    ninja = NinjaBuild(
        sources=sources,
        output=f"{spec.name}.so",
        # Launchers (ccache) do not change the output, so they stay out of the hash.
        nvcc=(*config.nvcc_launcher, str(tc.nvcc)),
        cxx=(*config.cxx_launcher, str(tc.cxx)),
        cuda_cflags=tuple(cuda_cflags),
        cflags=tuple(cflags),
        ldflags=tuple(ldflags),
    )
    build_dir = env.cached_ops_dir() / spec.name / digest
    return BuildPlan(archs, tc, ninja, identity, digest, build_dir)
