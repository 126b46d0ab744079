// Kernel TU of the activation module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "activation_config.h"
#include "activation_launcher.h"
#include "flashinfer/activation.cuh"

namespace fa = flashinfer::activation;

namespace {
template <fa::Act A>
cudaError_t Launch(void* out, const void* input, int64_t rows, int64_t d, int64_t input_stride,
                   int64_t out_stride, bool pdl, cudaStream_t stream) {
  return fa::ActAndMul<DType, A>(static_cast<DType*>(out), static_cast<const DType*>(input), rows,
                                 d, input_stride, out_stride, pdl, stream);
}
}  // namespace

cudaError_t act_and_mul_launch(int act, void* out, const void* input, int64_t rows, int64_t d,
                               int64_t input_stride, int64_t out_stride, bool pdl,
                               cudaStream_t stream) {
  switch (static_cast<fa::Act>(act)) {
    case fa::Act::kSilu:
      return Launch<fa::Act::kSilu>(out, input, rows, d, input_stride, out_stride, pdl, stream);
    case fa::Act::kGelu:
      return Launch<fa::Act::kGelu>(out, input, rows, d, input_stride, out_stride, pdl, stream);
    case fa::Act::kGeluTanh:
      return Launch<fa::Act::kGeluTanh>(out, input, rows, d, input_stride, out_stride, pdl, stream);
  }
  return cudaErrorInvalidValue;
}
