"""The machine code (SASS) of compiled CUDA objects, read without a GPU: ``cuobjdump -sass``
(from the nvidia-cuda-cuobjdump and -nvdisasm wheels, or a CUDA toolkit) split per kernel,
each kernel's registers, stack and local memory, and the static shape of a kernel's loops,
by opcode. The SASS tests assert facts with it;
``benchmarks/sass_loops.py`` compares inner loops (ours, a peer's) where no GPU can time them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Block",
    "Instruction",
    "Loop",
    "Resources",
    "Span",
    "blocks",
    "cuobjdump_sass",
    "find_cuda_tool",
    "instructions",
    "loops",
    "resource_usage",
    "sass_by_kernel",
]

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")
_TARGET = re.compile(r"\b(?:BRA|BSSY)\b.*?(0x[0-9a-f]+)")
_ENDS_BLOCK = re.compile(r"\b(?:BRA|EXIT|RET|BSYNC)\b")


def _tool_dirs() -> list[Path]:
    """Where a CUDA binary tool may be besides PATH: nvcc's folder, the nvidia-* wheels'."""
    dirs = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(Path(nvcc).resolve().parent)
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        dirs += [bin_dir for root in nvidia.__path__ for bin_dir in Path(root).glob("*/bin")]
    except ImportError:
        pass
    return dirs


def find_cuda_tool(name: str) -> Path | None:
    """``name`` (cuobjdump, nvdisasm, ...) on PATH, beside nvcc or in an nvidia-* wheel."""
    found = shutil.which(name)
    if found:
        return Path(found)
    return next((d / name for d in _tool_dirs() if (d / name).is_file()), None)


def cuobjdump_sass(obj: Path, arch: str | None = None) -> str:
    """``cuobjdump -sass`` of an object, shared library or cubin (only ``arch``'s code, e.g.
    "sm_90a", when given). FileNotFoundError names the wheels when a tool is missing
    (cuobjdump runs nvdisasm, found through NVDISASM_PATH)."""
    cuobjdump, nvdisasm = find_cuda_tool("cuobjdump"), find_cuda_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        raise FileNotFoundError(
            "cuobjdump and nvdisasm are needed: pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm"
        )
    env = dict(os.environ, NVDISASM_PATH=str(nvdisasm.parent))
    command = [str(cuobjdump), "-sass", *(["-arch", arch] if arch else []), str(obj)]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout


@dataclass(frozen=True)
class Resources:
    """What a kernel's code reserves per thread (bytes, but registers) and per CTA (static
    shared memory): a spill shows as stack and local memory."""

    registers: int
    stack: int
    local: int
    shared: int


_USAGE = re.compile(
    r"^\s*Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", re.M
)


def resource_usage(obj: Path) -> list[tuple[str, Resources]]:
    """``cuobjdump --dump-resource-usage`` of an object or shared library: (mangled kernel
    name, its resources) for each kernel of each architecture's code. It reads the code
    itself, so a library linked from cached objects reports what a fresh build would.
    FileNotFoundError names the wheel when cuobjdump is missing."""
    cuobjdump = find_cuda_tool("cuobjdump")
    if cuobjdump is None:
        raise FileNotFoundError("cuobjdump is needed: pip install nvidia-cuda-cuobjdump")
    command = [str(cuobjdump), "--dump-resource-usage", str(obj)]
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [
        (name, Resources(int(reg), int(stack), int(local), int(shared)))
        for name, reg, stack, shared, local in _USAGE.findall(text)
    ]


def sass_by_kernel(text: str) -> dict[str, str]:
    """cuobjdump's output split into {mangled kernel name: its SASS}."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str  # "@!P0 BRA 0x2d20", without the trailing ';'

    @property
    def mnemonic(self) -> str:
        """The instruction without its predicate and operands: IMAD.MOV.U32, BRA, ..."""
        return _PREDICATE.sub("", self.text).split()[0]

    @property
    def opcode(self) -> str:
        """The mnemonic without its modifiers: HMMA, LDSM, BRA, ..."""
        return self.mnemonic.split(".")[0]

    @property
    def is_move(self) -> bool:
        """A register copy: MOV, or IMAD.MOV (ptxas's usual spelling of one)."""
        return self.mnemonic.startswith(("MOV", "IMAD.MOV"))

    @property
    def target(self) -> int | None:
        """Where a branch (or a BSSY's reconvergence point) leads."""
        match = _TARGET.search(self.text)
        return int(match[1], 16) if match else None


def instructions(sass: str) -> list[Instruction]:
    """One kernel's instructions, in address order."""
    return [Instruction(int(a, 16), text) for a, text in _LINE.findall(sass)]


@dataclass(frozen=True)
class Span:
    """A run of consecutive instructions."""

    body: tuple[Instruction, ...]

    @property
    def start(self) -> int:
        return self.body[0].address

    @property
    def end(self) -> int:
        return self.body[-1].address

    def opcodes(self) -> Counter[str]:
        return Counter(i.opcode for i in self.body)


class Loop(Span):
    """The instructions from a backward branch's target to the branch: a loop's static body,
    every path through it included."""


class Block(Span):
    """A straight run of instructions: it starts at a branch target (or after a block's end)
    and ends at a branch, exit or reconvergence, or before the next target."""


def loops(code: list[Instruction]) -> list[Loop]:
    """Every backward branch's loop, in address order of the branches."""
    index = {i.address: n for n, i in enumerate(code)}
    found = []
    for n, inst in enumerate(code):
        target = inst.target
        if inst.opcode == "BRA" and target is not None and target <= inst.address:
            if target in index:
                found.append(Loop(tuple(code[index[target] : n + 1])))
    return found


def blocks(code: list[Instruction], within: Loop | None = None) -> list[Block]:
    """``code`` (or the part of it ``within`` a loop) cut into basic blocks; follow a path by
    hand from the last instruction of each (its branch and target) to count one route."""
    targets = {t for i in code if (t := i.target) is not None}
    span = within.body if within else tuple(code)
    result: list[Block] = []
    current: list[Instruction] = []
    for inst in span:
        if current and inst.address in targets:
            result.append(Block(tuple(current)))
            current = []
        current.append(inst)
        if _ENDS_BLOCK.search(inst.text):
            result.append(Block(tuple(current)))
            current = []
    if current:
        result.append(Block(tuple(current)))
    return result
