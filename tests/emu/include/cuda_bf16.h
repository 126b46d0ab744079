// Stand-in for cuda_bf16.h under the CPU emulator: bfloat16 as its bits, converted with
// round-to-nearest-even as the GPU's cvt.rn does.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t __x;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x40u)};  // NaN
  return {static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = uint32_t{h.__x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
