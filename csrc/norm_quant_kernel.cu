// Kernel TU of the norm_quant module (nvcc): the RMSNorm kernels with an fp8 e4m3 output.
// No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/norm.cuh"
#include "norm_quant_config.h"
#include "norm_quant_launcher.h"

namespace fn = flashinfer::norm;
using fn::RowLayout;
using Fp8 = __nv_fp8_e4m3;

cudaError_t rmsnorm_quant_launch(void* out, const void* input, const void* weight, int64_t rows,
                                 int64_t hidden, NormLayout input_layout, NormLayout out_layout,
                                 const float* scale_ptr, float scale_value, float eps, bool pdl,
                                 cudaStream_t stream) {
  return fn::RMSNorm<DType, Fp8>(static_cast<Fp8*>(out), static_cast<const DType*>(input),
                                 static_cast<const DType*>(weight), rows, hidden,
                                 RowLayout::From(input_layout), RowLayout::From(out_layout), eps,
                                 0.f, {scale_ptr, scale_value}, pdl, stream);
}

cudaError_t fused_add_rmsnorm_quant_launch(void* out, const void* input, void* residual,
                                           const void* weight, int64_t rows, int64_t hidden,
                                           NormLayout input_layout, NormLayout residual_layout,
                                           NormLayout out_layout, const float* scale_ptr,
                                           float scale_value, float eps, bool pdl,
                                           cudaStream_t stream) {
  return fn::FusedAddRMSNorm<DType, Fp8>(
      static_cast<Fp8*>(out), static_cast<const DType*>(input), static_cast<DType*>(residual),
      static_cast<const DType*>(weight), rows, hidden, RowLayout::From(input_layout),
      RowLayout::From(residual_layout), RowLayout::From(out_layout), eps, 0.f,
      {scale_ptr, scale_value}, pdl, stream);
}
