"""``FP4Tensor``: the reference's container for NVFP4 data (two e2m1 values a byte) and its
fp8 block scales, which engines construct as the output of the reference's trtllm-gen
attention (``flashinfer.utils.FP4Tensor``). No kernel here reads or writes NVFP4; the class
exists so that code building one imports and runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass
class FP4Tensor:
    """``data``: uint8, the innermost dimension half the original's; ``scale``:
    float8_e4m3fn block scales, read from token ``scale_start_index`` on (two kernels may
    share one scale tensor at different offsets)."""

    data: torch.Tensor
    scale: torch.Tensor
    scale_start_index: int = 0
    original_shape: tuple[int, ...] | None = None
    dtype: ClassVar[str] = "nvfp4"

    def __post_init__(self) -> None:
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.uint8:
            raise TypeError(f"data must be a uint8 tensor, got {_describe(self.data)}")
        if not isinstance(self.scale, torch.Tensor) or self.scale.dtype != torch.float8_e4m3fn:
            raise TypeError(f"scale must be a float8_e4m3fn tensor, got {_describe(self.scale)}")
        start = self.scale_start_index
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"scale_start_index must be an int >= 0, got {start!r}")


def _describe(value: object) -> str:
    return f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
