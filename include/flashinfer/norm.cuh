// Normalizations over the last dim of [tokens, hidden] or [tokens, heads, head_dim] data:
//   RMSNorm:          out = x * rsqrt(mean(x^2) + eps) * (weight + weight_offset)
//   FusedAddRMSNorm:  residual += input; input = RMSNorm(residual)      (in place)
//   LayerNorm:        out = (x - mean(x)) * rsqrt(var(x) + eps) * gamma + beta
// weight_offset is 0, or 1 for the Gemma variants. Math in float32.
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace norm {

// Where row r of a [tokens, heads, dim] tensor starts, in elements. Rows are
// (token, head) pairs, r = token * heads + head; 2-D data is heads = 1.
struct RowLayout {
  int64_t heads;
  int64_t token_stride;
  int64_t head_stride;

  __host__ __device__ __forceinline__ int64_t offset(int64_t row) const {
    return (row / heads) * token_stride + (row % heads) * head_stride;
  }
  bool Aligned(int64_t vec) const { return token_stride % vec == 0 && head_stride % vec == 0; }
};

// One block per row. Pass 1 reduces in float; the last pass re-reads the row (an L1/L2 hit
// for rows up to a few hundred KiB) and writes it.
template <typename T, int VEC>
__global__ void RMSNormKernel(T* __restrict__ out, const T* __restrict__ in,
                              const T* __restrict__ weight, int64_t hidden, RowLayout in_layout,
                              RowLayout out_layout, float eps, float weight_offset) {
  using V = Vec<T, VEC>;
  const T* x = in + in_layout.offset(blockIdx.x);
  T* y = out + out_layout.offset(blockIdx.x);
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
      o.data[j] =
          from_float<T>(to_float(v.data[j]) * inv_rms * (to_float(w.data[j]) + weight_offset));
    }
    reinterpret_cast<V*>(y)[i] = o;
  }
}

// residual = T(input + residual); input = RMSNorm(residual). Each thread re-reads only the
// elements it wrote itself, so no barrier is needed between the two passes' accesses.
template <typename T, int VEC>
__global__ void FusedAddRMSNormKernel(T* __restrict__ input, T* __restrict__ residual,
                                      const T* __restrict__ weight, int64_t hidden,
                                      RowLayout in_layout, RowLayout res_layout, float eps,
                                      float weight_offset) {
  using V = Vec<T, VEC>;
  T* x = input + in_layout.offset(blockIdx.x);
  T* r = residual + res_layout.offset(blockIdx.x);
  const int64_t num_vecs = hidden / VEC;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V a = reinterpret_cast<const V*>(x)[i];
    V b = reinterpret_cast<const V*>(r)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      b.data[j] = from_float<T>(to_float(a.data[j]) + to_float(b.data[j]));
      const float f = to_float(b.data[j]);
      sum_sq += f * f;
    }
    reinterpret_cast<V*>(r)[i] = b;
  }
  sum_sq = block_reduce_sum(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);

  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V b = reinterpret_cast<const V*>(r)[i];
    const V w = reinterpret_cast<const V*>(weight)[i];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] =
          from_float<T>(to_float(b.data[j]) * inv_rms * (to_float(w.data[j]) + weight_offset));
    }
    reinterpret_cast<V*>(x)[i] = o;
  }
}

// gamma and beta are float32, as in the reference library's layernorm. Mean first, then
// the variance around it (no E[x^2] - mean^2 cancellation).
template <typename T, int VEC>
__global__ void LayerNormKernel(T* __restrict__ out, const T* __restrict__ in,
                                const float* __restrict__ gamma, const float* __restrict__ beta,
                                int64_t hidden, RowLayout in_layout, RowLayout out_layout,
                                float eps) {
  using V = Vec<T, VEC>;
  const T* x = in + in_layout.offset(blockIdx.x);
  T* y = out + out_layout.offset(blockIdx.x);
  const int64_t num_vecs = hidden / VEC;

  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_float(v.data[j]);
  }
  const float mean = block_reduce_sum(sum) / static_cast<float>(hidden);

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_float(v.data[j]) - mean;
      sum_sq += d * d;
    }
  }
  const float inv_std = rsqrtf(block_reduce_sum(sum_sq) / static_cast<float>(hidden) + eps);

  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const V v = reinterpret_cast<const V*>(x)[i];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t k = i * VEC + j;
      o.data[j] = from_float<T>((to_float(v.data[j]) - mean) * inv_std * gamma[k] + beta[k]);
    }
    reinterpret_cast<V*>(y)[i] = o;
  }
}

inline bool IsAligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Threads per block: enough warps for one vector per thread, at most 32 warps.
inline unsigned BlockThreads(int64_t units) {
  const int64_t warps = (units + 31) / 32;
  return static_cast<unsigned>(32 * (warps < 1 ? 1 : (warps < 32 ? warps : 32)));
}

// 16-byte vectors when every row start is 16-byte aligned, else scalar access.
template <typename T>
bool UseVectors(int64_t hidden, const RowLayout& a, const void* pa, const RowLayout& b,
                const void* pb, const void* weight) {
  constexpr int kVec = 16 / sizeof(T);
  return hidden % kVec == 0 && a.Aligned(kVec) && b.Aligned(kVec) && IsAligned(pa, 16) &&
         IsAligned(pb, 16) && IsAligned(weight, 16);
}

template <typename T>
cudaError_t RMSNorm(T* out, const T* in, const T* weight, int64_t rows, int64_t hidden,
                    RowLayout in_layout, RowLayout out_layout, float eps, float weight_offset,
                    cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>(rows));
  if (UseVectors<T>(hidden, in_layout, in, out_layout, out, weight)) {
    RMSNormKernel<T, kVec><<<grid, BlockThreads(hidden / kVec), 0, stream>>>(
        out, in, weight, hidden, in_layout, out_layout, eps, weight_offset);
  } else {
    RMSNormKernel<T, 1><<<grid, BlockThreads(hidden), 0, stream>>>(
        out, in, weight, hidden, in_layout, out_layout, eps, weight_offset);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t FusedAddRMSNorm(T* input, T* residual, const T* weight, int64_t rows, int64_t hidden,
                            RowLayout in_layout, RowLayout res_layout, float eps,
                            float weight_offset, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>(rows));
  if (UseVectors<T>(hidden, in_layout, input, res_layout, residual, weight)) {
    FusedAddRMSNormKernel<T, kVec><<<grid, BlockThreads(hidden / kVec), 0, stream>>>(
        input, residual, weight, hidden, in_layout, res_layout, eps, weight_offset);
  } else {
    FusedAddRMSNormKernel<T, 1><<<grid, BlockThreads(hidden), 0, stream>>>(
        input, residual, weight, hidden, in_layout, res_layout, eps, weight_offset);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LayerNorm(T* out, const T* in, const float* gamma, const float* beta, int64_t rows,
                      int64_t hidden, RowLayout in_layout, RowLayout out_layout, float eps,
                      cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>(rows));
  if (UseVectors<T>(hidden, in_layout, in, out_layout, out, gamma)) {
    LayerNormKernel<T, kVec><<<grid, BlockThreads(hidden / kVec), 0, stream>>>(
        out, in, gamma, beta, hidden, in_layout, out_layout, eps);
  } else {
    LayerNormKernel<T, 1><<<grid, BlockThreads(hidden), 0, stream>>>(
        out, in, gamma, beta, hidden, in_layout, out_layout, eps);
  }
  return cudaGetLastError();
}

}  // namespace norm
}  // namespace flashinfer
