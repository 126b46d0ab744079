"""Float64 torch references for the GPU tests and --refcheck: short, readable, slow."""

from __future__ import annotations

import math

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


def rope_frequencies(rotary_dim: int, rope_scale: float = 1.0, rope_theta: float = 1e4,
                     llama31: tuple[float, float, float] | None = None) -> torch.Tensor:
    """Per-pair frequencies in float32, as the kernel computes them (angles must agree to
    float32 precision, or large positions would not compare). ``llama31`` is
    (low_freq_factor, high_freq_factor, old_context_len); rope_scale is then its factor."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float32)
    freq = torch.pow(torch.tensor(1.0 / rope_theta, dtype=torch.float32), 2 * i / rotary_dim)
    if llama31 is None:
        return freq * (1.0 / rope_scale)
    low, high, old = llama31
    wavelen = 2 * math.pi / freq
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * freq / rope_scale + smooth * freq
    return torch.where(wavelen < old / high, freq, torch.where(wavelen > old / low,
                                                               freq / rope_scale, mid))


def rope(x: torch.Tensor, angles: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate each pair of x [nnz, heads, head_dim] by angles [nnz, rotary_dim/2] as a complex
    multiplication, in float64; dims past the rotary ones are kept."""
    xd = x.double()
    rot = 2 * angles.shape[1]
    if interleave:
        pairs = torch.complex(xd[..., 0:rot:2], xd[..., 1:rot:2])
    else:
        pairs = torch.complex(xd[..., : rot // 2], xd[..., rot // 2 : rot])
    rotated = pairs * torch.polar(torch.ones_like(angles.double()), angles.double())[:, None, :]
    out = xd.clone()
    if interleave:
        out[..., 0:rot:2], out[..., 1:rot:2] = rotated.real, rotated.imag
    else:
        out[..., : rot // 2], out[..., rot // 2 : rot] = rotated.real, rotated.imag
    return out


def mass_above(probs: torch.Tensor) -> torch.Tensor:
    """Per element, in float64: the total probability of the row's strictly larger elements."""
    p = probs.double()
    ranked, order = p.sort(dim=-1, descending=True)
    exclusive = ranked.cumsum(-1) - ranked
    # ties share the mass above the first of them
    first_of_tie = torch.cat([torch.ones_like(ranked[:, :1], dtype=torch.bool),
                              ranked[:, 1:] != ranked[:, :-1]], dim=-1)
    group = first_of_tie.long().cumsum(-1) - 1
    starts = torch.where(first_of_tie, exclusive, torch.zeros_like(exclusive))
    group_start = torch.zeros_like(exclusive).scatter_add_(-1, group, starts)
    return torch.empty_like(p).scatter_(-1, order, group_start.gather(-1, group))


def top_k_set(values: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Elements >= the row's k-th largest (ties kept)."""
    v = values.double()
    k = torch.as_tensor(top_k, device=v.device).long().reshape(-1, 1).expand(v.shape[0], 1)
    kth = v.sort(dim=-1, descending=True).values.gather(-1, k.clamp(1, v.shape[1]) - 1)
    return v >= kth


def top_p_set(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Elements whose strictly-larger elements hold less than top_p of the row's mass."""
    p = probs.double()
    top = torch.as_tensor(top_p, device=p.device, dtype=torch.float64).reshape(-1, 1)
    return mass_above(p) < top * p.sum(-1, keepdim=True)


def min_p_set(probs: torch.Tensor, min_p: torch.Tensor | float) -> torch.Tensor:
    p = probs.double()
    m = torch.as_tensor(min_p, device=p.device, dtype=torch.float64).reshape(-1, 1)
    return p >= m * p.amax(-1, keepdim=True)


def renormalize(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """probs restricted to ``keep``, each row divided by its kept mass (float64)."""
    kept = torch.where(keep, probs.double(), 0.0)
    return kept / kept.sum(-1, keepdim=True)
