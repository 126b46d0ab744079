// Kernels that break CUDA's rules one way each (launched by tests/emu/faults.py): the emulator
// must fail each launch with its cause (and run the well-behaved ones: a copy through
// shared memory, collectives of part of a warp, shuffle modes and widths, matches and
// reductions, and a static __shared__ array read before it is written).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "flashinfer/mma.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/ptx.cuh"

namespace faults {

enum Fault {
  kNone,
  kDiverge,
  kDeadlock,
  kCopyPastBuffer,
  kUnalignedLdmatrix,
  kExitInCollective,
  kStorePastShared,
  kHalfWarps,
  kShuffleModes,
  kStaticShared,
  kShuffleOutsideMask,
  kMatchReduce,
  kFinishWithoutMe,
  kLoadPastBuffer,  // caught under sanitizers only (tests/emu/test_sanitizers.py)
  kLoadPastStaticShared,
  kSignedOverflow,
  kRaceAcrossWarps,       // the race check's: a read of another warp's store, no barrier between
  kRaceWithinWarp,        // a read of another lane's store: lanes of one warp race too
  kRaceInFlightCopy,      // a read of the thread's own cp.async before its wait
  kRaceStaticShared,      // a store over what another warp read, no barrier between
  kRaceAtomicAndLoad,     // a plain load of a word other warps add to atomically
  kRaceLdmatrix,          // ldmatrix of rows another warp stores, no barrier between
  kRaceGlobalInCta,       // a load of global memory another warp stored, no barrier between
  kRaceGlobalAcrossCtas,  // a load of global memory another CTA of the launch stored
  kAtomics                // every thread adds to one word atomically: legal
};

// The results of the modes that compute: thread t's words at out + 16 t.
__device__ void store_words(uint8_t* out, uint32_t a, uint32_t b, uint32_t c) {
  uint32_t* const words = reinterpret_cast<uint32_t*>(out + 16 * threadIdx.x);
  words[0] = a;
  words[1] = b;
  words[2] = c;
}

// thread t copies 16 bytes from src + 16 t + offset through shared memory to out + 16 t, in
// its CTA's 1024 bytes of `out` (two CTAs storing one byte would race)
__global__ void Kernel(int fault, const uint8_t* src, int64_t offset, uint8_t* out) {
  out += 1024 * blockIdx.x;
  uint8_t* const window = flashinfer::dynamic_shared();
  const unsigned lane = threadIdx.x % 32, t = threadIdx.x;
  if (fault == kHalfWarps) {  // two collectives in one warp at once, each of half the lanes
    const uint32_t r =
        lane < 16 ? __shfl_xor_sync(0x0000ffffu, t, 1) : __ballot_sync(0xffff0000u, lane % 3 == 0);
    return store_words(out, r, 0, 0);
  }
  if (fault == kShuffleModes) {
    const uint32_t index = __shfl_sync(0xffffffffu, t, 3, 8);
    const uint32_t down = __shfl_down_sync(0xffffffffu, t, 5, 16);
    const uint32_t up = __shfl_up_sync(0xffffffffu, t, 2);
    return store_words(out, index, down, up);
  }
  if (fault == kMatchReduce) {  // and a 64-bit shuffle: its halves (t ^ 1, (t ^ 1) + 7)
    const uint32_t match = __match_any_sync(0xffffffffu, lane % 3);
    const uint32_t sum = __reduce_add_sync(0xffffffffu, t);
    const uint64_t pair = __shfl_xor_sync(0xffffffffu, uint64_t{t} << 32 | (t + 7), 1);
    return store_words(out, match, sum, static_cast<uint32_t>(pair >> 32 | pair << 16));
  }
  if (fault == kFinishWithoutMe) {  // odd lanes wait in the last ballot while even ones match
    const bool even = lane % 2 == 0;
    const uint32_t members = __ballot_sync(0xffffffffu, even);
    const uint32_t peers = even ? __match_any_sync(members, lane % 4) : 0u;
    return store_words(out, members, peers, __ballot_sync(0xffffffffu, true));
  }
  if (fault == kStaticShared) {
    __shared__ uint32_t cell[64];
    const uint32_t before = cell[t];  // never written in this CTA yet: poison
    __syncthreads();
    cell[t] = t + 1000 * blockIdx.x;
    __syncthreads();
    return store_words(out, before, cell[(t + 1) % 64], 0);
  }
  if (fault == kShuffleOutsideMask && lane < 16) __shfl_xor_sync(0x0000ffffu, t, 16);
  if (fault == kDiverge) {
    if (lane < 16) {
      __shfl_xor_sync(0xffffffffu, 1, 1);
    } else {
      __ballot_sync(0xffffffffu, true);
    }
  }
  if (fault == kDeadlock) {
    if (lane < 16) {
      __shfl_xor_sync(0xffffffffu, 1, 1);
    } else {
      __syncthreads();
    }
  }
  if (fault == kUnalignedLdmatrix) {
    uint32_t r[4];
    flashinfer::mma::ldmatrix_x4(r, flashinfer::mma::smem_address(window) + 8 * (lane == 5));
  }
  if (fault == kExitInCollective) {
    if (lane == 3) return;
    __shfl_xor_sync(0xffffffffu, 1, 1);
  }
  if (fault == kStorePastShared && threadIdx.x == 0) window[offset] = 1;   // offset: the size
  if (fault == kLoadPastBuffer && threadIdx.x == 0) out[0] = src[offset];  // offset: src's size
  if (fault == kLoadPastStaticShared) {
    __shared__ uint8_t bytes[64];
    bytes[t] = static_cast<uint8_t>(t);
    __syncthreads();
    if (t == 0) out[0] = bytes[offset];  // offset: past the array
  }
  if (fault == kSignedOverflow && threadIdx.x == 0) {
    const int near_max = 0x7fffffff - static_cast<int>(blockIdx.x);
    const int sum = near_max + static_cast<int>(offset);
    memcpy(out, &sum, sizeof sum);
  }
  if (fault == kRaceAcrossWarps || fault == kRaceWithinWarp) {
    window[t] = static_cast<uint8_t>(t);
    return store_words(out, window[fault == kRaceAcrossWarps ? (t + 32) % 64 : t ^ 1], 0, 0);
  }
  if (fault == kRaceInFlightCopy) {
    flashinfer::cp_async_16(window + 16 * t, src + 16 * t, true);
    flashinfer::cp_async_commit();
    return store_words(out, window[16 * t], 0, 0);
  }
  if (fault == kRaceLdmatrix) {
    if (t >= 32) {
      for (int i = 0; i < 16; ++i) window[16 * lane + i] = static_cast<uint8_t>(i);
      return;
    }
    uint32_t r[4];
    flashinfer::mma::ldmatrix_x4(r, flashinfer::mma::smem_address(window) + 16 * lane);
    return store_words(out, r[0], r[1], r[2]);
  }
  if (fault == kRaceGlobalInCta) {  // in the 4 bytes after each thread's words
    out[16 * t + 12] = static_cast<uint8_t>(t);
    return store_words(out, out[16 * ((t + 32) % 64) + 12], 0, 0);
  }
  if (fault == kRaceGlobalAcrossCtas) {
    store_words(out, t, 0, 0);
    __syncthreads();
    // the second CTA reads the word the first CTA's thread t stored
    if (blockIdx.x == 1) out[16 * t + 1] = out[16 * int64_t{t} - 1024];
    return;
  }
  if (fault == kRaceStaticShared) {
    __shared__ uint32_t word[64];
    word[t] = t;
    __syncthreads();
    const uint32_t neighbour = word[(t + 32) % 64];
    word[t] = neighbour;
    return store_words(out, neighbour, 0, 0);
  }
  if (fault == kAtomics || fault == kRaceAtomicAndLoad) {
    __shared__ uint32_t total;
    if (t == 0) total = 0;
    __syncthreads();
    atomicAdd(&total, t + 1);
    if (fault == kAtomics) __syncthreads();
    return store_words(out, total, 0, 0);
  }
  const int64_t at = 16 * int64_t{threadIdx.x};
  flashinfer::cp_async_16(window + at, src + at + (fault == kCopyPastBuffer ? offset : 0), true);
  flashinfer::cp_async_commit();
  flashinfer::cp_async_wait<0>();
  __syncthreads();
  const int64_t from = 16 * int64_t{(threadIdx.x + 1) % blockDim.x};  // another thread's copy
  for (int i = 0; i < 16; ++i) out[at + i] = window[from + i];
}

}  // namespace faults

// Two CTAs of 64 threads with `shared_bytes` of dynamic shared memory (past 48 KiB, the
// attribute never raised, is itself a fault).
struct FaultLaunch {
  int fault;
  const uint8_t* src;
  int64_t offset;
  uint8_t* out;
  int64_t shared_bytes;
};

extern "C" int emu_fault(const FaultLaunch* l) {
  return flashinfer::launch_kernel(faults::Kernel, dim3(2), dim3(64),
                                   static_cast<size_t>(l->shared_bytes), nullptr, false, l->fault,
                                   l->src, l->offset, l->out);
}
