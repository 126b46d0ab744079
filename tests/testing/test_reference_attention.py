"""The one attention reference (flashinfer.testing.reference.attention), which the GPU tests
of decode, prefill and cascade and the fi_trace definitions share, checked on the CPU
against torch's scaled_dot_product_attention in float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flashinfer.testing import reference


def _sdpa(q, k, v, visible, scale):  # noqa: ANN001, ANN202 - [qo, H, D] in, out and base-2 lse
    heads, kv_heads = q.shape[1], k.shape[1]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=visible,
        scale=scale,
        enable_gqa=heads != kv_heads,
    ).transpose(0, 1)
    kd = k.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->qhk", q, kd) * scale
    lse = torch.logsumexp(scores.masked_fill(~visible[:, None, :], -math.inf), -1)
    return out, lse / math.log(2)


@pytest.mark.parametrize(
    "qo_len,kv_len,heads,kv_heads", [(7, 7, 8, 2), (5, 19, 4, 4), (1, 33, 32, 8), (12, 40, 6, 3)]
)
@pytest.mark.parametrize("causal,window_left", [(False, -1), (True, -1), (True, 4), (False, 6)])
def test_attention_matches_sdpa(
    qo_len: int, kv_len: int, heads: int, kv_heads: int, causal: bool, window_left: int
) -> None:
    torch.manual_seed(qo_len * 100 + kv_len)
    q = torch.randn(qo_len, heads, 64, dtype=torch.float64)
    k, v = (torch.randn(kv_len, kv_heads, 64, dtype=torch.float64) for _ in range(2))
    rows = torch.arange(qo_len)[:, None] + (kv_len - qo_len)  # bottom-right diagonal
    cols = torch.arange(kv_len)[None, :]
    visible = cols <= rows if causal else torch.ones(qo_len, kv_len, dtype=torch.bool)
    if window_left >= 0:
        visible = visible & (cols >= rows - window_left)
    out, lse = reference.attention(q, k, v, causal=causal, sm_scale=0.1, window_left=window_left)
    want_out, want_lse = _sdpa(q, k, v, visible, 0.1)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_rows_without_keys_give_zero_and_minus_infinity() -> None:
    q, k = torch.randn(3, 2, 16), torch.randn(4, 1, 16)
    mask = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    out, lse = reference.attention(q, k, k, mask=mask)
    assert torch.equal(out[1], torch.zeros(2, 16, dtype=torch.float64))
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[[0, 2]]).all()


def test_decode_is_attention_of_one_query() -> None:
    q, k, v = torch.randn(8, 32), torch.randn(50, 2, 32), torch.randn(50, 2, 32)
    out, lse = reference.decode_attention(q, k, v, 0.2, soft_cap=4.0, window_left=10)
    full_out, full_lse = reference.attention(
        q[None], k, v, sm_scale=0.2, soft_cap=4.0, window_left=10
    )
    assert torch.equal(out, full_out[0]) and torch.equal(lse, full_lse[0])


@pytest.mark.parametrize("rounds_q", [True, False])
def test_rope_rotates_then_rounds_the_keys_and_the_query_where_asked(rounds_q: bool) -> None:
    """Query i at position i + kv_len - qo_len, key j at j, both rotated in float64 from
    float32 angles; the keys come back in their dtype, the query too unless
    ``rope_rounds_q`` is False (the CUDA-core decode kernel keeps it in float32)."""
    torch.manual_seed(3)
    q = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(9, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    freq = reference.rope_frequencies(64, 2.0, 5e5)

    def rotated(x: torch.Tensor, positions: range) -> torch.Tensor:
        angles = torch.tensor(positions, dtype=torch.float32)[:, None] * freq[None, :]
        return reference.rope(x, angles, interleave=False)

    q_rot = rotated(q, range(7, 9))
    want = reference.attention(
        q_rot.to(q.dtype) if rounds_q else q_rot,
        rotated(k, range(9)).to(k.dtype),
        v,
        causal=True,
    )
    got = reference.attention(q, k, v, causal=True, rope=(2.0, 5e5), rope_rounds_q=rounds_q)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    other = reference.attention(q, k, v, causal=True, rope=(2.0, 5e5), rope_rounds_q=not rounds_q)
    assert not torch.equal(other[1], got[1])  # the query's rounding shows in the LSE
    one = reference.decode_attention(q[1], k, v, 0.1, rope=(2.0, 5e5), rope_rounds_q=rounds_q)
    full = reference.attention(q[1:], k, v, sm_scale=0.1, rope=(2.0, 5e5), rope_rounds_q=rounds_q)
    assert torch.equal(one[0], full[0][0]) and torch.equal(one[1], full[1][0])


def test_merging_states_over_no_keys() -> None:
    """A state over no keys (s = -inf) weighs nothing; merging only such states gives zeros
    and -inf (the merge kernels' convention), not NaN."""
    v = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    s = torch.randn(2, 3, 4, dtype=torch.float64)
    s[0, 1] = -math.inf
    s[1] = -math.inf
    merged, total = reference.merge_states(v, s)
    kept = [0, 2]
    want, want_total = reference.merge_states(v[:1, kept], s[:1, kept])
    torch.testing.assert_close(merged[:1], want)
    torch.testing.assert_close(total[:1], want_total)
    assert (merged[1] == 0).all() and (total[1] == -math.inf).all()
    pair, pair_total = reference.merge_state(v[1, 0], s[1, 0], v[0, 0], s[0, 0])
    torch.testing.assert_close(pair, v[0, 0])
    torch.testing.assert_close(pair_total, s[0, 0])
    s[0, 0, 0] = math.nan  # a NaN state is not mistaken for an empty one
    assert reference.merge_states(v, s)[0][0, 0].isnan().all()
