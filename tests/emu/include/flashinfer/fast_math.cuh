// The CPU emulator's include/flashinfer/fast_math.cuh: the special-function unit's results
// as the libm functions they approximate, with ex2.approx.ftz's flush of denormal results.
#pragma once

#include <math.h>

namespace flashinfer {

inline float exp2_approx(float x) {
  const float y = exp2f(x);
  return fabsf(y) < 1.17549435e-38f ? 0.f : y;
}

inline float tanh_approx(float x) { return tanhf(x); }

inline void sincos_approx(float x, float* s, float* c) {
  const float turns = rintf(x * 0.159154943f);
  float r = fmaf(turns, -6.28318548f, x);
  r = fmaf(turns, 1.74845553e-7f, r);
  *s = sinf(r);
  *c = cosf(r);
}

}  // namespace flashinfer
