// Plain C++ launchers exported by norm_kernel.cu and called by the binding (norm.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// Rows of a [tokens, heads, dim] tensor (2-D data: heads = 1), strides in elements:
// row r = token * heads + head starts at token * token_stride + head * head_stride.
struct NormLayout {
  int64_t heads;
  int64_t token_stride;
  int64_t head_stride;
};

// Pointers are to the module's DType (gamma and beta: float32); the last dim is contiguous.
// `pdl`: launch with programmatic dependent launch (sm90+).
cudaError_t rmsnorm_launch(void* out, const void* input, const void* weight, int64_t rows,
                           int64_t hidden, NormLayout input_layout, NormLayout out_layout,
                           float eps, float weight_offset, bool pdl, cudaStream_t stream);

// In place: residual = DType(input + residual); input = rmsnorm of the float32 sum.
cudaError_t fused_add_rmsnorm_launch(void* input, void* residual, const void* weight, int64_t rows,
                                     int64_t hidden, NormLayout input_layout,
                                     NormLayout residual_layout, float eps, float weight_offset,
                                     bool pdl, cudaStream_t stream);

cudaError_t layernorm_launch(void* out, const void* input, const float* gamma, const float* beta,
                             int64_t rows, int64_t hidden, NormLayout input_layout,
                             NormLayout out_layout, float eps, bool pdl, cudaStream_t stream);
