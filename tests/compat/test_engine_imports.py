"""The module-level imports of the serving engines' FlashInfer attention backends, which run
when the engine loads the backend (before any call): vLLM's (vllm/v1/attention/backends/
flashinfer.py: its current form, and the forms of vllm-project/vllm at 00a817ad and 5314c90d,
which also import the reference's trtllm-gen entry points and FP4Tensor) and SGLang's
(sglang/srt/layers/attention/flashinfer_backend.py, current and earlier); the helpers they
import besides the APIs; and ``flashinfer.<submodule>`` after a bare ``import flashinfer``,
as vLLM's sampler reaches ``flashinfer.sampling``.

Reference signatures read from flashinfer-ai/flashinfer: trtllm_batch_decode_with_kv_cache
in flashinfer/decode.py at 002752ae3615318e75b95e2eeb716242233c0fdd,
trtllm_batch_context_with_kv_cache in flashinfer/prefill.py at
002920bf8256465171c95d76519ea1cf35244865, FP4Tensor in flashinfer/utils.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from flashinfer.utils import BackendNotSupportedError

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
    "vllm-00a817ad": """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import _get_range_buf, trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
from flashinfer.utils import FP4Tensor
""",
    "vllm-5314c90d": """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import (_get_range_buf, get_seq_lens,
                               trtllm_batch_decode_with_kv_cache)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
from flashinfer.utils import FP4Tensor
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


def test_submodules_are_attributes_after_a_bare_import() -> None:
    """``import flashinfer`` then ``flashinfer.sampling.top_p_sampling_from_probs``, as vLLM's
    sampler calls it, in a fresh interpreter (here the submodules are already imported)."""
    code = (
        "import sys, flashinfer as fi\n"
        "assert 'flashinfer.sampling' not in sys.modules\n"
        "sample = fi.sampling.top_p_sampling_from_probs\n"
        "assert sample is sys.modules['flashinfer.sampling'].top_p_sampling_from_probs\n"
        "assert fi.decode.fast_decode_plan is fi.fast_decode_plan\n"
        "for name in ('no_such_module', '_private', 'data'):\n"
        "    try:\n"
        "        getattr(fi, name)\n"
        "    except AttributeError as e:\n"
        '        assert f"has no attribute {name!r}" in str(e), e\n'
        "    else:\n"
        "        raise AssertionError(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


TRTLLM = {
    "trtllm_batch_decode_with_kv_cache": (
        "(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, "
        "bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None, "
        "o_sf_scale=None, o_sf_vec_size=None, sinks=None, kv_layout='HND', enable_pdl=None, "
        "backend='auto', q_len_per_req=1, o_scale=1.0, mask=None, max_q_len=None, "
        "cum_seq_lens_q=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None, "
        "uses_shared_paged_kv_idx=True, lse=None, return_lse=False, bmm1_scale_log2=None, "
        "multi_ctas_kv_counter_buffer=None, enable_block_sparse_attention=False)",
        "decode",
        "BatchDecodeWithPagedKVCacheWrapper",
    ),
    "trtllm_batch_context_with_kv_cache": (
        "(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, "
        "bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left=-1, "
        "out=None, out_dtype=None, o_sf_scale=None, o_sf_vec_size=None, kv_layout='HND', "
        "enable_pdl=None, sinks=None, kv_cache_sf=None, "
        "skip_softmax_threshold_scale_factor=None, uses_shared_paged_kv_idx=True, "
        "causal=True, lse=None, return_lse=False, multi_ctas_kv_counter_buffer=None)",
        "prefill",
        "BatchPrefillWithPagedKVCacheWrapper",
    ),
}


@pytest.mark.parametrize("name", sorted(TRTLLM))
def test_trtllm_entry_points_bind_as_vllm_calls_them_and_refuse_by_name(name: str) -> None:
    """vLLM calls them by keyword only where the reference's trtllm-gen kernels run
    (Blackwell); here a call raises before it reads anything, naming the wrapper to use."""
    import importlib

    params, module, wrapper = TRTLLM[name]
    func = getattr(importlib.import_module(f"flashinfer.{module}"), name)
    assert_signature(func, params)
    vllm_call = dict(
        query=torch.empty(0),
        kv_cache=torch.empty(0),
        workspace_buffer=torch.empty(0),
        block_tables=torch.empty(0),
        seq_lens=torch.empty(0),
        bmm1_scale=0.1,
        bmm2_scale=1.0,
        window_left=-1,
        sinks=None,
        o_sf_scale=None,
        out=torch.empty(0),
    )
    if module == "decode":
        vllm_call.update(max_seq_len=64, q_len_per_req=1)
    else:
        vllm_call.update(
            max_q_len=8, max_kv_len=64, batch_size=1, cum_seq_lens_q=None, cum_seq_lens_kv=None
        )
    with pytest.raises(BackendNotSupportedError, match=f"{name}: .* use {wrapper}"):
        func(**vllm_call)


def test_fp4_tensor_holds_what_engines_build_it_with() -> None:
    from flashinfer.utils import FP4Tensor

    assert_signature(FP4Tensor, "(data, scale, scale_start_index=0, original_shape=None)")
    data, scale = torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1, dtype=torch.float8_e4m3fn)
    t = FP4Tensor(data=data, scale=scale, scale_start_index=2, original_shape=(4, 16))
    assert (t.data, t.scale, t.scale_start_index, t.original_shape) == (data, scale, 2, (4, 16))
    assert t.dtype == "nvfp4" and FP4Tensor(data, scale).scale_start_index == 0
    with pytest.raises(TypeError, match="data must be a uint8 tensor, got a torch.float16"):
        FP4Tensor(data.half(), scale)
    with pytest.raises(TypeError, match="scale must be a float8_e4m3fn tensor, got list"):
        FP4Tensor(data, [1.0])
    with pytest.raises(ValueError, match="scale_start_index must be an int >= 0, got -1"):
        FP4Tensor(data, scale, -1)
