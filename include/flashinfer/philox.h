// The host-and-device arithmetic of the sampling kernels: the Philox4x32-10 generator of
// Salmon et al. (SC'11), the counter layout that places a kernel's draws in the caller's
// random stream, the mapping of random words to uniforms, and the float key order of the
// radix select. Plain C++ when not compiled by nvcc, so a CPU test evaluates exactly what
// the kernels compute.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashinfer/host_device.h"

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

// Block `block` of subsequence `subsequence` under `seed`, laid out as curand and torch lay
// out theirs (curand_init(seed, subsequence, offset) starts at block offset / 4): the block
// index in the counter's low 64 bits, the subsequence in its high 64 bits.
FLASHINFER_HOST_DEVICE PhiloxBlock philox_block(uint64_t seed, uint64_t subsequence,
                                                uint64_t block) {
  return philox4x32_10(
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
       static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Words offset + 4 * group .. offset + 4 * group + 3 of subsequence `subsequence`: what
// curand_init(seed, subsequence, offset) followed by 4 * group + 4 curand() calls returns
// last. A call that draws words [offset, offset + 4 * groups) of its subsequences consumes
// offsets [offset, offset + 4 * groups) of a torch generator, which must then advance by
// 4 * groups so the next draw, ours or torch's, starts past them.
FLASHINFER_HOST_DEVICE PhiloxBlock philox_words(uint64_t seed, uint64_t subsequence,
                                                uint64_t offset, uint64_t group) {
  const uint64_t block = offset / 4 + group;
  const PhiloxBlock a = philox_block(seed, subsequence, block);
  const uint32_t shift = static_cast<uint32_t>(offset & 3u);
  if (shift == 0) return a;
  const PhiloxBlock b = philox_block(seed, subsequence, block + 1);
  if (shift == 1) return {a.y, a.z, a.w, b.x};
  if (shift == 2) return {a.z, a.w, b.x, b.y};
  return {a.w, b.x, b.y, b.z};
}

// A uniform in (0, 1) from 32 random bits: bits * 2^-32 + 2^-33 with bits first rounded
// toward zero to float, so the result never rounds up to 1 (at most 1 - 2^-24) and is never
// 0 (at least 2^-33); full resolution near 0, where -log(1 - u) needs it.
FLASHINFER_HOST_DEVICE float uniform_open01(uint32_t bits) {
#ifdef __CUDA_ARCH__
  const float f = __uint2float_rz(bits);
#else
  float f = static_cast<float>(bits);
  if (static_cast<uint64_t>(f) > bits) f = std::nextafter(f, 0.f);
#endif
  return f * 2.3283064365386963e-10f + 1.1641532182693481e-10f;
}

// Exp(1) from a uniform in (0, 1): -log(1 - u), accurate for small u; finite because u < 1.
FLASHINFER_HOST_DEVICE float exponential_from_uniform(float u) { return -log1pf(-u); }

FLASHINFER_HOST_DEVICE uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

// A key whose unsigned order is the order of the floats, -0.0 and +0.0 tying (NaNs sort
// beyond the infinities of their sign).
FLASHINFER_HOST_DEVICE uint32_t ordered_key(float x) {
  uint32_t bits = float_bits(x);
  if ((bits << 1) == 0u) bits = 0u;  // -0.0 is +0.0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace flashinfer
