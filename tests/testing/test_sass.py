"""flashinfer.testing.sass on real machine code (CPU: compile for sm_90a, read the SASS): the
head_dim 128 m1kv64 prefill kernel has one main loop, and what a K/V tile costs in it follows
from the tiling: its mma, ldmatrix and cp.async counts, and no local memory; in the default
(overlapping) form, one block of the loop interleaves the next tile's score mma with this
tile's softmax. The attention kernels load only their plan words before PDL's wait. Skips when
cuobjdump or nvdisasm (the nvidia-cuda-cuobjdump/-nvdisasm wheels) is missing."""

from __future__ import annotations

import pytest
import torch

from flashinfer.jit.core import JitSpec
from flashinfer.jit.decode import gen_decode_module
from flashinfer.jit.prefill import DEFAULT_TILINGS, PrefillTiling, gen_prefill_module
from flashinfer.testing.sass import (
    Instruction,
    blocks,
    cuobjdump_sass,
    instructions,
    loops,
    sass_by_kernel,
)
from tests.conftest import REPO_ROOT, run_python

SASS_SAMPLE = """
        Function : kernel
        /*0000*/                   MOV R1, c[0x0][0x28] ;   /* 0x00000a0000017a02 */
        /*0010*/                   BSSY B0, 0x50 ;          /* 0x0000003000007945 */
        /*0020*/              @!P0 BRA 0x40 ;               /* 0x0000001000008947 */
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0040*/                   BSYNC B0 ;
        /*0050*/                   ISETP.GE.AND P0, PT, R2, 0x4, PT ;
        /*0060*/              @!P0 BRA 0x10 ;
        /*0070*/                   EXIT ;
"""


def test_instructions_loops_and_blocks_of_a_listing() -> None:
    code = instructions(SASS_SAMPLE)
    assert [i.address for i in code] == list(range(0, 0x80, 0x10))
    assert [i.opcode for i in code[2:5]] == ["BRA", "HMMA", "BSYNC"]
    assert code[2].text == "@!P0 BRA 0x40" and code[2].target == 0x40
    assert code[0].is_move and not any(i.is_move for i in code[1:])
    assert code[1].target == 0x50 and code[3].target is None
    (loop,) = loops(code)  # 0x60 branches back to 0x10; 0x20 branches forward
    assert (loop.start, loop.end, len(loop.body)) == (0x10, 0x60, 6)
    assert loop.opcodes()["HMMA"] == 1
    starts = [b.start for b in blocks(code, loop)]
    assert starts == [0x10, 0x30, 0x40, 0x50]  # after a branch, at targets 0x40 and 0x50
    assert [i for b in blocks(code, loop) for i in b.body] == list(loop.body)


