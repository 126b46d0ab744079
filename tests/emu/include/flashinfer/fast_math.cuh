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

}  // namespace flashinfer
