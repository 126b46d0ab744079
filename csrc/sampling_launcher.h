// Plain C++ launchers exported by sampling_kernel.cu and called by the binding (sampling.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// Per-request filter parameters: an array entry per output row when the pointer is set,
// else the scalar.
struct SamplingFilters {
  const int32_t* top_k_values;
  const float* top_p_values;
  const float* min_p_values;
  int32_t top_k;
  float top_p, min_p;
  bool use_top_k, use_top_p, use_min_p, top_k_first;
};

// Philox seeds and offsets: arrays of one entry (every row) or one per output row, read on
// the device when the kernel runs, else the scalars.
struct SamplingRandom {
  const uint64_t* seed_values;
  const uint64_t* offset_values;
  bool seed_per_row, offset_per_row;
  uint64_t seed, offset;
};

// Output rows: tokens of the indices' type (int64 when `wide_index`, else int32) and, when
// `valid` is set, whether each row had a token to draw. `indices` maps output rows to input
// rows (null: the identity).
struct SamplingRows {
  void* out;
  bool* valid;
  const void* indices;
  bool wide_index;
  int64_t rows;        // output rows
  int64_t input_rows;  // rows of the input
  int64_t row_stride;  // input row stride, elements
};

// `aligned`: every row starts on a 4-element boundary (vector loads). Logits and the
// probabilities of renorm_probs are the module's DType; sampled probabilities float32.
// Strides in elements.
cudaError_t softmax_launch(float* out, const void* logits, int64_t rows, int64_t vocab,
                           int64_t in_stride, int64_t out_stride, const float* temperatures,
                           float temperature, bool aligned, bool pdl, cudaStream_t stream);
cudaError_t sampling_from_probs_launch(const SamplingRows& rows, const float* probs, int64_t vocab,
                                       SamplingFilters filters, SamplingRandom random, bool aligned,
                                       cudaStream_t stream);
cudaError_t sampling_from_logits_launch(const SamplingRows& rows, const void* logits, int64_t vocab,
                                        SamplingRandom random, bool aligned, cudaStream_t stream);
cudaError_t renorm_probs_launch(void* out, const void* probs, int64_t rows, int64_t vocab,
                                int64_t in_stride, int64_t out_stride, SamplingFilters filters,
                                bool aligned, cudaStream_t stream);
cudaError_t mask_logits_launch(void* out, const void* logits, int64_t rows, int64_t vocab,
                               int64_t in_stride, int64_t out_stride, const int32_t* top_k_values,
                               int32_t top_k, bool aligned, cudaStream_t stream);
