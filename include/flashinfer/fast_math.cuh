// Fast math for the attention kernels' online softmax. Framework-agnostic.
#pragma once

#include <cuda_runtime.h>

namespace flashinfer {

// 2^x on the special-function unit (ex2.approx: 2 ulp); -inf gives 0 and denormal results
// flush to 0, which no softmax weight or rescale factor can tell apart.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the special-function unit (tanh.approx: relative error about 2^-11), as the reference
// library computes its logits soft cap; one instruction, where tanhf is a branchy polynomial.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashinfer
