"""Plain functions the API-logging tests decorate; importable by replay."""

from __future__ import annotations

import enum

import torch


class Mode(enum.Enum):
    FAST = 1
    EXACT = 2


def add_and_sub(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, *, mode: Mode = Mode.FAST
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns a + alpha * b and a - alpha * b."""
    return a + alpha * b, a - alpha * b


def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


def concat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    return torch.cat(tensors, dim)


def fail(x: torch.Tensor) -> None:
    raise ValueError(f"bad x of shape {tuple(x.shape)}")


class Wrapper:
    def __init__(self, size: int) -> None:
        self.size = size

    def plan(self, n: int) -> int:
        return n * self.size

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.size
