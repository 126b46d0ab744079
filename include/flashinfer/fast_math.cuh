// Fast math for the attention kernels' online softmax and RoPE. Framework-agnostic.
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

// sin and cos of x on the special-function unit (sin.approx / cos.approx: absolute error about
// 2^-21 in [-pi, pi]), x first reduced to [-pi, pi] by whole turns (2 pi in two parts, so the
// reduction adds no error of its own): a late position times a high frequency keeps the
// accuracy its float has.
__device__ __forceinline__ void sincos_approx(float x, float* s, float* c) {
  const float turns = rintf(x * 0.159154943f);
  float r = fmaf(turns, -6.28318548f, x);  // 2 pi = 6.28318548f - 1.74845553e-7f
  r = fmaf(turns, 1.74845553e-7f, r);
  asm("sin.approx.f32 %0, %1;" : "=f"(*s) : "f"(r));
  asm("cos.approx.f32 %0, %1;" : "=f"(*c) : "f"(r));
}

}  // namespace flashinfer
