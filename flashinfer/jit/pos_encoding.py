"""The position encodings an attention module is built for (include/flashinfer/pos_encoding.h):
one build each, named by a suffix of the module's uri; and the launch parameters they add."""

from __future__ import annotations

# pos_encoding_mode -> uri suffix
POS_ENCODINGS = {"NONE": "", "ROPE_LLAMA": "_rope", "ALIBI": "_alibi"}
# The last parameters of every attention launch binding (decode and prefill, batch and
# single): the score's scale and soft cap, RoPE's 1 / rope_scale and 1 / rope_theta, ALiBi's
# slopes (the builds that do not use them check them or take None), PDL.
SCORE_ARGS = (
    "score_scale",
    "score_cap",
    "rope_rcp_scale",
    "rope_rcp_theta",
    "alibi_slopes",
    "enable_pdl",
)


def pos_encoding_suffix(pos_encoding: str) -> str:
    """The uri suffix of ``pos_encoding``'s build; ValueError for a mode with none."""
    if pos_encoding not in POS_ENCODINGS:
        raise ValueError(
            f"pos_encoding must be one of {', '.join(map(repr, POS_ENCODINGS))}, "
            f"got {pos_encoding!r}"
        )
    return POS_ENCODINGS[pos_encoding]
