// The emulator's element conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h stand-ins) over
// an array, for tests/emu/test_conversions.py to compare with torch's casts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>

// kind 0: float16, 1: bfloat16 (16-bit codes), 2: fp8 e4m3 saturating (8-bit codes)
extern "C" void emu_convert(int kind, const float* in, void* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (kind == 0) static_cast<uint16_t*>(out)[i] = __float2half_rn(in[i]).__x;
    if (kind == 1) static_cast<uint16_t*>(out)[i] = __float2bfloat16_rn(in[i]).__x;
    if (kind == 2) {
      static_cast<uint8_t*>(out)[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3);
    }
  }
}
