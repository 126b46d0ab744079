// RMSNorm: out[r, :] = in[r, :] * rsqrt(mean(in[r, :]^2) + eps) * weight.
// Framework-agnostic: raw pointers, sizes and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace norm {

// One block per row. Pass 1 accumulates the sum of squares in float; pass 2 re-reads
// the row (an L1/L2 hit for rows up to a few hundred KiB) and writes the output.
template <typename T, int VEC>
__global__ void RMSNormKernel(T* __restrict__ out, const T* __restrict__ in,
                              const T* __restrict__ weight, int64_t hidden, int64_t in_stride,
                              int64_t out_stride, float eps) {
  using V = Vec<T, VEC>;
  const T* x = in + static_cast<int64_t>(blockIdx.x) * in_stride;
  T* y = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  const int64_t num_vecs = hidden / VEC;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_float(v.data[j]);
      sum_sq += f * f;
    }
  }
  sum_sq = block_reduce_sum(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);

  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V v = reinterpret_cast<const V*>(x)[i];
    const V w = reinterpret_cast<const V*>(weight)[i];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] = from_float<T>(to_float(v.data[j]) * inv_rms * to_float(w.data[j]));
    }
    reinterpret_cast<V*>(y)[i] = o;
  }
}

inline bool IsAligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// rows x hidden input with row strides in elements (last dim contiguous).
// Uses 16-byte vectors when every row start is 16-byte aligned, else scalar access.
template <typename T>
cudaError_t RMSNorm(T* out, const T* in, const T* weight, int64_t rows, int64_t hidden,
                    int64_t in_stride, int64_t out_stride, float eps, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorized = hidden % kVec == 0 && in_stride % kVec == 0 &&
                          out_stride % kVec == 0 && IsAligned(in, 16) && IsAligned(out, 16) &&
                          IsAligned(weight, 16);
  const int64_t units = vectorized ? hidden / kVec : hidden;
  const int64_t warps = (units + 31) / 32;
  const unsigned threads = static_cast<unsigned>(32 * (warps < 32 ? warps : 32));
  const dim3 grid(static_cast<unsigned>(rows));
  if (vectorized) {
    RMSNormKernel<T, kVec><<<grid, threads, 0, stream>>>(out, in, weight, hidden, in_stride,
                                                        out_stride, eps);
  } else {
    RMSNormKernel<T, 1><<<grid, threads, 0, stream>>>(out, in, weight, hidden, in_stride,
                                                     out_stride, eps);
  }
  return cudaGetLastError();
}

}  // namespace norm
}  // namespace flashinfer
