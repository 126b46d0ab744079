"""A test-only JIT module for the debug printer and the timing tools (sources beside this file)."""

from __future__ import annotations

from pathlib import Path

from flashinfer.jit import JitSpec, gen_jit_spec

HERE = Path(__file__).resolve().parent


def debug_spec() -> JitSpec:
    return gen_jit_spec(
        "debug_test",
        [HERE / "kernels.cu", HERE / "binding.cc"],
        function_args={
            "scale": ("out", "x", "factor"),
            "poison": ("out",),
            "fill": ("x", "value"),
            "spin": ("x", "ns"),
        },
    )
