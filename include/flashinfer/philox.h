// Philox4x32-10, the counter-based generator of Salmon et al. (SC'11): a pure function of
// a 128-bit counter and a 64-bit key, so each (row, element) can draw its own numbers
// without any state. Host and device; plain C++ when not compiled by nvcc, so host code
// (and a CPU test) can evaluate exactly what the kernels draw.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FLASHINFER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHINFER_HOST_DEVICE inline
#endif

namespace flashinfer {

struct PhiloxBlock {
  uint32_t x, y, z, w;
};

FLASHINFER_HOST_DEVICE PhiloxBlock philox4x32_10(PhiloxBlock ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr.x;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr.z;
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr.y ^ key0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr.w ^ key1, static_cast<uint32_t>(p0)};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return ctr;
}

}  // namespace flashinfer
