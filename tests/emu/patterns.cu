// Memory access patterns whose cost on a GPU is known (launched by tests/emu/test_profile.py):
// one warp makes one warp-wide access of each pattern's kind, which the memory profile
// (tests/emu/profile.cc) must count as the wavefronts or sectors the hardware takes.
#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/mma.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/ptx.cuh"

namespace patterns {

enum Pattern {
  kSharedWords,          // lane l loads word l: one wavefront
  kSharedEveryOtherWord, // word 2l: two lanes a bank, two wavefronts
  kSharedOneWord,        // every lane word 0 (a broadcast): one
  kSharedVectors,        // 16 bytes at 16 l: four phases of 8 lanes, one wavefront each
  kSharedSpreadVectors,  // 16 bytes at 32 l: two wavefronts a phase, eight
  kSharedColumn,         // a store of word 32 l: every lane in bank 0, 32 wavefronts
  kSharedAtomicOneWord,  // every lane adds to word 0: serialized, 32
  kLdmatrixColumn,       // rows of 128 bytes at their first chunk: 8 rows a bank group, 32
  kLdmatrixSwizzled,     // row r at chunk r % 8: 4, one a matrix
  kGlobalWords,          // word l: 128 bytes, 4 sectors
  kGlobalEveryOtherWord, // word 2 l: 8 sectors for 128 bytes
  kCopies,               // cp.async of 16 bytes at 16 l: 16 sectors, 4 wavefronts
};

// `src` and `out` are 4096 bytes; the warp's results go to out + 4 l
__global__ void Kernel(int pattern, const uint8_t* src, uint8_t* out) {
  uint8_t* const smem = flashinfer::dynamic_shared();
  const unsigned l = threadIdx.x;
  const uint32_t* const words = reinterpret_cast<const uint32_t*>(smem);
  const uint4* const vectors = reinterpret_cast<const uint4*>(smem);
  const uint32_t* const global = reinterpret_cast<const uint32_t*>(src);
  uint32_t r = 0;
  switch (pattern) {
    case kSharedWords:
      r = words[l];
      break;
    case kSharedEveryOtherWord:
      r = words[2 * l];
      break;
    case kSharedOneWord:
      r = words[0];
      break;
    case kSharedVectors:
    case kSharedSpreadVectors: {
      const uint4 v = vectors[pattern == kSharedVectors ? l : 2 * l];
      r = v.x ^ v.y ^ v.z ^ v.w;
      break;
    }
    case kSharedColumn:
      reinterpret_cast<uint32_t*>(smem)[32 * l] = l;
      break;
    case kSharedAtomicOneWord:
      r = atomicAdd(reinterpret_cast<unsigned*>(smem), 1u);
      break;
    case kLdmatrixColumn:
    case kLdmatrixSwizzled: {
      const uint32_t chunk = pattern == kLdmatrixSwizzled ? l % 8 : 0;
      uint32_t m[4];
      flashinfer::mma::ldmatrix_x4(m, flashinfer::mma::smem_address(smem) + 128 * l + 16 * chunk);
      r = m[0] ^ m[3];
      break;
    }
    case kGlobalWords:
      r = global[l];
      break;
    case kGlobalEveryOtherWord:
      r = global[2 * l];
      break;
    case kCopies:
      flashinfer::cp_async_16(smem + 16 * l, src + 16 * l, true);
      flashinfer::cp_async_commit();
      flashinfer::cp_async_wait<0>();
      break;
  }
  reinterpret_cast<uint32_t*>(out)[l] = r;
}

}  // namespace patterns

struct PatternLaunch {
  int pattern;
  const uint8_t* src;
  uint8_t* out;
};

extern "C" int emu_pattern(const PatternLaunch* l) {
  return flashinfer::launch_kernel(patterns::Kernel, dim3(1), dim3(32), 4096, nullptr, false,
                                   l->pattern, l->src, l->out);
}
