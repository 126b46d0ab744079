// Stand-in for the CUDA runtime header when the kernels are compiled by the host compiler
// for the CPU emulator (tests/emu): CUDA's keywords as plain C++, the built-in variables and
// intrinsics the kernels use as calls into the emulator (simt.h), and the few runtime calls
// the launch paths make. Nothing here links against CUDA.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "vector_types.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// A static __shared__ variable is one per process, which is one per CTA since CTAs run one
// after another; tests/emu/engine.py adds a call after each declaration that has the
// emulator poison it when each CTA starts. (Dynamic shared memory is flashinfer's
// dynamic_shared(), the emulator's window: see flashinfer/ptx.cuh.)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};

typedef struct CUstream_st* cudaStream_t;

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };

template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}

#include "simt.h"

#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::block_idx())
#define blockDim (::simt::block_dim())
#define gridDim (::simt::grid_dim())

inline void __syncthreads() { ::simt::sync_threads(); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return ::simt::shuffle(mask, value, lane_mask, ::simt::Shuffle::kXor, width);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  return ::simt::shuffle(mask, value, src_lane, ::simt::Shuffle::kIndex, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::simt::shuffle(mask, value, static_cast<int>(delta), ::simt::Shuffle::kUp, width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return ::simt::shuffle(mask, value, static_cast<int>(delta), ::simt::Shuffle::kDown, width);
}
inline unsigned __ballot_sync(unsigned mask, bool pred) { return ::simt::ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return ::simt::ballot(mask, pred != 0) != 0; }
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T value) {
  static_assert(sizeof(T) == 4, "32-bit matches");
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return ::simt::match_any(mask, bits);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return ::simt::reduce_add(mask, value);
}
inline size_t __cvta_generic_to_shared(const void* p) { return ::simt::shared_offset(p); }

// CUDA's device math beyond libm: rsqrtf (the GPU's is within 2 ulp of this) and the fast
// __expf and __logf (the GPU's are within a few ulp of these for the arguments kernels pass)
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// cvt.rzi.u64.f32: toward zero, NaN and negatives to 0, saturating at 2^64 - 1
inline unsigned long long __float2ull_rz(float x) {
  if (!(x > 0.f)) return 0ull;
  return x >= 18446744073709551616.f ? ~0ull : static_cast<unsigned long long>(x);
}

// Atomics: threads switch only at barriers and collectives, so a plain read-modify-write is
// one atomic operation (announced to the race check, and kept out of its plain accesses; the
// compiler never inlines this into a kernel it instruments, so the return address is the
// kernel's call, for the memory profile).
template <typename T>
__attribute__((no_sanitize_thread)) inline T atomicAdd(T* address, T value) {
  ::simt::atomic_access(address, sizeof(T), __builtin_return_address(0));
  const T old = *address;
  *address = old + value;
  return old;
}

inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline float __int_as_float(int x) { return __uint_as_float(static_cast<unsigned>(x)); }

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attribute, int value) {
  return ::simt::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), attribute, value);
}
template <typename F>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F*, int, size_t) {
  *blocks = 1;
  return cudaSuccess;
}
// an H100's (the emulator's shared-memory window)
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int device) {
  *value = 227 * 1024;
  return device == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
inline const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaError";
}
// the emulator's account of the failure (block, thread and cause)
inline const char* cudaGetErrorString(cudaError_t) { return ::simt::last_error(); }
// no per-thread error state to clear: a launch's failure is its return value (and the
// account above stays for the message)
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
