"""Functions the API-logging tests decorate, themselves ``@flashinfer_api`` functions (an
identity plus the replay marker at the default level 0), so replay runs them when given
``allow_modules=("tests.debug.sample_api",)``."""

from __future__ import annotations

import enum

import torch

from flashinfer import flashinfer_api


class Mode(enum.Enum):
    FAST = 1
    EXACT = 2


@flashinfer_api
def add_and_sub(
    a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, *, mode: Mode = Mode.FAST
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns a + alpha * b and a - alpha * b."""
    return a + alpha * b, a - alpha * b


@flashinfer_api
def batch_decode_with_padded_kv_cache(q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """Named and called as in the reference's crash-debugging tutorial (its log samples)."""
    return q


@flashinfer_api
def no_arguments() -> int:
    return 7


@flashinfer_api
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@flashinfer_api
def concat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    return torch.cat(tensors, dim)


@flashinfer_api
def fail(x: torch.Tensor) -> None:
    raise ValueError(f"bad x of shape {tuple(x.shape)}")


class Wrapper:
    def __init__(self, size: int) -> None:
        self.size = size

    @flashinfer_api
    def plan(self, n: int) -> int:
        return n * self.size

    @flashinfer_api
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.size
