"""The JIT framework: specs, builds, the on-disk cache and loading."""

from __future__ import annotations

from .arch import CudaArch, NoTargetArchError, target_archs
from .builder import JitCompileError
from .core import BuildPlan, JitDisabledError, JitSpec, gen_jit_spec
from .render import render_template
from .toolchain import ToolchainError

__all__ = [
    "BuildPlan",
    "CudaArch",
    "JitCompileError",
    "JitDisabledError",
    "JitSpec",
    "NoTargetArchError",
    "ToolchainError",
    "gen_jit_spec",
    "render_template",
    "target_archs",
]
