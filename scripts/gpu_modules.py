"""Build the modules a GPU pass loads into one AOT layer, for sm_90a, in one ninja run:
every registered module, every bfloat16 prefill tiling (the per-tiling tests and
``bench_prefill.py --tilings all`` load them) and every prefill build at the tiling of the
GPU tests' "other-tiling" runs (a GPU test builds what it lacks one module at a time).
scripts/gpu_prebuild.sh runs it on the CPU machine, so that a lent GPU's minutes are not
spent compiling; scripts/gpu_pass.sh runs it on the GPU machine when no carried layer
loads there.

Usage: python scripts/gpu_modules.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flashinfer.jit.core import JitSpec
from flashinfer.jit.precompile import precompile
from flashinfer.jit.prefill import PrefillTiling, gen_prefill_module, prefill_variants, tiling_specs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.ops.test_prefill_gpu import OTHER_TILINGS  # noqa: E402


def other_tiling_specs() -> list[tuple[str, JitSpec]]:
    """(op, spec) of each prefill op's builds at OTHER_TILINGS' tiling."""
    return [
        (op, gen_prefill_module(tiling=PrefillTiling(*OTHER_TILINGS[kw["head_dim"]]), **kw))
        for op, variants in prefill_variants().items()
        for kw in variants
    ]


def main(out: Path) -> int:
    start = time.monotonic()
    extra = [("prefill", spec) for spec in tiling_specs()] + other_tiling_specs()
    result = precompile(out, "9.0a", extra=extra)
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    print(f"{len(result.published)} modules in {out} in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
