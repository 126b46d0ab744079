// Kernel TU of the norm module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/norm.cuh"
#include "norm_config.h"
#include "norm_launcher.h"

template cudaError_t flashinfer::norm::RMSNorm<DType>(DType*, const DType*, const DType*, int64_t,
                                                      int64_t, int64_t, int64_t, float,
                                                      cudaStream_t);

cudaError_t rmsnorm_launch(void* out, const void* input, const void* weight, int64_t rows,
                           int64_t hidden, int64_t input_stride, int64_t out_stride, float eps,
                           cudaStream_t stream) {
  return flashinfer::norm::RMSNorm<DType>(static_cast<DType*>(out),
                                          static_cast<const DType*>(input),
                                          static_cast<const DType*>(weight), rows, hidden,
                                          input_stride, out_stride, eps, stream);
}
