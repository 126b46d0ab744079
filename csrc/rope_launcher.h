// Plain C++ launcher exported by rope_kernel.cu and called by the binding (rope.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

struct RopeHeads {
  int64_t heads;
  int64_t token_stride;  // elements
  int64_t head_stride;   // elements
};

struct RopeOptions {
  int64_t nnz, head_dim, rotary_dim;
  bool interleave;
  float rope_scale, rope_theta;
  bool llama31;
  float low_freq_factor, high_freq_factor, old_context_len;
  const float* cos_sin_cache;  // nullptr: cos/sin computed from the frequencies
  int64_t cache_stride;
  int64_t cache_rows;
};

// q/k and outputs are the module's DType; pos_ids int32 (pos_ids_64 false) or int64.
cudaError_t rope_launch(void* q_out, void* k_out, const void* q, const void* k, const void* pos_ids,
                        bool pos_ids_64, RopeHeads q_in, RopeHeads k_in, RopeHeads q_o,
                        RopeHeads k_o, RopeOptions options, cudaStream_t stream);
