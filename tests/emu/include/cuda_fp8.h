// Stand-in for cuda_fp8.h under the CPU emulator: the type and the conversion's declaration,
// so that headers mentioning fp8 compile; no emulated kernel converts to fp8 yet.
#pragma once

#include <cstdint>

struct __nv_fp8_e4m3 {
  uint8_t __x;
};
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
uint8_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate, __nv_fp8_interpretation_t kind);
