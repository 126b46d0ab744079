// Plain C++ launchers exported by norm_kernel.cu and called by the binding (norm.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// Pointers are to the module's DType; strides are in elements; the last dim is contiguous.
cudaError_t rmsnorm_launch(void* out, const void* input, const void* weight, int64_t rows,
                           int64_t hidden, int64_t input_stride, int64_t out_stride, float eps,
                           cudaStream_t stream);
