// Plain C++ launcher exported by activation_kernel.cu and called by the binding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// act: 0 SiLU, 1 GELU (erf), 2 GELU (tanh). Input [rows, 2d], output [rows, d], of the
// module's DType; strides are row strides in elements; the last dim is contiguous.
// `pdl`: launch with programmatic dependent launch (sm90+).
cudaError_t act_and_mul_launch(int act, void* out, const void* input, int64_t rows, int64_t d,
                               int64_t input_stride, int64_t out_stride, bool pdl,
                               cudaStream_t stream);
