// Normalizations over the last dim of [tokens, hidden] or [tokens, heads, head_dim] data:
//   RMSNorm:          out = x * rsqrt(mean(x^2) + eps) * (weight + weight_offset)
//   FusedAddRMSNorm:  s = input + residual (float32); residual = T(s); out = RMSNorm(s)
//   LayerNorm:        out = (x - mean(x)) * rsqrt(var(x) + eps) * gamma + beta
// weight_offset is 0, or 1 for the Gemma variants. Math in float32. The RMSNorm outputs are
// the input's type, or fp8 e4m3 quantized as out = fp8(clamp(y / scale, -448, 448)).
// Every kernel calls pdl_wait() before its first global access, so it may be launched with
// programmatic dependent launch (see pdl.cuh).
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "flashinfer/pdl.cuh"
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

  // From any struct with the same three fields (a launcher's plain C++ layout).
  template <typename Layout>
  static RowLayout From(const Layout& l) {
    return {l.heads, l.token_stride, l.head_stride};
  }
};

// The quantization scale: a device float (`ptr`, read after pdl_wait, so the previous
// kernel may produce it) or, when `ptr` is null, `value`. Unused by non-quantized outputs.
struct QuantScale {
  const float* ptr;
  float value;
};

// Converts a normalized float to the output element: rounds to O.
template <typename O>
struct OutputConverter {
  __device__ __forceinline__ explicit OutputConverter(QuantScale) {}
  __device__ __forceinline__ O operator()(float y) const { return from_float<O>(y); }
};

// fp8 e4m3, as the reference library quantizes: y times the float reciprocal of the scale,
// clamped to +-448 (fmaxf/fminf also map NaN to 448), rounded to nearest even.
template <>
struct OutputConverter<__nv_fp8_e4m3> {
  float inv_scale;
  __device__ __forceinline__ explicit OutputConverter(QuantScale s)
      : inv_scale(1.f / (s.ptr != nullptr ? *s.ptr : s.value)) {}
  __device__ __forceinline__ __nv_fp8_e4m3 operator()(float y) const {
    return from_float<__nv_fp8_e4m3>(fmaxf(-448.f, fminf(y * inv_scale, 448.f)));
  }
};

// One block per row. Pass 1 reduces in float; the last pass re-reads the row (an L1/L2 hit
// for rows up to a few hundred KiB) and writes it. `out` may be `in` itself (in place), so
// neither is __restrict__.
template <typename T, typename O, int VEC>
__global__ void RMSNormKernel(O* out, const T* in, const T* __restrict__ weight, int64_t hidden,
                              RowLayout in_layout, RowLayout out_layout, float eps,
                              float weight_offset, QuantScale scale) {
  pdl_wait();
  const T* x = in + in_layout.offset(blockIdx.x);
  O* y = out + out_layout.offset(blockIdx.x);
  const int64_t num_vecs = hidden / VEC;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const Vec<T, VEC> v = reinterpret_cast<const Vec<T, VEC>*>(x)[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_float(v.data[j]);
      sum_sq += f * f;
    }
  }
  sum_sq = block_reduce_sum(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  const OutputConverter<O> convert(scale);

  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const Vec<T, VEC> v = reinterpret_cast<const Vec<T, VEC>*>(x)[i];
    const Vec<T, VEC> w = reinterpret_cast<const Vec<T, VEC>*>(weight)[i];
    Vec<O, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] = convert(to_float(v.data[j]) * inv_rms * (to_float(w.data[j]) + weight_offset));
    }
    reinterpret_cast<Vec<O, VEC>*>(y)[i] = o;
  }
  pdl_launch_dependents();
}

// s = float(input) + float(residual); residual = T(s); out = RMSNorm(s), the norm of the
// unrounded float sum. Pass 1 only reads; pass 2 recomputes s (the same float add) from the
// still unmodified rows, then writes. `out` may be `input` itself (the in-place API), so
// neither is __restrict__: each thread reads its elements before it overwrites them.
template <typename T, typename O, int VEC>
__global__ void FusedAddRMSNormKernel(O* out, const T* input, T* __restrict__ residual,
                                      const T* __restrict__ weight, int64_t hidden,
                                      RowLayout in_layout, RowLayout res_layout,
                                      RowLayout out_layout, float eps, float weight_offset,
                                      QuantScale scale) {
  pdl_wait();
  const auto* x = reinterpret_cast<const Vec<T, VEC>*>(input + in_layout.offset(blockIdx.x));
  auto* r = reinterpret_cast<Vec<T, VEC>*>(residual + res_layout.offset(blockIdx.x));
  auto* y = reinterpret_cast<Vec<O, VEC>*>(out + out_layout.offset(blockIdx.x));
  const int64_t num_vecs = hidden / VEC;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const Vec<T, VEC> a = x[i];
    const Vec<T, VEC> b = r[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float s = to_float(a.data[j]) + to_float(b.data[j]);
      sum_sq += s * s;
    }
  }
  sum_sq = block_reduce_sum(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
  const OutputConverter<O> convert(scale);

  for (int64_t i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const Vec<T, VEC> a = x[i];
    Vec<T, VEC> b = r[i];
    const Vec<T, VEC> w = reinterpret_cast<const Vec<T, VEC>*>(weight)[i];
    Vec<O, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float s = to_float(a.data[j]) + to_float(b.data[j]);
      b.data[j] = from_float<T>(s);
      o.data[j] = convert(s * inv_rms * (to_float(w.data[j]) + weight_offset));
    }
    r[i] = b;
    y[i] = o;
  }
  pdl_launch_dependents();
}

