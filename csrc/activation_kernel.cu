// Kernel TU of the activation module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "activation_config.h"
#include "activation_launcher.h"
#include "flashinfer/activation.cuh"

namespace fa = flashinfer::activation;

cudaError_t act_and_mul_launch(int act, void* out, const void* input, int64_t rows, int64_t d,
                               int64_t input_stride, int64_t out_stride, cudaStream_t stream) {
  auto* o = static_cast<DType*>(out);
  const auto* x = static_cast<const DType*>(input);
  switch (static_cast<fa::Act>(act)) {
    case fa::Act::kSilu:
      return fa::ActAndMul<DType, fa::Act::kSilu>(o, x, rows, d, input_stride, out_stride, stream);
    case fa::Act::kGelu:
      return fa::ActAndMul<DType, fa::Act::kGelu>(o, x, rows, d, input_stride, out_stride, stream);
    case fa::Act::kGeluTanh:
      return fa::ActAndMul<DType, fa::Act::kGeluTanh>(o, x, rows, d, input_stride, out_stride,
                                                      stream);
  }
  return cudaErrorInvalidValue;
}
