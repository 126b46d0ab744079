// The inline PTX the attention kernels issue besides the tensor-core instructions (mma.cuh)
// and the special-function unit (fast_math.cuh): page-table loads, cp.async copies into shared
// memory, and %tid.x; and the launch's dynamic shared memory. Kept to these few headers so
// that the CPU emulator of the kernels (tests/emu) replaces exactly them and compiles every
// other line as the GPU runs it. Framework-agnostic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashinfer {

// *ptr when `pred`, else `fallback`: a predicated load, not a branch, so that several of
// them issue back to back. For tables that do not change while the kernel runs (.nc).
// Volatile: it stays after pdl_wait() (griddepcontrol.wait) whatever its operands are.
__device__ __forceinline__ int load_if(const int32_t* ptr, bool pred, int fallback) {
  int value = fallback;
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.global.nc.b32 %0, [%1];\n}\n"
               : "+r"(value)
               : "l"(ptr), "r"(static_cast<int>(pred)));
  return value;
}

// 16 bytes from global to shared memory, asynchronously: they land by the cp_async_wait that
// covers this copy's commit group. !fill: 16 zero bytes, nothing read.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;  // 0: write zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// Waits until at most kPending of this thread's newest commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The launch's dynamic shared memory, 16-byte aligned: the one `extern __shared__` array every
// kernel carves up.
__device__ __forceinline__ uint8_t* dynamic_shared() {
  extern __shared__ __align__(16) uint8_t dynamic_shared_bytes[];
  return dynamic_shared_bytes;
}

// threadIdx.x, read where it is used: what a lane derives from it (its rows, its ldmatrix and
// load addresses) is then recomputed in each tile instead of hoisted out of the main loop and
// held in registers through it.
__device__ __forceinline__ unsigned thread_index() {
  unsigned tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

}  // namespace flashinfer
