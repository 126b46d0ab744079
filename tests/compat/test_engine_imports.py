"""The module-level imports of the serving engines' FlashInfer attention backends, which run
when the engine loads the backend (before any call): vLLM's (vllm/v1/attention/backends/
flashinfer.py) and SGLang's (sglang/srt/layers/attention/flashinfer_backend.py), as their
current sources have them (and SGLang's earlier form); and the helpers they import besides
the APIs."""

from __future__ import annotations

import pytest
import torch

from .signature import assert_signature

ENGINE_IMPORTS = {
    "vllm": """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import _get_range_buf
""",
    "sglang": """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    fast_decode_plan,
)
from flashinfer.cascade import merge_state
""",
    "sglang-earlier": """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state
from flashinfer.decode import _get_range_buf, get_seq_lens
""",
}


@pytest.mark.parametrize("engine", sorted(ENGINE_IMPORTS))
def test_an_engines_imports_resolve(engine: str) -> None:
    exec(ENGINE_IMPORTS[engine], {})  # noqa: S102 - the engine's own import lines


def test_get_range_buf_is_a_cached_int32_arange() -> None:
    """``_get_range_buf(n, device)``: ``arange(n)`` as int32 on ``device`` (engines build a
    decode wrapper's qo_indptr from it), views of one buffer per power-of-two length."""
    from flashinfer.decode import _get_range_buf

    assert_signature(_get_range_buf, "(seq_len, device)")
    five, seven = _get_range_buf(5, "cpu"), _get_range_buf(7, torch.device("cpu"))
    assert five.dtype == torch.int32 and five.device == torch.device("cpu")
    assert five.tolist() == list(range(5)) and seven.tolist() == list(range(7))
    assert five.data_ptr() == seven.data_ptr()  # both views of the buffer of 8
    assert _get_range_buf(9, "cpu").tolist() == list(range(9))
    assert _get_range_buf(0, "cpu").numel() == 0 and _get_range_buf(1, "cpu").tolist() == [0]
    with pytest.raises(ValueError, match="seq_len must be an int >= 0, got -1"):
        _get_range_buf(-1, "cpu")


def test_decode_helpers_are_the_same_objects_where_engines_find_them() -> None:
    import flashinfer
    from flashinfer import decode

    assert decode.get_seq_lens is flashinfer.get_seq_lens
    assert flashinfer.fast_decode_plan is decode.fast_decode_plan
    assert "fast_decode_plan" in flashinfer.__all__
