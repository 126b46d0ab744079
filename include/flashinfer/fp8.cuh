// fp8 KV codes (e4m3 or e5m2) widened for the attention kernels: exactly (every e4m3 and e5m2
// value is a half and a bfloat16 value), two codes an instruction (cvt.rn.f16x2.e4m3x2 or
// .e5m2x2 on sm_89 and later; a few integer instructions before).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashinfer {

// Two fp8 codes of a 16-bit word (code 0 in the low byte) as a __half2's bits.
template <typename TKV>
__device__ __forceinline__ __half2_raw fp8x2_to_half2_raw(uint32_t w) {
  static_assert(sizeof(TKV) == 1, "an fp8 type");
  constexpr __nv_fp8_interpretation_t kKind =
      std::is_same_v<TKV, __nv_fp8_e5m2> ? __NV_E5M2 : __NV_E4M3;
  return __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), kKind);
}

// ... as floats.
template <typename TKV>
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t w) {
  const __half2_raw raw = fp8x2_to_half2_raw<TKV>(w);
  __half2 h;
  memcpy(&h, &raw, sizeof(h));
  return __half22float2(h);
}

// ... as two T (__half or __nv_bfloat16) in one word, code 0's in the low half.
template <typename T, typename TKV>
__device__ __forceinline__ uint32_t fp8x2_to(uint32_t w) {
  uint32_t out;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2_raw raw = fp8x2_to_half2_raw<TKV>(w);
    memcpy(&out, &raw, sizeof(out));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "q is float16 or bfloat16");
    const float2 f = fp8x2_to_float2<TKV>(w);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: f is a bf16 value
    memcpy(&out, &b, sizeof(out));
  }
  return out;
}

// Sixteen fp8 codes (code 0 in the low byte of x) as sixteen T: codes 0-7 in `lo`, 8-15 in
// `hi`, each in the order of the codes.
template <typename T, typename TKV>
__device__ __forceinline__ void fp8x16_to(uint4 codes, uint4* lo, uint4* hi) {
  lo->x = fp8x2_to<T, TKV>(codes.x & 0xffffu);
  lo->y = fp8x2_to<T, TKV>(codes.x >> 16);
  lo->z = fp8x2_to<T, TKV>(codes.y & 0xffffu);
  lo->w = fp8x2_to<T, TKV>(codes.y >> 16);
  hi->x = fp8x2_to<T, TKV>(codes.z & 0xffffu);
  hi->y = fp8x2_to<T, TKV>(codes.z >> 16);
  hi->z = fp8x2_to<T, TKV>(codes.w & 0xffffu);
  hi->w = fp8x2_to<T, TKV>(codes.w >> 16);
}

}  // namespace flashinfer