// gamma and beta are float32, as in the reference library's layernorm. Mean first, then
// the variance around it (no E[x^2] - mean^2 cancellation).
template <typename T, int VEC>
__global__ void LayerNormKernel(T* __restrict__ out, const T* __restrict__ in,
                                const float* __restrict__ gamma, const float* __restrict__ beta,
                                int64_t hidden, RowLayout in_layout, RowLayout out_layout,
                                float eps) {
  pdl_wait();
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
  pdl_launch_dependents();
}

inline bool IsAligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Threads per block: enough warps for one vector per thread, at most 32 warps.
inline unsigned BlockThreads(int64_t units) {
  const int64_t warps = (units + 31) / 32;
  return static_cast<unsigned>(32 * (warps < 1 ? 1 : (warps < 32 ? warps : 32)));
}

// One operand a kernel accesses by rows: its data, row layout and element size. A weight
// vector is one row: RowAccess::Vector(weight, sizeof(T)).
struct RowAccess {
  const void* data;
  RowLayout layout;
  int64_t elem_bytes;

  static RowAccess Vector(const void* data, int64_t elem_bytes) {
    return {data, {1, 0, 0}, elem_bytes};
  }
};

// Vectors of kVec = 16 / sizeof(T) elements (16-byte loads of T) when every row of every
// operand starts on a vector boundary, else scalar access.
template <typename T>
bool UseVectors(int64_t hidden, std::initializer_list<RowAccess> operands) {
  constexpr int64_t kVec = 16 / sizeof(T);
  if (hidden % kVec != 0) return false;
  for (const RowAccess& a : operands) {
    if (!a.layout.Aligned(kVec) || !IsAligned(a.data, kVec * a.elem_bytes)) return false;
  }
  return true;
}

// One block per row, enough threads for `units` (vectors or elements) of a row.
template <typename... Params, typename... Args>
cudaError_t LaunchRows(void (*kernel)(Params...), int64_t rows, int64_t units, bool pdl,
                       cudaStream_t stream, Args... args) {
  return launch_kernel(kernel, dim3(static_cast<unsigned>(rows)), dim3(BlockThreads(units)), 0,
                       stream, pdl, args...);
}

template <typename T, typename O>
cudaError_t RMSNorm(O* out, const T* in, const T* weight, int64_t rows, int64_t hidden,
                    RowLayout in_layout, RowLayout out_layout, float eps, float weight_offset,
                    QuantScale scale, bool pdl, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = UseVectors<T>(hidden, {{in, in_layout, sizeof(T)},
                                          {out, out_layout, sizeof(O)},
                                          RowAccess::Vector(weight, sizeof(T))});
  return LaunchRows(vec ? RMSNormKernel<T, O, kVec> : RMSNormKernel<T, O, 1>, rows,
                    vec ? hidden / kVec : hidden, pdl, stream, out, in, weight, hidden, in_layout,
                    out_layout, eps, weight_offset, scale);
}

// `out` is `input` (with in_layout) for the in-place API, or a separate (fp8) output.
template <typename T, typename O>
cudaError_t FusedAddRMSNorm(O* out, const T* input, T* residual, const T* weight, int64_t rows,
                            int64_t hidden, RowLayout in_layout, RowLayout res_layout,
                            RowLayout out_layout, float eps, float weight_offset, QuantScale scale,
                            bool pdl, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = UseVectors<T>(hidden, {{input, in_layout, sizeof(T)},
                                          {residual, res_layout, sizeof(T)},
                                          {out, out_layout, sizeof(O)},
                                          RowAccess::Vector(weight, sizeof(T))});
  return LaunchRows(vec ? FusedAddRMSNormKernel<T, O, kVec> : FusedAddRMSNormKernel<T, O, 1>, rows,
                    vec ? hidden / kVec : hidden, pdl, stream, out, input, residual, weight, hidden,
                    in_layout, res_layout, out_layout, eps, weight_offset, scale);
}

template <typename T>
cudaError_t LayerNorm(T* out, const T* in, const float* gamma, const float* beta, int64_t rows,
                      int64_t hidden, RowLayout in_layout, RowLayout out_layout, float eps,
                      bool pdl, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  // gamma[k] and beta[k] are read per element, so only the rows need vector alignment.
  const bool vec =
      UseVectors<T>(hidden, {{in, in_layout, sizeof(T)}, {out, out_layout, sizeof(T)}});
  return LaunchRows(vec ? LayerNormKernel<T, kVec> : LayerNormKernel<T, 1>, rows,
                    vec ? hidden / kVec : hidden, pdl, stream, out, in, gamma, beta, hidden,
                    in_layout, out_layout, eps);
}

}  // namespace norm
}  // namespace flashinfer
