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

// Every fp8 code (0..255, as pairs) to half bits: kind 0 e4m3, 1 e5m2.
extern "C" void emu_widen_fp8(int kind, uint16_t* out) {
  for (unsigned code = 0; code < 256; code += 2) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(code | (code + 1) << 8),
                                   kind == 0 ? __NV_E4M3 : __NV_E5M2);
    out[code] = h.x;
    out[code + 1] = h.y;
  }
}
