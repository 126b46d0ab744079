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


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, new residual). The sum is a float32 add, as the kernel forms it: the new
    residual is that sum rounded to the residual's dtype (so it compares exactly), and the
    norm is taken of the unrounded float32 sum."""
    total = x.float() + residual.float()
    return rmsnorm(total, weight.double() + weight_offset, eps), total.to(residual.dtype)


def layernorm(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
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


def rope_frequencies(
    rotary_dim: int,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> torch.Tensor:
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
    return torch.where(
        wavelen < old / high, freq, torch.where(wavelen > old / low, freq / rope_scale, mid)
    )


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
    first_of_tie = torch.cat(
        [torch.ones_like(ranked[:, :1], dtype=torch.bool), ranked[:, 1:] != ranked[:, :-1]], dim=-1
    )
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
            blocks[block] = philox4x32_10(
                (
                    block & _MASK32,
                    (block >> 32) & _MASK32,
                    subsequence & _MASK32,
                    subsequence >> 32,
                ),
                key,
            )
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


def exponential_race(
    probs: torch.Tensor, seed: int, offset: int, row: int, keep: torch.Tensor | None = None
) -> tuple[int, float]:
    """The token the sampling kernels draw from one row of float32 ``probs`` (elements
    outside ``keep`` excluded) for output row ``row``: argmax of p / E with
    E = -log1p(-u), u from word offset + j of subsequence ``row``; and the winner's score
    margin over the runner-up (relative), which tells a near-tie."""
    p = probs.detach().cpu().float()
    u = torch.tensor(
        [uniform_open01(b) for b in philox_words(seed, row, offset, p.numel())], dtype=torch.float32
    )
    score = p / -torch.log1p(-u)
    runs = p > 0 if keep is None else (p > 0) & keep.cpu()
    score = torch.where(runs, score, torch.tensor(float("-inf")))
    top = score.double().topk(min(2, p.numel()))
    margin = (
        1.0
        if p.numel() < 2 or top.values[1] <= 0
        else float((top.values[0] - top.values[1]) / top.values[0])
    )
    return int(score.argmax()), margin


# -- whole-API references (fi_trace embeds these; built from the helpers above) -------------


def rmsnorm_quant(
    x: torch.Tensor, weight: torch.Tensor, scale: float, eps: float = 1e-6
) -> torch.Tensor:
    """rmsnorm_quant's fp8 output: RMSNorm, divided by ``scale``, cast to e4m3."""
    return fp8_e4m3_quantize(rmsnorm(x, weight, eps), scale)


def fused_add_rmsnorm_quant(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, scale: float, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 output, new residual) of fused_add_rmsnorm_quant."""
    normalized, new_residual = fused_add_rmsnorm(x, residual, weight, eps)
    return fp8_e4m3_quantize(normalized, scale), new_residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(x, "silu")


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(x, "gelu")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(x, "gelu_tanh")


def rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated at ``pos_ids``; ``llama31`` as in :func:`rope_frequencies`."""
    freq = rope_frequencies(rotary_dim or q.shape[-1], rope_scale, rope_theta, llama31)
    angles = pos_ids.cpu().float()[:, None] * freq[None, :]
    return rope(q.cpu(), angles, interleave), rope(k.cpu(), angles, interleave)


