// The CPU emulator's include/flashinfer/fast_math.cuh: the special-function unit's results as
// the libm functions they approximate, each off by the most its PTX instruction may be off (the
// bound the kernel's own header names), up or down as a hash of the input's bits falls, with
// ex2.approx.ftz's flush of denormal results. A tolerance that holds here holds for the GPU's
// approximations, which the exact functions alone would not show.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace flashinfer {

namespace emulated_sfu {

// +1 or -1 from the bits of x (a multiplicative hash's top bit)
inline float sign_of(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return (bits * 2654435761u) >> 31 ? 1.f : -1.f;
}

constexpr float kEx2RelativeError = 0x1p-22f;  // ex2.approx.ftz.f32: 2 ulp
constexpr float kTanhRelativeError = 0x1p-11f;  // tanh.approx.f32
constexpr float kSinCosAbsoluteError = 0x1p-21f;  // sin/cos.approx.f32 in [-pi, pi]

}  // namespace emulated_sfu

// Whole powers of two (2^0 = 1: a row's rescale that kept its max) come out exact.
inline float exp2_approx(float x) {
  float y = exp2f(x);
  if (x != rintf(x)) y *= 1.f + emulated_sfu::sign_of(x) * emulated_sfu::kEx2RelativeError;
  return fabsf(y) < 1.17549435e-38f ? 0.f : y;
}

// Never past +-1; NaN stays NaN (fminf and fmaxf would drop it).
inline float tanh_approx(float x) {
  const float y = tanhf(x) * (1.f + emulated_sfu::sign_of(x) * emulated_sfu::kTanhRelativeError);
  return y > 1.f ? 1.f : (y < -1.f ? -1.f : y);
}

// An angle of 0 (position 0) keeps its exact sin 0 and cos 1.
inline void sincos_approx(float x, float* s, float* c) {
  const float turns = rintf(x * 0.159154943f);
  float r = fmaf(turns, -6.28318548f, x);
  r = fmaf(turns, 1.74845553e-7f, r);
  const float off = r == 0.f ? 0.f : emulated_sfu::sign_of(r) * emulated_sfu::kSinCosAbsoluteError;
  *s = sinf(r) + off;
  *c = cosf(r) - off;
}

}  // namespace flashinfer
