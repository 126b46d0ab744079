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
    """(normalized, new residual). The sum is a float32 add, as the kernel forms it: the new
    residual is that sum rounded to the residual's dtype (so it compares exactly), and the
    norm is taken of the unrounded float32 sum."""
    total = x.float() + residual.float()
    return rmsnorm(total, weight.double() + weight_offset, eps), total.to(residual.dtype)


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


def fp8_e4m3_quantize(values: torch.Tensor, scale: float) -> torch.Tensor:
    """``values / scale`` clamped to +-448 (the e4m3 range) and cast by torch to
    float8_e4m3fn (round to nearest even): the fp8 output of the quantized norms."""
    return (values.double() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


# -- sampling randomness: Philox4x32-10 in the curand/torch counter layout ------------------

_PHILOX_MUL = (0xD2511F53, 0xCD9E8D57)
_PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 of Salmon et al. on a counter of four 32-bit words and a 64-bit key."""
    x, y, z, w = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _PHILOX_MUL[0] * x, _PHILOX_MUL[1] * z
        x, y, z, w = ((p1 >> 32) ^ y ^ k0, p1 & _MASK32, (p0 >> 32) ^ w ^ k1, p0 & _MASK32)
        k0, k1 = (k0 + _PHILOX_WEYL[0]) & _MASK32, (k1 + _PHILOX_WEYL[1]) & _MASK32
    return x, y, z, w


def philox_words(seed: int, subsequence: int, offset: int, count: int) -> list[int]:
    """Words offset .. offset + count - 1 of a subsequence, as curand_init(seed, subsequence,
    offset) and successive curand() calls return them: word p is lane p % 4 of block p // 4,
    the block index in the counter's low 64 bits, the subsequence in its high 64 bits."""
    key = (seed & _MASK32, seed >> 32)
    blocks: dict[int, tuple[int, ...]] = {}
    words = []
    for position in range(offset, offset + count):
        block, lane = divmod(position, 4)
        if block not in blocks:
            blocks[block] = philox4x32_10((block & _MASK32, (block >> 32) & _MASK32,
                                           subsequence & _MASK32, subsequence >> 32), key)
        words.append(blocks[block][lane])
    return words


def _float32(value: float) -> float:
    return torch.tensor(value, dtype=torch.float64).to(torch.float32).item()


def uniform_open01(bits: int) -> float:
    """The sampling kernels' uniform: bits rounded toward zero to float32, times 2^-32, plus
    2^-33, rounded once to float32 (in (0, 1), never 1)."""
    shift = max(bits.bit_length() - 24, 0)
    return _float32(((bits >> shift) << shift) * 2.0**-32 + 2.0**-33)


def curand_uniform(bits: int) -> float:
    """curand_uniform's (and so torch.rand's) mapping: float32(bits) * 2^-32 + 2^-33, in
    float32 (torch maps a resulting 1.0 to 0.0)."""
    value = _float32(_float32(float(bits)) * 2.0**-32 + 2.0**-33)
    return 0.0 if value == 1.0 else value


def exponential_race(probs: torch.Tensor, seed: int, offset: int, row: int,
                     keep: torch.Tensor | None = None) -> tuple[int, float]:
    """The token the sampling kernels draw from one row of float32 ``probs`` (elements
    outside ``keep`` excluded) for output row ``row``: argmax of p / E with
    E = -log1p(-u), u from word offset + j of subsequence ``row``; and the winner's score
    margin over the runner-up (relative), which tells a near-tie."""
    p = probs.detach().cpu().float()
    u = torch.tensor([uniform_open01(b) for b in philox_words(seed, row, offset, p.numel())],
                     dtype=torch.float32)
    score = p / -torch.log1p(-u)
    runs = p > 0 if keep is None else (p > 0) & keep.cpu()
    score = torch.where(runs, score, torch.tensor(float("-inf")))
    top = score.double().topk(min(2, p.numel()))
    margin = 1.0 if p.numel() < 2 or top.values[1] <= 0 else float(
        (top.values[0] - top.values[1]) / top.values[0])
    return int(score.argmax()), margin
