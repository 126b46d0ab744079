// The CPU emulator's include/flashinfer/mma.cuh: the same functions, each a warp collective
// of the emulator (simt.h) that computes what PTX specifies for ldmatrix and mma.sync.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace flashinfer {
namespace mma {

inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

inline void ldmatrix_x4(uint32_t* r, uint32_t address) { ::simt::ldmatrix_x4(r, address, false); }

inline void ldmatrix_x4_trans(uint32_t* r, uint32_t address) {
  ::simt::ldmatrix_x4(r, address, true);
}

template <typename T>
inline void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);

template <>
inline void mma_16816<__half>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  ::simt::mma_16816(c, a, b0, b1, ::simt::Element::kHalf);
}

template <>
inline void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  ::simt::mma_16816(c, a, b0, b1, ::simt::Element::kBFloat16);
}

template <typename T>
inline uint32_t pack2(float x, float y);

template <>
inline uint32_t pack2<__half>(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return uint32_t{h.x.__x} | uint32_t{h.y.__x} << 16;
}

template <>
inline uint32_t pack2<__nv_bfloat16>(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return uint32_t{h.x.__x} | uint32_t{h.y.__x} << 16;
}

}  // namespace mma
}  // namespace flashinfer
