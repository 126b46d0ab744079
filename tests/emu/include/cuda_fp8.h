// Stand-in for cuda_fp8.h under the CPU emulator: the e4m3 and e5m2 types and the conversions
// the kernels make: float to e4m3 ("fn": no infinities, 0x7f NaN) saturating to +-448,
// rounding to nearest even as the GPU's cvt.rn.satfinite does (other kinds abort), and pairs
// of e4m3 or e5m2 to half (exact: half holds every value of both).
#pragma once

#include <cuda_fp16.h>
#include <math.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

struct __nv_fp8_e4m3 {
  uint8_t __x;
};
struct __nv_fp8_e5m2 {
  uint8_t __x;
};
typedef unsigned short __nv_fp8x2_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

inline uint8_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate,
                                     __nv_fp8_interpretation_t kind) {
  if (saturate != __NV_SATFINITE || kind != __NV_E4M3) {
    std::fprintf(stderr, "emulator: only the saturating float-to-e4m3 conversion is emulated\n");
    std::abort();
  }
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  const float a = fabsf(x);
  if (isnan(a)) return sign | 0x7f;
  if (a >= 448.f) return sign | 0x7e;  // infinities too
  if (a == 0.f) return sign;
  // a = 2^e * m / 8 with e >= -6: m in [8, 16) for a normal value, m in [0, 8) for a
  // subnormal one (e = -6), m rounded to an integer; its code (exponent field e + 7, mantissa
  // field m - 8) is 8 (e + 6) + m, which also holds when m rounds up to 16 (the next
  // exponent's m = 8) or a subnormal's to 8 (the least normal value)
  int e;
  frexpf(a, &e);  // a = f * 2^e, f in [0.5, 1)
  e = e - 1 < -6 ? -6 : e - 1;
  const int m = static_cast<int>(nearbyintf(ldexpf(a, 3 - e)));  // exact scaling, then RNE
  return sign | static_cast<uint8_t>(8 * (e + 6) + m);
}

// One fp8 code as half bits. e5m2 is binary16 without its low byte; an e4m3 code (exponent
// field e, bias 7, mantissa field m) is m * 2^-9 when e == 0, else (8 + m) * 2^(e - 10);
// 0x7f and 0xff are NaN.
inline uint16_t emu_fp8_to_half_bits(uint8_t code, __nv_fp8_interpretation_t kind) {
  if (kind == __NV_E5M2) return static_cast<uint16_t>(code << 8);
  if ((code & 0x7f) == 0x7f) return 0x7fff;
  const int e = (code >> 3) & 15, m = code & 7;
  const float a = e == 0 ? ldexpf(static_cast<float>(m), -9) : ldexpf(8.f + m, e - 10);
  return __float2half_rn(code & 0x80 ? -a : a).__x;
}

// Two fp8 codes (the low byte first) as a __half2's bits.
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t x,
                                              __nv_fp8_interpretation_t kind) {
  return {emu_fp8_to_half_bits(static_cast<uint8_t>(x & 0xff), kind),
          emu_fp8_to_half_bits(static_cast<uint8_t>(x >> 8), kind)};
}
