// Kernel TU of the norm module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/norm.cuh"
#include "norm_config.h"
#include "norm_launcher.h"

namespace fn = flashinfer::norm;
using fn::RowLayout;

namespace {
constexpr fn::QuantScale kNoScale = {nullptr, 1.f};  // outputs of DType are not scaled
}  // namespace

cudaError_t rmsnorm_launch(void* out, const void* input, const void* weight, int64_t rows,
                           int64_t hidden, NormLayout input_layout, NormLayout out_layout,
                           float eps, float weight_offset, bool pdl, cudaStream_t stream) {
  return fn::RMSNorm<DType, DType>(static_cast<DType*>(out), static_cast<const DType*>(input),
                                   static_cast<const DType*>(weight), rows, hidden,
                                   RowLayout::From(input_layout), RowLayout::From(out_layout), eps,
                                   weight_offset, kNoScale, pdl, stream);
}

cudaError_t fused_add_rmsnorm_launch(void* input, void* residual, const void* weight, int64_t rows,
                                     int64_t hidden, NormLayout input_layout,
                                     NormLayout residual_layout, float eps, float weight_offset,
                                     bool pdl, cudaStream_t stream) {
  auto* x = static_cast<DType*>(input);
  return fn::FusedAddRMSNorm<DType, DType>(
      x, x, static_cast<DType*>(residual), static_cast<const DType*>(weight), rows, hidden,
      RowLayout::From(input_layout), RowLayout::From(residual_layout),
      RowLayout::From(input_layout), eps, weight_offset, kNoScale, pdl, stream);
}

cudaError_t layernorm_launch(void* out, const void* input, const float* gamma, const float* beta,
                             int64_t rows, int64_t hidden, NormLayout input_layout,
                             NormLayout out_layout, float eps, bool pdl, cudaStream_t stream) {
  return fn::LayerNorm<DType>(static_cast<DType*>(out), static_cast<const DType*>(input), gamma,
                              beta, rows, hidden, RowLayout::From(input_layout),
                              RowLayout::From(out_layout), eps, pdl, stream);
}
