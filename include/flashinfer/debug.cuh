// Device-side printf helpers for kernel authors.
//
// Each prints from one representative thread per group, prefixed with its block and
// thread, so a warp-specialized kernel can print once from every role. They compile to
// nothing unless the module is built with FLASHINFER_JIT_DEVICE_PRINT=1 (which adds
// -DFLASHINFER_DEVICE_PRINT=1 and so gets its own build dir). See docs/debugging.md.
//
//   FLASHINFER_PRINTF_ONCE(fmt, ...)          thread 0 of block (0, 0, 0)
//   FLASHINFER_PRINTF_BLOCK(fmt, ...)         thread 0 of every block
//   FLASHINFER_PRINTF_WARP(fmt, ...)          lane 0 of every warp
//   FLASHINFER_PRINTF_GROUP(n, fmt, ...)      the first thread of every n consecutive threads
#pragma once

#if defined(FLASHINFER_DEVICE_PRINT) && FLASHINFER_DEVICE_PRINT

#include <cstdio>

namespace flashinfer {
namespace debug {

__device__ __forceinline__ unsigned LinearThreadIdx() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

__device__ __forceinline__ bool IsFirstBlock() {
  return blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}

}  // namespace debug
}  // namespace flashinfer

#define FLASHINFER_PRINTF_GROUP(group_size, fmt, ...)                                 \
  do {                                                                                \
    const unsigned fi_tid_ = ::flashinfer::debug::LinearThreadIdx();                  \
    if (fi_tid_ % static_cast<unsigned>(group_size) == 0) {                           \
      printf("[block (%u,%u,%u) thread %u] " fmt, blockIdx.x, blockIdx.y, blockIdx.z, \
             fi_tid_, ##__VA_ARGS__);                                                 \
    }                                                                                 \
  } while (0)

#define FLASHINFER_PRINTF_ONCE(fmt, ...)                                                      \
  do {                                                                                        \
    if (::flashinfer::debug::IsFirstBlock() && ::flashinfer::debug::LinearThreadIdx() == 0) { \
      printf("[block (0,0,0) thread 0] " fmt, ##__VA_ARGS__);                                 \
    }                                                                                         \
  } while (0)

#define FLASHINFER_PRINTF_BLOCK(fmt, ...) \
  FLASHINFER_PRINTF_GROUP(blockDim.x* blockDim.y* blockDim.z, fmt, ##__VA_ARGS__)

#define FLASHINFER_PRINTF_WARP(fmt, ...) FLASHINFER_PRINTF_GROUP(32, fmt, ##__VA_ARGS__)

#else  // printing compiled out: the arguments are not evaluated

#define FLASHINFER_PRINTF_GROUP(group_size, fmt, ...) \
  do {                                                \
  } while (0)
#define FLASHINFER_PRINTF_ONCE(fmt, ...) \
  do {                                   \
  } while (0)
#define FLASHINFER_PRINTF_BLOCK(fmt, ...) \
  do {                                    \
  } while (0)
#define FLASHINFER_PRINTF_WARP(fmt, ...) \
  do {                                   \
  } while (0)

#endif
