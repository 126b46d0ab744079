"""Target CUDA architectures: parsed from FLASHINFER_CUDA_ARCH_LIST or read off the GPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ..config import config

_ARCH_RE = re.compile(r"^(?:sm_)?(\d+)\.(\d)([af]?)$")
_SEPARATORS_RE = re.compile(r"[\s,;]+")


class NoTargetArchError(RuntimeError):
    """No arch to compile for: no visible GPU and no FLASHINFER_CUDA_ARCH_LIST, or none of
    the target archs is one the module supports. The message starts with the reference's
    wording, which users grep for, and goes on with the details."""

    PREFIX = "No supported CUDA architectures found"

    def __init__(self, details: str) -> None:
        super().__init__(f"{self.PREFIX}: {details}")


@dataclass(frozen=True, order=True)
class CudaArch:
    major: int
    minor: int
    suffix: str = ""  # "a" (arch-specific) or "f" (family), as nvcc spells them

    @classmethod
    def parse(cls, text: str, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> CudaArch:
        """``source`` names where the text came from, for the error message."""
        match = _ARCH_RE.match(text.strip())
        if not match:
            raise ValueError(
                f"invalid CUDA arch {text!r} in {source}; "
                'expected entries like "8.0", "9.0a" or "10.0a"'
            )
        return cls(int(match[1]), int(match[2]), match[3])

    @property
    def sm(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def gencode(self) -> str:
        return f"-gencode=arch=compute_{self.sm},code=sm_{self.sm}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


def parse_arch_list(text: str, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> tuple[CudaArch, ...]:
    tokens = [t for t in _SEPARATORS_RE.split(text) if t]
    if not tokens:
        raise ValueError(f"{source} names no arch")
    return tuple(sorted(set(CudaArch.parse(t, source) for t in tokens)))


def visible_capabilities() -> tuple[tuple[int, int], ...]:
    """(major, minor) of each visible GPU, in device order; () without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return ()
    return tuple(
        tuple(torch.cuda.get_device_capability(i))  # type: ignore[misc]
        for i in range(torch.cuda.device_count())
    )


def arch_for_capability(major: int, minor: int) -> CudaArch:
    """The arch the JIT compiles for a GPU: Hopper and Blackwell kernels use arch-specific
    instructions (wgmma, tcgen05), so those get the ``a`` variant."""
    return CudaArch(major, minor, "a" if major in (9, 10, 12) else "")


def runs_on(arch: CudaArch, capability: tuple[int, int]) -> bool:
    """Whether a cubin built for ``arch`` runs on a GPU of ``capability``: same major and a
    minor at most the GPU's; arch-specific ``a`` code only on exactly its GPU."""
    if arch.major != capability[0]:
        return False
    return arch.minor == capability[1] if arch.suffix == "a" else arch.minor <= capability[1]


def covers(
    built: Iterable[CudaArch],
    listed: Iterable[CudaArch] | None,
    capabilities: Iterable[tuple[int, int]],
) -> bool:
    """Whether a binary built for ``built`` serves this process: every arch of an explicit
    list (a plain ``X.Y`` is also served by ``X.Ya``), else every visible GPU."""
    built = set(built)
    if listed is not None:
        return all(
            a in built or (not a.suffix and CudaArch(a.major, a.minor, "a") in built)
            for a in listed
        )
    return all(any(runs_on(a, cap) for a in built) for cap in capabilities)


def _visible_gpu_archs() -> tuple[CudaArch, ...]:
    return tuple(sorted({arch_for_capability(*cap) for cap in visible_capabilities()}))


def target_archs() -> tuple[CudaArch, ...]:
    """The archs to compile for, from FLASHINFER_CUDA_ARCH_LIST, else the visible GPUs."""
    text = config.cuda_arch_list
    if text is not None:
        return parse_arch_list(text)
    archs = _visible_gpu_archs()
    if not archs:
        raise NoTargetArchError(
            "no CUDA arch to compile for: no GPU is visible and FLASHINFER_CUDA_ARCH_LIST "
            'is not set (set it, e.g. FLASHINFER_CUDA_ARCH_LIST="9.0a")'
        )
    return archs


def filter_archs(
    archs: Iterable[CudaArch], supported_majors: Iterable[int] | None, name: str
) -> tuple[CudaArch, ...]:
    """Keep the archs whose major a module supports; none left is an error."""
    archs = tuple(archs)
    if supported_majors is None:
        return archs
    majors = set(supported_majors)
    kept = tuple(a for a in archs if a.major in majors)
    if not kept:
        raise NoTargetArchError(
            f"module {name} supports SM majors {sorted(majors)}, but the target archs are "
            f"{[str(a) for a in archs]} (FLASHINFER_CUDA_ARCH_LIST or the visible GPUs)"
        )
    return kept
