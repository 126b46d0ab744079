"""Float64 torch references for the GPU tests and --refcheck: short, readable, slow."""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, in float64."""
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm with Gemma's ``weight + 1``, in float64."""
    return rmsnorm(x, weight.double() + 1, eps)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, weight_offset: float = 0.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, new residual). The residual sum is a float32 add rounded to the
    residual's dtype, as the kernel does it, so the new residual can be compared exactly."""
    new_residual = (x.float() + residual.float()).to(residual.dtype)
    return rmsnorm(new_residual, weight.double() + weight_offset, eps), new_residual


def layernorm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
              eps: float = 1e-6) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last dim, in float64."""
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    var = (xd - mean).pow(2).mean(-1, keepdim=True)
    return (xd - mean) * torch.rsqrt(var + eps) * gamma.double() + beta.double()


def act_and_mul(x: torch.Tensor, act: str) -> torch.Tensor:
    """act(x[..., :d]) * x[..., d:] in float64; act is "silu", "gelu" or "gelu_tanh"."""
    xd = x.double()
    d = xd.shape[-1] // 2
    gate, up = xd[..., :d], xd[..., d:]
    if act == "silu":
        return gate * torch.sigmoid(gate) * up
    approximate = "tanh" if act == "gelu_tanh" else "none"
    return torch.nn.functional.gelu(gate, approximate=approximate) * up
