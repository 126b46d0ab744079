// Plain C++ launchers exported by decode_kernel.cu and called by the binding (decode.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// The KV cache: token t of request b lives in page indices[indptr[b] + t / page_size],
// slot t % page_size; request b holds (pages - 1) * page_size + last_page_len[b] tokens. A
// contiguous cache has indices == nullptr and one page. Strides in elements, all multiples
// of 16 bytes.
struct DecodeKV {
  const void* k;
  const void* v;
  int64_t k_page_stride, k_slot_stride, k_head_stride;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int32_t* indices;
  const int32_t* indptr;
  const int32_t* last_page_len;
  int64_t page_size, num_indices, num_pages;
};

// Everything else one decode call needs. Batch mode: `plan` is the device schedule (see
// flashinfer/decode_schedule.py for its layout) and grid_work its launch width. Single mode
// (plan == nullptr): grid_work chunks of chunk_tokens tokens over a request of single_len.
struct DecodeLaunch {
  const void* q;
  int64_t q_batch_stride, q_head_stride;
  void* out;
  int64_t out_batch_stride, out_head_stride;
  float* lse;
  float* tmp_v;
  float* tmp_lse;
  int64_t num_qo_heads, num_kv_heads;
  float score_scale, score_cap;
  // RoPE (modules built with kRope; others ignore them): 1 / rope_scale, 1 / rope_theta
  float rope_rcp_scale, rope_rcp_theta;
  const float* alibi_slopes;  // ALiBi builds: [num_qo_heads], log2 units
  const int32_t* plan;
  int64_t work_capacity, merge_capacity, grid_work, grid_merge;
  int64_t chunk_tokens, window_left, single_len;
  bool pdl;
};

// q and out are the module's DType, the caches its DTypeKV; head_dim is the module's kHeadDim.
cudaError_t decode_launch(const DecodeKV& kv, const DecodeLaunch& launch, cudaStream_t stream);
cudaError_t decode_blocks_per_sm(int group, int* blocks);
