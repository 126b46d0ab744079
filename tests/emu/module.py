"""A JIT module emulated whole: its kernel TUs (``*.cu``) built against the emulator's headers,
its binding TUs (``*.cc``) as they are (their few CUDA runtime calls reaching the stand-ins),
linked with the engine into one tvm-ffi module. Its functions take CPU tensors and hand them
to the binding as CUDA tensors on device 0 (the same memory, the DLPack device relabelled),
so the binding's own checks, its reading of shapes and strides and the launcher structs it
fills run as on a GPU, and the kernels read and write host memory."""

from __future__ import annotations

import contextlib
import ctypes
from types import ModuleType
from typing import Any, Callable, Iterator

import torch
import tvm_ffi

from flashinfer import checks
from flashinfer.attention_args import WorkspaceOwner
from flashinfer.jit.core import JitSpec
from flashinfer.jit.toolchain import current_toolchain
from tests.compile import cpu_kernels

from . import profile
from .engine import EmulatedLaunch, build_library, extent

_DL_CUDA = 2  # DLDeviceType kDLCUDA
_DEVICE_TYPE_OFFSET = 8  # DLTensor: void* data, then DLDevice {int32 device_type, device_id}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def as_cuda(t: torch.Tensor) -> tvm_ffi.Tensor:
    """``t`` (a CPU tensor) as a tvm-ffi tensor on cuda:0 sharing its memory."""
    capsule = torch.utils.dlpack.to_dlpack(t.detach())
    managed = _capsule_pointer(capsule, b"dltensor")  # DLManagedTensor*: its DLTensor first
    ctypes.c_int32.from_address(managed + _DEVICE_TYPE_OFFSET).value = _DL_CUDA
    return tvm_ffi.from_dlpack(capsule)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges ``a`` and ``b`` span intersect."""
    (a0, a_bytes), (b0, b_bytes) = extent(a), extent(b)
    return a0 < b0 + b_bytes and b0 < a0 + a_bytes


def _poison(t: torch.Tensor) -> None:
    """Fills ``t`` with what no kernel writes: NaN, or for integers and bools 0xa5 bytes (a
    bool reads as neither True nor False in its bytes, ``t.view(torch.uint8)``)."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0xA5)


class EmulatedModule:
    """The module of ``spec`` on the emulator, with the schedule ``land_at_issue`` and
    ``reverse`` (tests/emu/engine.py). Calling a function registers every tensor argument
    as a buffer its kernels may read, poisons the arguments ``outputs[function]`` names first
    (so a row a kernel does not write shows; not one that shares memory with another
    argument, an in-place call's input), and records the arguments by name
    in ``launches``. A failed launch raises the binding's RuntimeError with the emulator's
    message (block, thread and cause)."""

    def __init__(
        self,
        spec: JitSpec,
        outputs: dict[str, tuple[str, ...]],
        land_at_issue: bool = False,
        reverse: bool = False,
    ) -> None:
        for pending in spec.renders:
            pending.render()
        generated = sorted({f.parent for f in spec.generated_files()})
        toolchain = current_toolchain()
        library = build_library(
            f"{spec.name}_emu",
            [s for s in spec.sources if s.suffix == ".cu"],
            [*generated, *spec.extra_include_paths],
            host_sources=tuple(s for s in spec.sources if s.suffix != ".cu"),
            host_flags=(
                *(f"-isystem{p}" for p in toolchain.tvm_ffi_include_dirs),
                *spec.extra_cflags,
            ),
            link_flags=(
                f"-L{toolchain.tvm_ffi_lib_dir}",
                "-ltvm_ffi",
                f"-Wl,-rpath,{toolchain.tvm_ffi_lib_dir}",
            ),
        )
        self.name = spec.name
        self.launches: list[dict[str, Any]] = []
        self._module = tvm_ffi.load_module(library._name)
        self._launch = EmulatedLaunch(library, land_at_issue, reverse)
        profile.attach(library)
        self._args = spec.function_args
        self._outputs = outputs

    def profiling(self) -> contextlib.AbstractContextManager[profile.Profile]:
        """Profiles this module's launches inside the block (tests/emu/profile.py)."""
        return profile.profiling(self._launch.library)

    def __getattr__(self, function: str) -> Callable[..., Any]:
        if function.startswith("_") or function not in self._args:
            raise AttributeError(function)
        names = self._args[function]

        def call(*args: Any) -> Any:
            named = dict(zip(names, args, strict=True))
            self.launches.append(named)
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            for name in self._outputs.get(function, ()):
                out = named[name]
                others = [t for n, t in named.items() if n != name and isinstance(t, torch.Tensor)]
                if out is not None and not any(_overlap(out, t) for t in others):
                    _poison(out)
            converted = [as_cuda(a) if isinstance(a, torch.Tensor) else a for a in args]
            return self._launch.call(tensors, lambda: getattr(self._module, function)(*converted))

        return call


@contextlib.contextmanager
def on_cpu_tensors(monkeypatch: Any, *apis: ModuleType) -> Iterator[None]:
    """What emulated modules' APIs (``flashinfer.norm``, ...) need to run on CPU tensors:
    their device checks pass them, PDL is off (no GPU to ask), a wrapper's plan() uploads
    its schedule with a plain copy, and their ops have CPU kernels."""
    monkeypatch.setattr(checks, "check_cuda", lambda *a, **k: None)
    for api in apis:
        if hasattr(api, "resolve_enable_pdl"):
            monkeypatch.setattr(api, "resolve_enable_pdl", lambda enable_pdl, device: False)
    monkeypatch.setattr(
        WorkspaceOwner,
        "_upload",
        lambda self, words, target: target.copy_(torch.tensor(words, dtype=target.dtype)),
    )
    with cpu_kernels(*apis):
        yield


@contextlib.contextmanager
def emulating(
    monkeypatch: Any, api: ModuleType, getter: str, modules: Callable[[Any], EmulatedModule]
) -> Iterator[str]:
    """``api``'s ``getter`` (``get_rope_module``, ...) then returns ``modules(dtype)``, an
    emulated module, and the API takes CPU tensors (see on_cpu_tensors); yields their device."""
    monkeypatch.setattr(api, getter, modules)
    with on_cpu_tensors(monkeypatch, api):
        yield "cpu"
