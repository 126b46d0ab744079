"""JitSpec: a module's identity, its build in a hashed cache dir, and its loading.

Flow of ``build_and_load()``:

1. the plan index has an entry for this spec in this environment and every file it
   lists has the recorded stat -> load the .so (no planning, no render, no manifest read;
   see plan_index.py)
2. settings are validated (``config.validate``: index entries exist only for valid
   settings, so a bad value is reported whether the module is built or found)
3. an AOT layer with a matching record -> load its .so (no compiler needed)
4. plan: render the configs, target archs, toolchain, full flags, identity hash -> build
   dir; the manifest matches the files on disk -> load the .so (no subprocess, no lock);
   with a read-only workspace, its build of the same identity is checked the same way
5. otherwise, under the module's lock (or lock-free in a private staging dir): re-check,
   build, record the manifest, evict if the cache is over its size, load.

A module once loaded from the workspace is found by step 1 before the AOT layers while
the environment stays the same (both are verified builds of the same sources).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..config import config
from ..debug_printer import LaunchPrinter
from . import aot, cache, env, plan_index
from .arch import CudaArch, target_archs
from .builder import JitCompileError, build_in_place, build_in_staging, write_build_file
from .explain import stale_reason
from .lock import module_lock
from .manifest import Manifest
from .plan import BuildPlan, make_plan
from .render import PendingRender
from .toolchain import ToolchainError, nvcc_arch_problem

logger = logging.getLogger("flashinfer.jit")

__all__ = ["BuildPlan", "JitCompileError", "JitDisabledError", "JitSpec", "gen_jit_spec"]


class JitDisabledError(RuntimeError):
    """A module is needed but not built, and FLASHINFER_DISABLE_JIT forbids compiling."""


def check_cuda_arch() -> None:
    """Raise RuntimeError unless some target arch (FLASHINFER_CUDA_ARCH_LIST, else the
    visible GPUs) is sm75 or newer, as the reference does before building a module."""
    if not any((arch.major, arch.minor) >= (7, 5) for arch in target_archs()):
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")


def check_buildable(plan: BuildPlan) -> None:
    """Refuse, before compiling, archs this nvcc cannot build (FLASHINFER_CUDA_ARCH_LIST=7.0
    under nvcc 13 would otherwise fail deep inside the compiler)."""
    for arch in plan.archs:
        problem = nvcc_arch_problem(arch, plan.toolchain.nvcc)
        if problem is not None:
            raise JitCompileError(
                f"{problem} (the target archs come from "
                "FLASHINFER_CUDA_ARCH_LIST, else the visible GPUs)"
            )


@dataclass
class JitSpec:
    """A JIT module: its name (URI), sources and flags.

    ``generated_sources`` are files rendered for this specialization and ``renders`` the
    renders done when the spec is planned (the content of both is part of the identity
    hash); ``sources`` are the TUs to compile.
    Loading returns the tvm-ffi module, instrumented when FLASHINFER_DEBUG_PRINTER is set.
    """

    name: str
    sources: list[Path]
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    extra_include_paths: list[Path] = field(default_factory=list)
    supported_major_versions: list[int] | None = None
    generated_sources: list[Path] = field(default_factory=list)
    renders: list[PendingRender] = field(default_factory=list)
    # Parameter names of exported functions, for the kernel-launch debug printer.
    function_args: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # -- planning ---------------------------------------------------------------

    def plan(self, archs: Sequence[CudaArch] | None = None) -> BuildPlan:
        """Flags, identity and build dir for ``archs`` (default: the target archs); renders
        the configs first (their content is part of the identity)."""
        for src in self.sources:
            if not src.is_file():
                raise FileNotFoundError(f"source {src} of module {self.name} does not exist")
        for pending in self.renders:
            pending.render()
        return make_plan(self, archs)

    def generated_files(self) -> list[Path]:
        """Every rendered file the module is built from (renders' outputs last)."""
        return [*self.generated_sources, *(pending.output for pending in self.renders)]

    @property
    def build_dir(self) -> Path:
        return self.plan().build_dir

    @property
    def library_path(self) -> Path:
        return self.plan().library_path

    @property
    def is_compiled(self) -> bool:
        """A built library and its manifest exist (it may still be stale)."""
        plan = self.plan()
        return plan.library_path.is_file() and Manifest.load(plan.build_dir) is not None

    @property
    def is_stale(self) -> bool:
        """Loading now would compile: not built, or an input's content changed."""
        if plan_index.lookup(self) is not None:
            return False
        plan = self.plan()
        if self._stale_reason(plan) is not None:
            return True
        plan_index.record(self, plan)
        return False

    # -- building ---------------------------------------------------------------

    def write_ninja(self, plan: BuildPlan | None = None) -> Path:
        """Write the module's build.ninja into its cache dir (without building)."""
        return write_build_file(plan or self.plan())

    def build(self, plan: BuildPlan | None = None) -> Path:
        """Bring the library up to date (compiling only what is stale); return its path.
        ``plan``: this spec's plan when the caller has it already."""
        plan = plan or self.plan()
        if config.disable_jit:
            raise JitDisabledError(
                f"module {self.name} is not built for this configuration ({plan.build_dir}) "
                "and FLASHINFER_DISABLE_JIT=1 forbids compiling it"
            )
        with env.writing_workspace(f"build module {self.name}"), module_lock(self.name) as locked:
            manifest = Manifest.load(plan.build_dir)
            reason = self._stale_reason(plan, manifest)
            if reason is None:
                return plan.library_path
            check_buildable(plan)
            archs = " ".join(f"sm_{a.sm}" for a in plan.archs)
            if manifest is None:
                logger.info("compiling %s for %s (%s)", self.name, archs, reason)
            else:
                logger.info("rebuilding %s for %s: %s", self.name, archs, reason)
            start = time.monotonic()
            if locked:
                build_in_place(plan, self.name, self.generated_files(), manifest)
            else:
                build_in_staging(plan, self.name, self.generated_files())
            logger.info("compiled %s in %.1f s", self.name, time.monotonic() - start)
        cache.touch(plan.build_dir)
        plan_index.record(self, plan)
        if config.cache_max_gb is not None:
            cache.evict(config.cache_max_gb * 1e9, keep={plan.build_dir})
        return plan.library_path

    def _stale_reason(self, plan: BuildPlan, manifest: Manifest | None = None) -> str | None:
        manifest = manifest or Manifest.load(plan.build_dir)
        return stale_reason(self.name, plan.identity, plan.build_dir, plan.library_path, manifest)

    # -- loading ----------------------------------------------------------------

    def load(self):  # noqa: ANN201 - returns tvm_ffi.Module
        """Load the built library (no freshness check; see build_and_load)."""
        path = self.plan().library_path
        if not path.is_file():
            raise FileNotFoundError(f"module {self.name} is not built: {path} does not exist")
        return self._load(path)

    def build_and_load(self):  # noqa: ANN201 - returns tvm_ffi.Module
        """Load the module: from an AOT layer when one has it, else from the JIT cache,
        compiling first if it is missing or stale."""
        known = plan_index.lookup(self)
        if known is not None:
            cache.touch(known.build_dir)
            return self._load(known.library_path)
        config.validate()
        precompiled = aot.find(self.name)
        if precompiled is not None:
            return self._load(precompiled)
        from . import remote  # the module repository: asked only where a compile would be

        try:
            plan = self.plan()
        except ToolchainError as err:
            downloaded = remote.fetch_library(self.name)
            if downloaded is not None:
                return self._load(downloaded)
            if config.disable_jit:
                raise JitDisabledError(
                    f"module {self.name} is in no AOT layer (FLASHINFER_AOT_DIR) and "
                    f"FLASHINFER_DISABLE_JIT=1 forbids compiling it ({err})"
                    f"{remote.failure_note(self.name)}"
                ) from None
            raise
        reason = self._stale_reason(plan)
        if reason is not None:
            shared = self._read_only_build(plan)
            if shared is not None:
                logger.debug("loading %s from the read-only workspace %s", self.name, shared)
                return self._load(shared)
            if config.disable_jit and plan.library_path.is_file():
                logger.warning(
                    "loading %s although %s (FLASHINFER_DISABLE_JIT=1)", self.name, reason
                )
            else:
                downloaded = remote.fetch_library(self.name)
                if downloaded is not None:
                    return self._load(downloaded)
                try:
                    self.build(plan)
                except JitDisabledError as err:
                    raise JitDisabledError(f"{err}{remote.failure_note(self.name)}") from None
        else:
            logger.debug("loading cached %s from %s", self.name, plan.build_dir)
            cache.touch(plan.build_dir)
            plan_index.record(self, plan)
        return self._load(plan.library_path)

    def _read_only_build(self, plan: BuildPlan) -> Path | None:
        """The up-to-date library of this identity in a read-only workspace, if any."""
        workspace = env.read_only_workspace()
        if workspace is None:
            return None
        build_dir = workspace / "cached_ops" / self.name / plan.digest
        library = build_dir / plan.ninja.output
        manifest = Manifest.load(build_dir)
        if (
            manifest is None
            or stale_reason(self.name, plan.identity, build_dir, library, manifest) is not None
        ):
            return None
        return library

    def _load(self, path: Path | str):  # noqa: ANN202
        import tvm_ffi

        module = tvm_ffi.load_module(str(path))
        if not config.debug_printer:
            return module
        return LaunchPrinter.from_config().instrument(module, self.name, self.function_args)


def gen_jit_spec(
    name: str,
    sources: Sequence[str | Path],
    *,
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str | Path] = (),
    supported_major_versions: Sequence[int] | None = None,
    generated_sources: Sequence[str | Path | PendingRender] = (),
    function_args: dict[str, Sequence[str]] | None = None,
) -> JitSpec:
    """Build a :class:`JitSpec`; relative source paths are taken from csrc/ (checked to
    exist when planned). ``generated_sources``: rendered files, or renders to do when the
    spec is planned."""
    return JitSpec(
        name=name,
        sources=[Path(env.FLASHINFER_CSRC_DIR, s) for s in sources],  # absolute ones stay
        extra_cflags=list(extra_cflags),
        extra_cuda_cflags=list(extra_cuda_cflags),
        extra_ldflags=list(extra_ldflags),
        extra_include_paths=[Path(p) for p in extra_include_paths],
        supported_major_versions=(
            list(supported_major_versions) if supported_major_versions is not None else None
        ),
        generated_sources=[Path(p) for p in generated_sources if not isinstance(p, PendingRender)],
        renders=[p for p in generated_sources if isinstance(p, PendingRender)],
        function_args={k: tuple(v) for k, v in (function_args or {}).items()},
    )
