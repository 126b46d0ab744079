// Plain C++ launcher exported by prefill_kernel.cu and called by the binding (prefill.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// One prefill call. Batch mode: qo_indptr and kv_indptr are set and `plan` is the device
// schedule (flashinfer/prefill_schedule.py) with grid_work its launch width; paged when
// kv_indices is set (kv_indptr then counts pages), ragged otherwise (kv_indptr counts tokens).
// Single mode (plan null): one request of single_qo_len x single_kv_len, grid_work = q tiles x
// single_chunks chunks of chunk_tokens. Strides in elements, all multiples of 8.
struct PrefillLaunch {
  const void* q;
  int64_t q_row_stride, q_head_stride;
  const int32_t* qo_indptr;
  const void* k;
  const void* v;
  int64_t k_page_stride, k_slot_stride, k_head_stride;
  int64_t v_page_stride, v_slot_stride, v_head_stride;
  const int32_t* kv_indices;
  const int32_t* kv_indptr;
  const int32_t* kv_last_page_len;
  int64_t page_size, num_indices, num_pages;
  const uint8_t* mask;
  const int32_t* mask_indptr;
  void* out;
  int64_t out_row_stride, out_head_stride;
  float* lse;
  float* tmp_v;
  float* tmp_lse;
  int64_t num_qo_heads, num_kv_heads;
  float score_scale, score_cap;
  // RoPE (modules built with kRope; others ignore them): 1 / rope_scale, 1 / rope_theta
  float rope_rcp_scale, rope_rcp_theta;
  const float* alibi_slopes;  // ALiBi builds: [num_qo_heads], log2 units
  bool causal;
  int64_t window_left;
  int64_t single_qo_len, single_kv_len;
  const int32_t* plan;
  int64_t work_capacity, merge_capacity, grid_work, grid_merge;
  int64_t chunk_tokens, single_chunks;
  bool pdl;
};

// q and out are the module's DType, k and v its DTypeKV; q and k rows have the module's
// kHeadDim elements, v and out rows its kHeadDimVO.
cudaError_t prefill_launch(const PrefillLaunch& launch, cudaStream_t stream);
cudaError_t prefill_blocks_per_sm(int* blocks);
int prefill_tile_rows();
// Bytes of dynamic shared memory a CTA of this build takes (its tiling's).
int64_t prefill_shared_bytes();
