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

// `aligned`: every row starts on a 4-element boundary (vector loads). Logits are the
// module's DType; probabilities float32; tokens and indices int32. Strides in elements.
cudaError_t softmax_launch(float* out, const void* logits, int64_t rows, int64_t vocab,
                           int64_t in_stride, int64_t out_stride, const float* temperatures,
                           float temperature, bool aligned, bool pdl, cudaStream_t stream);
cudaError_t sampling_from_probs_launch(int32_t* out, const float* probs, int64_t rows,
                                       int64_t vocab, const int32_t* indices, int64_t input_rows,
                                       int64_t row_stride, SamplingFilters filters, uint64_t seed,
                                       uint64_t offset, bool aligned, cudaStream_t stream);
cudaError_t sampling_from_logits_launch(int32_t* out, const void* logits, int64_t rows,
                                        int64_t vocab, const int32_t* indices,
                                        int64_t input_rows, int64_t row_stride, uint64_t seed,
                                        uint64_t offset, bool aligned, cudaStream_t stream);
cudaError_t renorm_probs_launch(float* out, const float* probs, int64_t rows, int64_t vocab,
                                int64_t in_stride, int64_t out_stride, SamplingFilters filters,
                                bool aligned, cudaStream_t stream);
cudaError_t mask_logits_launch(void* out, const void* logits, int64_t rows, int64_t vocab,
                               int64_t in_stride, int64_t out_stride, const int32_t* top_k_values,
                               int32_t top_k, bool aligned, cudaStream_t stream);
