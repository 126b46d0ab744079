"""A tiny test-only JIT module written into a temp dir, so tests can edit its headers.

kernel.cu includes a.cuh (never b.cuh) and returns A_VALUE from a host function;
binding.cc exports ``a_value()`` (host-only) through tvm-ffi.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from flashinfer.jit import JitSpec, gen_jit_spec

KERNEL = """
#include "tiny/a.cuh"
__global__ void tiny_kernel(int* out) { *out = A_VALUE; }
int tiny_a_value() { return A_VALUE; }
"""

BINDING = """
#include <tvm/ffi/function.h>
int tiny_a_value();
int64_t AValue() { return tiny_a_value(); }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(a_value, AValue);
"""


def write_tiny_sources(root: Path, a_value: int = 1) -> Path:
    (root / "include" / "tiny").mkdir(parents=True, exist_ok=True)
    (root / "include" / "tiny" / "a.cuh").write_text(f"#pragma once\n#define A_VALUE {a_value}\n")
    (root / "include" / "tiny" / "b.cuh").write_text("#pragma once\n#define B_VALUE 2\n")
    (root / "kernel.cu").write_text(KERNEL)
    (root / "binding.cc").write_text(BINDING)
    return root


def tiny_spec(root: Path, name: str = "tiny_test_module", **kwargs) -> JitSpec:
    return gen_jit_spec(
        name,
        [root / "kernel.cu", root / "binding.cc"],
        extra_include_paths=[root / "include"],
        **kwargs,
    )


def load_fresh(path: Path, scratch: Path):
    """Load a copy of a library (made under the test's ``scratch`` dir): dlopen returns
    the first handle for a path it has seen, so a rebuilt library at the same path must be
    loaded from a new one."""
    import tvm_ffi

    copy = scratch / f"load-{len(list(scratch.glob('load-*')))}" / path.name
    copy.parent.mkdir(parents=True)
    shutil.copy2(path, copy)
    return tvm_ffi.load_module(str(copy))
