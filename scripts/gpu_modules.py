"""Build the modules a GPU pass loads into one AOT layer, for sm_90a: every registered
module and every bfloat16 prefill tiling (the per-tiling tests and ``bench_prefill.py
--tilings all`` load them), in one ninja run. scripts/gpu_prebuild.sh runs it on the CPU
machine, so that a lent GPU's minutes are not spent compiling; scripts/gpu_pass.sh runs it
on the GPU machine when no carried layer loads there.

Usage: python scripts/gpu_modules.py OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flashinfer.jit.precompile import precompile
from flashinfer.jit.prefill import tiling_specs


def main(out: Path) -> int:
    start = time.monotonic()
    result = precompile(out, "9.0a", extra=[("prefill", spec) for spec in tiling_specs()])
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    print(f"{len(result.published)} modules in {out} in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