def rope_ragged(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    llama31: tuple[float, float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope: request i's tokens ``indptr[i]:indptr[i+1]`` sit at ``offsets[i] + j``."""
    bounds, starts = indptr.cpu().tolist(), offsets.cpu().tolist()
    pos_ids = torch.cat(
        [torch.arange(b - a) + s for a, b, s in zip(bounds[:-1], bounds[1:], starts)]
    )
    return rope_pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, llama31)


def rope_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rope_with_cos_sin_cache on flat ``[nnz, heads * head_size]`` query/key: the
    angles are atan2(sin, cos) of the cache rows at ``positions``."""
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache.cpu().double()[positions.cpu().long()]
    angles = torch.atan2(rows[:, half:], rows[:, :half])
    q = rope(query.cpu().reshape(query.shape[0], -1, head_size), angles, not is_neox)
    k = rope(key.cpu().reshape(key.shape[0], -1, head_size), angles, not is_neox)
    return q.reshape(query.shape), k.reshape(key.shape)


def softmax(logits: torch.Tensor, temperature: torch.Tensor | float | None = None) -> torch.Tensor:
    """softmax(logits / temperature) per row, in float64 (temperature per row or scalar)."""
    t = 1.0 if temperature is None else torch.as_tensor(temperature, dtype=torch.float64)
    return torch.softmax(logits.double() / torch.as_tensor(t).reshape(-1, 1), dim=-1)


def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """logits outside the row's top k (ties kept) set to -inf."""
    return torch.where(top_k_set(logits, top_k), logits.double(), -math.inf)


def sample_rows(
    probs: torch.Tensor, keep: torch.Tensor | None = None, seed: int = 0, offset: int = 0
) -> torch.Tensor:
    """The tokens the sampling kernels draw, row by row (:func:`exponential_race`), from
    ``probs`` restricted to ``keep`` (e.g. :func:`top_p_set`)."""
    return torch.tensor(
        [
            exponential_race(probs[r], seed, offset, r, None if keep is None else keep[r])[0]
            for r in range(probs.shape[0])
        ],
        dtype=torch.int32,
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    soft_cap: float | None = None,
    mask: torch.Tensor | None = None,
    rope: tuple[float, float] | None = None,
    alibi: bool = False,
    rope_rounds_q: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's attention in float64: q ``[qo_len, Hq, D]``, k ``[kv_len, Hk, D]``, v
    ``[kv_len, Hk, Dv]`` (Dv may differ from D: MLA prefill); qo head h reads kv head
    ``h // (Hq // Hk)``. Returns (out ``[qo_len, Hq, Dv]``, lse ``[qo_len, Hq]`` in base 2).

    ``rope = (rope_scale, rope_theta)``: pos_encoding_mode "ROPE_LLAMA", query i rotated at
    position ``i + kv_len - qo_len`` and key j at ``j`` (halves paired, not interleaved), the
    rotated keys rounded to the inputs' dtype as the kernels keep them, and the rotated
    queries too unless ``rope_rounds_q`` is False (the CUDA-core decode kernel keeps its
    query in float32 registers; prefill rotates Q in shared memory). ``alibi``:
    pos_encoding_mode "ALIBI", head h's slope (:func:`alibi_slopes`) times ``j - i`` added to
    the scaled score of query i and key j, i the query's index in the request (not aligned
    bottom-right: the reference's convention, which shifts the LSE, not the output).

    Query i sees key j where ``mask[i, j]`` (a custom mask overrides ``causal``), else iff
    ``j <= i + kv_len - qo_len`` when causal (bottom-right aligned); ``window_left >= 0``
    also requires ``j >= i + kv_len - qo_len - window_left``; ``soft_cap`` applies
    ``cap * tanh(s / cap)`` to the scaled scores. A row that sees no key has out 0 and lse
    -inf; a NaN among a row's visible scores makes its out and lse NaN, and a NaN value its
    out (as in the kernels and the reference library). K/V are read through the GQA group
    (no copies) and query rows go in chunks, so the float64 scores stay near 1 GB."""
    qo_len, heads, dim = q.shape
    kv_len, kv_heads, dim_vo = k.shape[0], k.shape[1], v.shape[2]
    group = heads // kv_heads
    if rope is not None:
        freq = rope_frequencies(dim, *rope).to(q.device)
        positions = torch.arange(qo_len, device=q.device) + (kv_len - qo_len)
        k = _rotated(k, torch.arange(kv_len, device=q.device), freq)
        q = _rotated(q, positions, freq, rounded=rope_rounds_q)
    scale = dim**-0.5 if sm_scale is None else sm_scale
    kd, vd = k.double(), v.double()
    out = torch.zeros(qo_len, heads, dim_vo, dtype=torch.float64, device=q.device)
    lse = torch.full((qo_len, heads), -math.inf, dtype=torch.float64, device=q.device)
    cols = torch.arange(kv_len, device=q.device)
    step = max(1, (1 << 27) // max(1, heads * kv_len))
    for start in range(0, qo_len, step):
        rows = torch.arange(start, min(qo_len, start + step), device=q.device)
        qg = q[rows].double().view(rows.numel(), kv_heads, group, dim)
        scores = torch.einsum("rkgd,lkd->kgrl", qg, kd) * scale  # [Hk, group, rows, kv]
        if alibi:
            slopes = alibi_slopes(heads).to(q.device).view(kv_heads, group, 1, 1)
            scores = scores + slopes * (cols[None, :] - rows[:, None]).double()
        if soft_cap:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        diagonal = rows[:, None] + (kv_len - qo_len)
        if mask is not None:
            visible = mask[rows].bool()
        elif causal:
            visible = cols[None, :] <= diagonal
        else:
            visible = torch.ones(rows.numel(), kv_len, dtype=torch.bool, device=q.device)
        if window_left >= 0:
            visible = visible & (cols[None, :] >= diagonal - window_left)
        scores = scores.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf where no key is visible
        seen = (row_lse != -math.inf)[..., None]  # else -inf - -inf: such rows get 0
        probs = torch.where(seen, torch.exp(scores - row_lse[..., None]), 0.0)
        out[rows] = torch.einsum("kgrl,lkd->rkgd", probs, vd).reshape(rows.numel(), heads, dim_vo)
        lse[rows] = row_lse.permute(2, 0, 1).reshape(rows.numel(), heads) / math.log(2)
    return out, lse


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's slopes (float64), from the paper's definition: for the largest power of two
    n <= n_heads, 2^(-8/n) to the powers 1..n, then 2^(-4/n) to the odd powers for the rest."""
    n = 2 ** math.floor(math.log2(n_heads))
    first = (2.0 ** (-8.0 / n)) ** torch.arange(1, n + 1, dtype=torch.float64)
    rest = (2.0 ** (-4.0 / n)) ** torch.arange(1, 1 + 2 * (n_heads - n), 2, dtype=torch.float64)
    return torch.cat([first, rest])


def _rotated(
    x: torch.Tensor, positions: torch.Tensor, freq: torch.Tensor, rounded: bool = True
) -> torch.Tensor:
    """x rotated (Llama RoPE) at ``positions``, angles in float32 as the kernels form them,
    rounded back to x's dtype (``rounded``) or kept in float64."""
    angles = positions.float()[:, None] * freq[None, :]
    rotated = rope(x, angles, interleave=False)
    return rotated.to(x.dtype) if rounded else rotated


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    soft_cap: float | None = None,
    window_left: int = -1,
    rope: tuple[float, float] | None = None,
    alibi: bool = False,
    rope_rounds_q: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: :func:`attention` of q ``[Hq, D]`` (one query token, at position
    ``kv_len - 1`` under ``rope``, index 0 under ``alibi``) over k, v ``[kv_len, Hk, D]``;
    returns (out ``[Hq, D]``, base-2 lse ``[Hq]``). ``rope_rounds_q``: as :func:`attention`'s
    (False for the CUDA-core decode kernel, True for tensor-core decode)."""
    out, lse = attention(
        q[None],
        k,
        v,
        sm_scale=sm_scale,
        window_left=window_left,
        soft_cap=soft_cap,
        rope=rope,
        alibi=alibi,
        rope_rounds_q=rope_rounds_q,
    )
    return out[0], lse[0]


def paged_rows(
    cache: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    request: int,
) -> torch.Tensor:
    """Request ``request``'s rows ``[kv_len, Hk, D]`` of an NHD ``[pages, page_size, Hk, D]``
    cache under a page table."""
    begin, end = int(indptr[request]), int(indptr[request + 1])
    pages = cache[indices[begin:end].long()].reshape(-1, *cache.shape[2:])
    return pages[: (end - begin - 1) * cache.shape[1] + int(last_page_len[request])]


def batch_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch attention over NHD paged caches, request i's queries ``qo_indptr[i]:[i+1]``
    (decode: ``qo_indptr = arange(batch + 1)``). Returns (out, lse base 2)."""
    outs, lses = [], []
    for r in range(kv_indptr.shape[0] - 1):
        rows = slice(int(qo_indptr[r]), int(qo_indptr[r + 1]))
        k = paged_rows(k_cache, kv_indptr, kv_indices, kv_last_page_len, r)
        v = paged_rows(v_cache, kv_indptr, kv_indices, kv_last_page_len, r)
        out, lse = attention(q[rows], k, v, causal, sm_scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def batch_ragged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch attention over ragged k/v ``[total_kv, Hk, D]`` (request i: ``kv_indptr[i]:[i+1]``)."""
    outs, lses = [], []
    for r in range(qo_indptr.shape[0] - 1):
        qs = slice(int(qo_indptr[r]), int(qo_indptr[r + 1]))
        ks = slice(int(kv_indptr[r]), int(kv_indptr[r + 1]))
        out, lse = attention(q[qs], k[ks], v[ks], causal, sm_scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attention states (v ``[seq, H, D]``, base-2 LSE s ``[seq, H]``) merged, in float64."""
    return merge_states(torch.stack([v_a, v_b], dim=1), torch.stack([s_a, s_b], dim=1))


def merge_states(v: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """States ``v [seq, n, H, D]`` / ``s [seq, n, H]`` merged over n, in float64. A state
    with s = -inf (over no keys) weighs nothing; merging only such states gives v = 0 and
    s = -inf, as the kernels do."""
    sd = s.double()
    total = torch.logsumexp(sd * math.log(2), dim=1) / math.log(2)
    empty = (total == -math.inf)[:, None]  # only states over no keys: -inf - -inf
    weights = torch.where(empty, 0.0, torch.exp2(sd - total[:, None]))
    return (v.double() * weights[..., None]).sum(dim=1), total


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """numpy.packbits of a flat bool tensor: 8 elements a byte, zero padded."""
    bits = torch.nn.functional.pad(x.reshape(-1).to(torch.uint8), (0, -x.numel() % 8))
    shifts = torch.arange(7, -1, -1) if bitorder == "big" else torch.arange(8)
    return (bits.reshape(-1, 8).long() << shifts.to(bits.device)).sum(-1).to(torch.uint8)


def seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Each request's KV length: full pages times page_size plus the last page's fill."""
    pages = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    return torch.tensor(
        [max(n - 1, 0) * page_size + int(last) for n, last in zip(pages, kv_last_page_len.tolist())]
    )


def batch_indices_positions(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each appended token's request (-1 past ``append_indptr[-1]``) and KV position."""
    batch, pos = [-1] * nnz, [0] * nnz
    bounds = append_indptr.tolist()
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        for j, t in enumerate(range(start, min(end, nnz))):
            batch[t], pos[t] = b, int(seq_lens[b]) - (end - start) + j
    return torch.tensor(batch, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32)


def append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of NHD ``k_cache``/``v_cache`` with token i at page
    ``kv_indices[kv_indptr[b] + p // page_size]``, slot ``p % page_size`` (b, p: its
    request and position); tokens with b < 0 are skipped."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    page_size = k_cache.shape[1]
    for i, (b, p) in enumerate(zip(batch_indices.tolist(), positions.tolist())):
        if b >= 0:
            page = int(kv_indices[int(kv_indptr[b]) + p // page_size])
            k_out[page, p % page_size] = append_key[i]
            v_out[page, p % page_size] = append_value[i]
    return k_out, v_out
