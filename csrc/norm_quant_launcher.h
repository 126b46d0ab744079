// Plain C++ launchers exported by norm_quant_kernel.cu and called by norm_quant.cc: RMSNorm
// with an fp8 e4m3 output, fp8(clamp(y / scale, -448, 448)).
#pragma once

#include "norm_launcher.h"

// `input`, `residual` and `weight` are the module's DType; `out` is fp8 e4m3. The scale is
// *scale_ptr (a float32 device scalar) or, when scale_ptr is null, scale_value.
cudaError_t rmsnorm_quant_launch(void* out, const void* input, const void* weight, int64_t rows,
                                 int64_t hidden, NormLayout input_layout, NormLayout out_layout,
                                 const float* scale_ptr, float scale_value, float eps, bool pdl,
                                 cudaStream_t stream);

// residual = DType(input + residual); out = quantized rmsnorm of the float32 sum; input is
// only read.
cudaError_t fused_add_rmsnorm_quant_launch(void* out, const void* input, void* residual,
                                           const void* weight, int64_t rows, int64_t hidden,
                                           NormLayout input_layout, NormLayout residual_layout,
                                           NormLayout out_layout, const float* scale_ptr,
                                           float scale_value, float eps, bool pdl,
                                           cudaStream_t stream);
