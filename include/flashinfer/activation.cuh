// Gated activations: out[r, i] = act(in[r, i]) * in[r, d + i] for input [rows, 2d].
// act is SiLU, GELU (erf) or GELU (tanh approximation); math in float32. The kernel calls
// pdl_wait() before its first global access, so it may be launched with programmatic
// dependent launch (see pdl.cuh).
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/pdl.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace activation {

enum class Act : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

template <Act A>
__device__ __forceinline__ float Apply(float x);
template <>
__device__ __forceinline__ float Apply<Act::kSilu>(float x) {
  return x / (1.f + expf(-x));
}
template <>
__device__ __forceinline__ float Apply<Act::kGelu>(float x) {
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}
template <>
__device__ __forceinline__ float Apply<Act::kGeluTanh>(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);  // sqrt(2/pi)
  return 0.5f * x * (1.f + tanhf(inner));
}

constexpr int kThreads = 256;

constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y

// blockIdx.x picks a chunk of kThreads vectors of a row; rows stride by gridDim.y.
template <typename T, Act A, int VEC>
__global__ void ActAndMulKernel(T* __restrict__ out, const T* __restrict__ in, int64_t rows,
                                int64_t d, int64_t in_stride, int64_t out_stride) {
  using V = Vec<T, VEC>;
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;  // vector index
  if (i >= d / VEC) return;  // an exited thread counts as having triggered its dependents
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* x = in + row * in_stride;
    const V gate = reinterpret_cast<const V*>(x)[i];
    const V up = reinterpret_cast<const V*>(x + d)[i];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] = from_float<T>(Apply<A>(to_float(gate.data[j])) * to_float(up.data[j]));
    }
    reinterpret_cast<V*>(out + row * out_stride)[i] = o;
  }
  pdl_launch_dependents();
}

template <typename T, Act A>
cudaError_t ActAndMul(T* out, const T* in, int64_t rows, int64_t d, int64_t in_stride,
                      int64_t out_stride, bool pdl, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorized = d % kVec == 0 && in_stride % kVec == 0 && out_stride % kVec == 0 &&
                          reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t vecs = vectorized ? d / kVec : d;
  const dim3 grid(static_cast<unsigned>((vecs + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  // Both instantiations share one signature, so `vectorized` picks the pointer.
  return launch_kernel(vectorized ? ActAndMulKernel<T, A, kVec> : ActAndMulKernel<T, A, 1>, grid,
                       dim3(kThreads), 0, stream, pdl, out, in, rows, d, in_stride, out_stride);
}

}  // namespace activation
}  // namespace flashinfer
