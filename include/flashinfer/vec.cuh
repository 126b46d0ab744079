// Element conversions and aligned vector types shared by the kernels.
// Framework-agnostic: raw pointers only, no torch, no tvm-ffi.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace flashinfer {

// N elements moved as one aligned load/store (16 bytes when N * sizeof(T) == 16).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T data[N];
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
// fp8 e4m3 (OCP "fn": no infinities): round to nearest even, saturating finite values
// beyond +-448 to +-448; NaN stays NaN.
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r;
  r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return r;
}

struct Sum {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `op` over `value` of every thread of the block; every thread gets the result. `identity`
// fills the lanes of missing warps. blockDim.x must be a multiple of 32 and at most 1024;
// kWarps > 0 states it at compile time (blockDim.x == 32 * kWarps). May be called
// repeatedly: the leading barrier keeps a call's writes from racing the previous call's reads.
template <int kWarps = 0, typename V, typename Op>
__device__ __forceinline__ V block_reduce(V value, Op op, V identity) {
  __shared__ V warp_values[32];
  __syncthreads();
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int lane = threadIdx.x & 31;
  if (lane == 0) warp_values[threadIdx.x >> 5] = value;
  __syncthreads();
  const int warps = kWarps > 0 ? kWarps : static_cast<int>(blockDim.x >> 5);
  value = lane < warps ? warp_values[lane] : identity;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

__device__ __forceinline__ float block_reduce_sum(float value) {
  return block_reduce(value, Sum(), 0.f);
}

}  // namespace flashinfer
