// Stand-in for cuda_fp16.h under the CPU emulator: IEEE binary16 as its bits, converted with
// round-to-nearest-even as the GPU's cvt.rn does.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "vector_types.h"

struct __half {
  uint16_t __x;
};
struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(4) __half2_raw {  // a __half2's bits, low half first
  unsigned short x, y;
};

inline __half __float2half_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (mag >= 0x47800000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // >= 2^16: inf
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal, in units of 2^-24
    float a;
    std::memcpy(&a, &mag, 4);
    return {static_cast<uint16_t>(sign | static_cast<uint32_t>(nearbyintf(a * 16777216.0f)))};
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even (a carry
  // into the exponent is the right result, up to inf at 65520)
  uint32_t h = (((mag >> 23) - 112u) << 10) | ((mag & 0x7fffffu) >> 13);
  const uint32_t rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return {static_cast<uint16_t>(sign | h)};
}

inline float __half2float(__half h) {
  const uint32_t sign = uint32_t{h.__x & 0x8000u} << 16, e = (h.__x >> 10) & 0x1fu,
                 m = h.__x & 0x3ffu;
  float f;
  if (e == 0) {
    f = ldexpf(static_cast<float>(m), -24);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const uint32_t bits = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __half2 __floats2half2_rn(float a, float b) {
  return {__float2half_rn(a), __float2half_rn(b)};
}

inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
