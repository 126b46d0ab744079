"""Build the modules a GPU pass loads into one AOT layer, for sm_90a, in one ninja run:
every registered module, every bfloat16 prefill tiling (the per-tiling tests and
``bench_prefill.py --tilings all`` load them), every prefill build at the tiling of the
GPU tests' "other-tiling" runs, and the builds only tests load (fp8 caches with ALiBi,
fp8 page appends, the debug module, the random attention cases' GPU runs); a GPU test
builds what it lacks one module at a time.

Only what the layer lacks is built: a module already there is kept when its library loads
with every symbol bound (RTLD_NOW: a lazily bound one would kill a test process at its
first call) and its record matches this process, and removed when it does not load.
scripts/gpu_prebuild.sh runs it on the CPU machine into an empty dir, so that a lent GPU's
minutes are not spent compiling; scripts/gpu_pass.sh runs it on the GPU machine over the
carried layer, which then builds only what that layer cannot serve there.

Usage: python scripts/gpu_modules.py OUT_DIR
"""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import sys
import time
from pathlib import Path

from flashinfer.jit import aot
from flashinfer.jit.arch import parse_arch_list
from flashinfer.jit.core import JitSpec
from flashinfer.jit.decode import gen_decode_module
from flashinfer.jit.page import gen_page_module
from flashinfer.jit.precompile import precompile
from flashinfer.jit.prefill import PrefillTiling, gen_prefill_module, prefill_variants, tiling_specs
from flashinfer.jit.registry import registered_ops, specs_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.debug.debug_module import debug_spec  # noqa: E402
from tests.ops.test_decode import FP8_CASES  # noqa: E402
from tests.ops.test_prefill_gpu import OTHER_TILINGS  # noqa: E402

RANDOM_CASES = ("prefill", "decode", "cascade")  # tests/ops/test_*_fuzz_emulated.py: GPU tests

ARCHS = "9.0a"


def other_tiling_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of each prefill op's builds at OTHER_TILINGS' tiling."""
    return [
        (op, gen_prefill_module(tiling=PrefillTiling(*OTHER_TILINGS[kw["head_dim"]]), **kw))
        for op, variants in prefill_variants().items()
        for kw in variants
    ]


def test_only_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of builds GPU tests load that no op registers: decode's fp8 cases with a
    position encoding (each also runs through the prefill kernel's build), fp8 page appends
    and the debug printer's test module."""
    specs: list[tuple[str, JitSpec]] = []
    for kv_dtype, pos, *_, head_dim, _page, _layout, dtype in FP8_CASES:
        if pos != "NONE":
            specs.append(("decode", gen_decode_module(dtype, head_dim, pos, kv_dtype)))
            specs.append(("prefill", gen_prefill_module(dtype, head_dim, None, pos, kv_dtype)))
    specs += [("page", gen_page_module(d)) for d in ("float8_e4m3fn", "float8_e5m2")]
    specs.append(("debug", debug_spec()))
    return specs


def wanted() -> list[tuple[str, JitSpec]]:
    """Every (op, spec) a pass loads, each module once."""
    pairs = [(op, spec) for op in registered_ops() for spec in specs_for([op])]
    pairs += [("prefill", spec) for spec in tiling_specs()]
    pairs += other_tiling_specs() + test_only_specs()
    for family in RANDOM_CASES:
        pairs += importlib.import_module(f"tests.ops.test_{family}_fuzz_emulated").gpu_specs()
    first: dict[str, tuple[str, JitSpec]] = {}
    for op, spec in pairs:
        first.setdefault(spec.name, (op, spec))
    return list(first.values())


def drop_unloadable(out: Path) -> list[str]:
    """Remove the modules in ``out`` whose library does not load here with every symbol
    bound; their names."""
    import torch  # noqa: F401 - loads the CUDA runtime the libraries link
    import tvm_ffi  # noqa: F401 - and the tvm-ffi library

    dropped = []
    for library in sorted(out.glob("[!.]*/*.so")):
        try:
            ctypes.CDLL(str(library), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as err:
            print(f"does not load here: {err}")
            shutil.rmtree(library.parent)
            dropped.append(library.parent.name)
    return dropped


def main(out: Path) -> int:
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    dropped = drop_unloadable(out)
    target = aot.Target.current(parse_arch_list(ARCHS))
    pairs = wanted()
    todo = [(op, spec) for op, spec in pairs if aot.layer_library(out, spec.name, target) is None]
    print(
        f"{len(pairs) - len(todo)} of {len(pairs)} modules in {out} serve this process "
        f"({len(dropped)} removed: they do not load here); building {len(todo)}"
    )
    if todo:
        result = precompile(out, ARCHS, ops=[], extra=todo)
        for name, reason in result.skipped.items():
            print(f"skipped {name}: {reason}")
        print(f"{len(result.published)} modules built into {out}")
    print(f"done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
