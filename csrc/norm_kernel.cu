// Kernel TU of the norm module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/norm.cuh"
#include "norm_config.h"
#include "norm_launcher.h"

namespace fn = flashinfer::norm;

namespace {
fn::RowLayout ToRowLayout(NormLayout l) { return {l.heads, l.token_stride, l.head_stride}; }
}  // namespace

cudaError_t rmsnorm_launch(void* out, const void* input, const void* weight, int64_t rows,
                           int64_t hidden, NormLayout input_layout, NormLayout out_layout,
                           float eps, float weight_offset, cudaStream_t stream) {
  return fn::RMSNorm<DType>(static_cast<DType*>(out), static_cast<const DType*>(input),
                            static_cast<const DType*>(weight), rows, hidden,
                            ToRowLayout(input_layout), ToRowLayout(out_layout), eps,
                            weight_offset, stream);
}

cudaError_t fused_add_rmsnorm_launch(void* input, void* residual, const void* weight,
                                     int64_t rows, int64_t hidden, NormLayout input_layout,
                                     NormLayout residual_layout, float eps, float weight_offset,
                                     cudaStream_t stream) {
  return fn::FusedAddRMSNorm<DType>(static_cast<DType*>(input), static_cast<DType*>(residual),
                                    static_cast<const DType*>(weight), rows, hidden,
                                    ToRowLayout(input_layout), ToRowLayout(residual_layout), eps,
                                    weight_offset, stream);
}

cudaError_t layernorm_launch(void* out, const void* input, const float* gamma, const float* beta,
                             int64_t rows, int64_t hidden, NormLayout input_layout,
                             NormLayout out_layout, float eps, cudaStream_t stream) {
  return fn::LayerNorm<DType>(static_cast<DType*>(out), static_cast<const DType*>(input), gamma,
                              beta, rows, hidden, ToRowLayout(input_layout),
                              ToRowLayout(out_layout), eps, stream);
}
