// Kernels that break CUDA's rules one way each, for tests/emu/test_simt.py: the emulator
// must fail each launch with its cause (and run the well-behaved copy).
#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/mma.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/ptx.cuh"

namespace faults {

alignas(128) uint8_t window[64 * 1024];

enum Fault {
  kNone,
  kDiverge,
  kDeadlock,
  kCopyPastBuffer,
  kUnalignedLdmatrix,
  kExitInCollective,
  kStorePastShared
};

// thread t copies 16 bytes from src + 16 t + offset through shared memory to out + 16 t
__global__ void Kernel(int fault, const uint8_t* src, int64_t offset, uint8_t* out) {
  extern __shared__ __align__(16) uint8_t window[];
  const unsigned lane = threadIdx.x % 32;
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
  if (fault == kStorePastShared && threadIdx.x == 0) window[offset] = 1;  // offset: the size
  const int64_t at = 16 * int64_t{threadIdx.x};
  flashinfer::cp_async_16(window + at, src + at + (fault == kCopyPastBuffer ? offset : 0), true);
  flashinfer::cp_async_commit();
  flashinfer::cp_async_wait<0>();
  __syncthreads();
  const int64_t from = 16 * int64_t{(threadIdx.x + 1) % blockDim.x};  // another thread's copy
  for (int i = 0; i < 16; ++i) out[at + i] = window[from + i];
}

}  // namespace faults

namespace {
const bool registered = (simt::set_shared_window(faults::window, sizeof faults::window), true);
}  // namespace

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
