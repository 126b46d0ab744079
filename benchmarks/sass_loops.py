"""The static shape of kernels' inner loops, read from their SASS without a GPU: for each loop
(a backward branch) its instructions, and of them the tensor-core mma (HMMA), ldmatrix (LDSM),
cp.async (LDGSTS), special-function (MUFU), barrier (BAR) and local-memory (LDL/STL) ones, and
instructions per HMMA; with --blocks, the basic blocks of each kernel's loop with the most
HMMA, to count one path through it (a tile with no mask, say) by hand.

    python benchmarks/sass_loops.py --prefill bfloat16:128:m1kv64 [--blocks]
    python benchmarks/sass_loops.py --object FILE --kernel flash_fwd_kernel [--blocks]

--prefill builds our prefill module (dtype:head_dim[:tiling]) for --arch (9.0a); --object reads any
object, shared library or cubin (a peer's, e.g. a cubin that ``cuobjdump -xelf`` took out of
torch's libtorch_cuda.so). docs/attention.md has what this showed for the prefill kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashinfer.jit.arch import CudaArch
from flashinfer.testing.sass import (
    blocks,
    cuobjdump_sass,
    instructions,
    loops,
    sass_by_kernel,
)

COLUMNS = ("HMMA", "LDSM", "LDGSTS", "MUFU", "BAR")


def _prefill_library(raw: str, arch: CudaArch) -> Path:
    import torch

    from flashinfer.jit.prefill import PrefillTiling, gen_prefill_module

    dtype, head_dim, *tiling = raw.split(":")
    chosen = PrefillTiling.from_name(tiling[0]) if tiling else None
    if tiling and chosen is None:
        raise SystemExit(f"--prefill: {tiling[0]!r} is not a tiling name like m1kv64")
    spec = gen_prefill_module(getattr(torch, dtype), int(head_dim), chosen)
    return spec.build(spec.plan([arch]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prefill", metavar="DTYPE:HEAD_DIM[:TILING]")
    source.add_argument("--object", type=Path, metavar="FILE")
    parser.add_argument("--kernel", default="", help="a part of the kernels' mangled names")
    parser.add_argument("--arch", default="9.0a", help="whose code to build and read (9.0a)")
    parser.add_argument("--blocks", action="store_true", help="list the hottest loop's blocks")
    args = parser.parse_args(argv)

    arch = CudaArch.parse(args.arch, "--arch")
    obj = _prefill_library(args.prefill, arch) if args.prefill else args.object
    kernels = {
        name: sass
        for name, sass in sass_by_kernel(cuobjdump_sass(obj, f"sm_{arch.sm}")).items()
        if args.kernel in name
    }
    if not kernels:
        print(f"no kernel matching {args.kernel!r} for {args.arch} in {obj}", file=sys.stderr)
        return 1
    for name, sass in kernels.items():
        code = instructions(sass)
        print(f"{name[:150]}: {len(code)} instructions")
        found = loops(code)
        for loop in found:
            ops = loop.opcodes()
            counts = "  ".join(f"{op} {ops[op]}" for op in COLUMNS)
            local = ops["LDL"] + ops["STL"]
            per_mma = f"{len(loop.body) / ops['HMMA']:.2f}" if ops["HMMA"] else "-"
            print(
                f"  loop {loop.start:#07x}-{loop.end:#07x}: {len(loop.body)} instructions  "
                f"{counts}  LDL/STL {local}  per HMMA {per_mma}"
            )
        if args.blocks and found:
            hottest = max(found, key=lambda loop: loop.opcodes()["HMMA"])
            for block in blocks(code, hottest):
                ops = block.opcodes()
                counts = "  ".join(f"{op} {ops[op]}" for op in COLUMNS[:4] if ops[op])
                last = block.body[-1].text
                print(f"    {block.start:#07x} {len(block.body):4d}  {counts:40s} {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