def _tile_counts(head_dim: int, tiling: PrefillTiling) -> dict[str, int]:
    """What one K/V tile costs a warp of the prefill kernel, by the tiling's arithmetic."""
    m, kv, dims = tiling.m_tiles, tiling.tile_kv, head_dim // 16
    return {
        # S = Q K^T (16 x kv per m-tile, k 16) and O += P V (16 x head_dim, k 16)
        "HMMA": m * (kv // 8 * dims + 2 * dims * kv // 16),
        # ldmatrix x4: Q's fragments per m-tile, then K's and V's 16 x 16 blocks
        "LDSM": m * dims + 2 * (kv // 16) * dims,
        # cp.async of 16 bytes: the K and V tiles spread over the CTA's threads
        "LDGSTS": 2 * kv * (head_dim // 8) // tiling.threads,
    }


def _prefill_code(head_dim: int, tiling: PrefillTiling) -> list[Instruction]:
    try:
        text = cuobjdump_sass(gen_prefill_module(torch.bfloat16, head_dim, tiling).build())
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    (sass,) = {s for name, s in sass_by_kernel(text).items() if "PrefillKernel" in name}
    code = instructions(sass)
    assert not any(i.opcode in ("LDL", "STL") for i in code), "a spill"
    return code


def test_the_prefill_loop_costs_what_its_tiling_says() -> None:
    tiling = PrefillTiling(1, 64)
    code = _prefill_code(128, tiling)
    with_mma = [loop for loop in loops(code) if loop.opcodes()["HMMA"]]
    assert len(with_mma) == 1, "one main loop: masked and unmasked tiles share its mma"
    ops = with_mma[0].opcodes()
    for opcode, count in _tile_counts(128, tiling).items():
        assert ops[opcode] == count, opcode


def test_the_overlapped_loop_computes_scores_during_the_softmax() -> None:
    """The default tiling's main loop, unrolled by two, has in each half a block with the next
    tile's S = Q K^T (its HMMA and LDSM) and this tile's exponentials (MUFU), interleaved by
    the compiler: no long run of tensor-core and ldmatrix instructions without softmax work
    between them (back to back, the 104 would be one run). The two tiles' scores swap
    registers between the halves: no block with mma copies them (32 moves a tile before)."""
    tiling = DEFAULT_TILINGS[128]
    assert tiling.overlap
    code = _prefill_code(128, tiling)
    main = max(loops(code), key=lambda loop: loop.opcodes()["HMMA"])
    dims, kv = 128 // 16, tiling.tile_kv
    with_mma = [b for b in blocks(code, main) if b.opcodes()["HMMA"]]
    fused = [
        b
        for b in with_mma
        if b.opcodes()["HMMA"] == kv // 8 * dims and b.opcodes()["MUFU"] >= kv // 2
    ]
    assert len(fused) == 2, "each half of the loop holds the next tile's scores and this one's exp2"
    for block in fused:
        assert block.opcodes()["LDSM"] == dims + kv // 16 * dims
        longest = run = 0
        for inst in block.body:
            run = run + 1 if inst.opcode in ("HMMA", "LDSM") else 0
            longest = max(longest, run)
        assert longest <= 12, f"{longest} tensor-core instructions in a row"
    for block in with_mma:
        moves = sum(inst.is_move for inst in block.body)
        assert moves < kv // 8, f"{moves} register moves in the block at {block.start:#x}"


# Words each kernel reads of its plan: the item count, the chunk size and the item's columns
# (schedule.cuh); a merge's count, its position's two indptr words and its output row.
PLAN_LOADS = {
    "PrefillKernel": 2 + 5,
    "DecodeKernel": 2 + 4,
    "MergeChunksKernel": 4,
    "MergeStatesKernel": 4,
}
MEMORY_OPCODES = ("LDG", "STG", "LD", "ST", "LDGSTS", "ATOM", "ATOMG", "RED")


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_only_the_plan_words_load_before_the_pdl_wait(family: str) -> None:
    """Launched with PDL, a kernel may start while the one before it still writes; only
    plan()'s host copies write the schedule, so its words load before griddepcontrol.wait
    (ACQBULK), under the previous kernel's tail, and no other global access comes first. The
    attention kernels trigger the next launch (PREEXIT) right after their wait, before any
    K/V copy, so that a split request's merge launches while the chunks run."""
    spec: JitSpec = (
        gen_decode_module(torch.bfloat16, 128)
        if family == "decode"
        else gen_prefill_module(torch.bfloat16, 128, DEFAULT_TILINGS[128])
    )
    try:
        text = cuobjdump_sass(spec.build())
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    checked: set[str] = set()
    for name, sass in sass_by_kernel(text).items():
        (kind,) = [kind for kind in PLAN_LOADS if kind in name]
        code = instructions(sass)
        (wait,) = [i for i in code if i.opcode == "ACQBULK"]
        early = [i.opcode for i in code if i.address < wait.address]
        assert [op for op in early if op in MEMORY_OPCODES] == ["LDG"] * PLAN_LOADS[kind], name
        triggers = [i for i in code if i.opcode == "PREEXIT"]
        if kind.startswith("Merge"):
            assert not triggers, name
        else:
            (trigger,) = triggers
            first_copy = min(i.address for i in code if i.opcode == "LDGSTS")
            assert wait.address < trigger.address < first_copy, name
        checked.add(kind)
    work = "DecodeKernel" if family == "decode" else "PrefillKernel"
    merge = "MergeChunksKernel" if family == "decode" else "MergeStatesKernel"
    assert checked == {work, merge}


def test_the_cli_prints_the_prefill_loop_and_its_blocks() -> None:
    proc = run_python(
        "import sys, runpy; sys.argv = ['sass_loops.py', '--prefill', 'bfloat16:128:m1kv64', "
        "'--blocks']; runpy.run_path('benchmarks/sass_loops.py', run_name='__main__')",
        cwd=REPO_ROOT,
        check=False,
    )
    if "nvdisasm are needed" in proc.stderr:
        pytest.skip("cuobjdump and nvdisasm are needed")
    assert proc.returncode == 0, proc.stderr
    counts = _tile_counts(128, PrefillTiling(1, 64))
    assert f"HMMA {counts['HMMA']}  LDSM {counts['LDSM']}" in proc.stdout  # the main loop
    assert "LDL/STL 0" in proc.stdout and "@!P0 BRA" in proc.stdout  # a block's branch
