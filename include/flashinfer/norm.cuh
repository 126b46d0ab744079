// Normalizations over the last dim of [tokens, hidden] or [tokens, heads, head_dim] data:
//   RMSNorm:          out = x * rsqrt(mean(x^2) + eps) * (weight + weight_offset)
//   FusedAddRMSNorm:  s = input + residual (float32); residual = T(s); out = RMSNorm(s)
//   LayerNorm:        out = (x - mean(x)) * rsqrt(var(x) + eps) * gamma + beta
// weight_offset is 0, or 1 for the Gemma variants. Math in float32. The RMSNorm outputs are
// the input's type, or fp8 e4m3 quantized as out = fp8(clamp(y / scale, -448, 448)).
// Every kernel calls pdl_wait() before its first global access, so it may be launched with
// programmatic dependent launch (see pdl.cuh).
//
// How rows are spread over threads (PlanRows picks one per call, on the host):
// - groups: a row of at most 32 * kCache vectors is normalized by `lanes` lanes of a warp (a
//   power of two <= 32), kGroupThreads / lanes rows per block, reduced by shuffles. A QK-norm
//   row of 128 bf16 is 16 lanes of one 16-byte vector each, 16 rows per block.
// - cached block: one block per row, ceil(vectors / kCache) threads (rounded up to warps).
// - looping block: rows longer than 1024 * kCache vectors, one block of 1024 threads per row.
// In the first two, each thread loads its (at most kCache) vectors and their weights once,
// all before the first reduction, and the later passes and the output read them from
// registers: one global read per row. The looping block re-reads the row in every pass (L1/L2 hits
// for rows of a few hundred KiB). Since every thread writes only elements it has read itself, `out`
// may be `in` (in place). Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
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

constexpr int kGroupThreads = 256;  // block size of the groups layout (8 warps)
constexpr int kMaxBlockThreads = 1024;

// Vectors a thread keeps in registers (with their weights): 2 x 16 bytes, or 4 elements on
// the scalar path. More spills at 1024 threads (64 registers) once the compiler holds the
// converted floats.
constexpr int CacheVectors(int vec) { return vec == 1 ? 4 : 2; }

// Rows of the call and lanes per row (groups layout only): the kernels' first parameter.
struct RowSplit {
  int64_t rows;
  int lanes;
};

// The threads that normalize one row together: a whole block, or (kGroups) an aligned group
// of split.lanes lanes of a warp. Threads of a group past the last row stay `active = false`
// but take part in the shuffles, which need every lane of the warp.
template <bool kGroups>
struct RowTeam {
  int64_t row;
  int rank;
  int size;
  bool active;

  __device__ __forceinline__ explicit RowTeam(RowSplit split) {
    if constexpr (kGroups) {
      const int per_block = static_cast<int>(blockDim.x) / split.lanes;
      row = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / split.lanes;
      rank = static_cast<int>(threadIdx.x) & (split.lanes - 1);
      size = split.lanes;
      active = row < split.rows;
    } else {
      row = blockIdx.x;
      rank = static_cast<int>(threadIdx.x);
      size = static_cast<int>(blockDim.x);
      active = true;
    }
  }

  // The sum of `value` over the team; every thread of the team gets the same bits.
  __device__ __forceinline__ float sum(float value) const {
    if constexpr (kGroups) {
      for (int offset = size >> 1; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
      }
      return value;
    } else {
      return block_reduce_sum(value);
    }
  }

  // Calls f(k, i) for this thread's vectors i of a row of `num_vecs`, k counting them:
  // i = rank + k * size, k < kCache (unrolled, so register slots can be indexed by k), or
  // every such i with k = 0 when kCache == 0.
  template <int kCache, typename F>
  __device__ __forceinline__ void for_each(int num_vecs, F&& f) const {
    if constexpr (kCache > 0) {
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int i = rank + k * size;
        if (active && i < num_vecs) f(k, i);
      }
    } else {
      for (int i = rank; i < num_vecs; i += size) f(0, i);
    }
  }
};

// What a thread read or computed for its k-th vector in the first pass (the vector, a weight
// vector, a float sum): kept in register slot k, or, with kCache == 0, formed again by `redo`
// where it is used.
template <typename V, int kCache>
struct Kept {
  V slot[kCache > 0 ? kCache : 1];

  __device__ __forceinline__ void keep(int k, const V& value) {
    if constexpr (kCache > 0) slot[k] = value;
  }
  // keep(k, make()), calling make() (a load issued early) only when there is a slot for it.
  template <typename Make>
  __device__ __forceinline__ void prefetch(int k, Make&& make) {
    if constexpr (kCache > 0) slot[k] = make();
  }
  template <typename Redo>
  __device__ __forceinline__ V get(int k, Redo&& redo) const {
    if constexpr (kCache > 0) {
      return slot[k];
    } else {
      return redo();
    }
  }
};

template <typename T, typename O, int VEC, bool kGroups, int kCache>
__global__ void __launch_bounds__(kGroups ? kGroupThreads : kMaxBlockThreads, kGroups ? 3 : 1)
    RMSNormKernel(RowSplit split, O* out, const T* in, const T* __restrict__ weight, int64_t hidden,
                  RowLayout in_layout, RowLayout out_layout, float eps, float weight_offset,
                  QuantScale scale) {
  using V = Vec<T, VEC>;
  pdl_wait();
  const RowTeam<kGroups> team(split);
  const auto* x = reinterpret_cast<const V*>(in + in_layout.offset(team.row));
  auto* y = reinterpret_cast<Vec<O, VEC>*>(out + out_layout.offset(team.row));
  const auto* w = reinterpret_cast<const V*>(weight);
  const int num_vecs = static_cast<int>(hidden / VEC);

  Kept<V, kCache> xs, ws;
  float sum_sq = 0.f;
  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const V v = x[i];
    xs.keep(k, v);
    ws.prefetch(k, [&] { return w[i]; });  // in flight during the reduction
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_float(v.data[j]);
      sum_sq += f * f;
    }
  });
  const float inv_rms = rsqrtf(team.sum(sum_sq) / static_cast<float>(hidden) + eps);
  const OutputConverter<O> convert(scale);

  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const V v = xs.get(k, [&] { return x[i]; });
    const V wv = ws.get(k, [&] { return w[i]; });
    Vec<O, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] = convert(to_float(v.data[j]) * inv_rms * (to_float(wv.data[j]) + weight_offset));
    }
    y[i] = o;
  });
  pdl_launch_dependents();
}

// s = float(input) + float(residual); residual = T(s); out = RMSNorm(s), the norm of the
// unrounded float sum. Without registers to keep s, the output pass forms it again from the
// still unmodified inputs by the same float add. `out` may be `input` (the in-place API).
template <typename T, typename O, int VEC, bool kGroups, int kCache>
__global__ void __launch_bounds__(kGroups ? kGroupThreads : kMaxBlockThreads, kGroups ? 3 : 1)
    FusedAddRMSNormKernel(RowSplit split, O* out, const T* input, T* __restrict__ residual,
                          const T* __restrict__ weight, int64_t hidden, RowLayout in_layout,
                          RowLayout res_layout, RowLayout out_layout, float eps,
                          float weight_offset, QuantScale scale) {
  using V = Vec<T, VEC>;
  using F = Vec<float, VEC>;
  pdl_wait();
  const RowTeam<kGroups> team(split);
  const auto* x = reinterpret_cast<const V*>(input + in_layout.offset(team.row));
  auto* r = reinterpret_cast<V*>(residual + res_layout.offset(team.row));
  auto* y = reinterpret_cast<Vec<O, VEC>*>(out + out_layout.offset(team.row));
  const auto* w = reinterpret_cast<const V*>(weight);
  const int num_vecs = static_cast<int>(hidden / VEC);
  const auto add = [&](int i) {
    const V a = x[i];
    const V b = r[i];
    F s;
#pragma unroll
    for (int j = 0; j < VEC; ++j) s.data[j] = to_float(a.data[j]) + to_float(b.data[j]);
    return s;
  };

  Kept<F, kCache> sums;
  Kept<V, kCache> ws;
  float sum_sq = 0.f;
  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const F s = add(i);
    sums.keep(k, s);
    ws.prefetch(k, [&] { return w[i]; });
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum_sq += s.data[j] * s.data[j];
  });
  const float inv_rms = rsqrtf(team.sum(sum_sq) / static_cast<float>(hidden) + eps);
  const OutputConverter<O> convert(scale);

  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const F s = sums.get(k, [&] { return add(i); });
    const V wv = ws.get(k, [&] { return w[i]; });
    V b;
    Vec<O, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      b.data[j] = from_float<T>(s.data[j]);
      o.data[j] = convert(s.data[j] * inv_rms * (to_float(wv.data[j]) + weight_offset));
    }
    r[i] = b;
    y[i] = o;
  });
  pdl_launch_dependents();
}

// p[0, N) as N / 4 16-byte loads when `quads` (p 16-byte aligned, N a multiple of 4), else
// one float at a time.
template <int N>
__device__ __forceinline__ Vec<float, N> load_floats(const float* p, bool quads) {
  Vec<float, N> v;
  if constexpr (N % 4 == 0) {
    if (quads) {
#pragma unroll
      for (int q = 0; q < N / 4; ++q) {
        const Vec<float, 4> quad = reinterpret_cast<const Vec<float, 4>*>(p)[q];
#pragma unroll
        for (int j = 0; j < 4; ++j) v.data[4 * q + j] = quad.data[j];
      }
      return v;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) v.data[j] = p[j];
  return v;
}

// gamma and beta are float32, as in the reference library's layernorm. Mean first, then
// the variance around it (no E[x^2] - mean^2 cancellation).
template <typename T, int VEC, bool kGroups, int kCache>
__global__ void __launch_bounds__(kGroups ? kGroupThreads : kMaxBlockThreads, kGroups ? 3 : 1)
    LayerNormKernel(RowSplit split, T* out, const T* in, const float* __restrict__ gamma,
                    const float* __restrict__ beta, int64_t hidden, RowLayout in_layout,
                    RowLayout out_layout, float eps) {
  using V = Vec<T, VEC>;
  pdl_wait();
  const RowTeam<kGroups> team(split);
  const auto* x = reinterpret_cast<const V*>(in + in_layout.offset(team.row));
  auto* y = reinterpret_cast<V*>(out + out_layout.offset(team.row));
  const int num_vecs = static_cast<int>(hidden / VEC);

  // The same for every thread of the grid, so the branch in load_floats never diverges.
  const bool quads =
      ((reinterpret_cast<uintptr_t>(gamma) | reinterpret_cast<uintptr_t>(beta)) % 16) == 0;
  const auto affine = [&](const float* p, int i) {
    return load_floats<VEC>(p + static_cast<int64_t>(i) * VEC, quads);
  };

  Kept<V, kCache> xs;
  Kept<Vec<float, VEC>, kCache> gs, bs;
  float sum = 0.f;
  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const V v = x[i];
    xs.keep(k, v);
    gs.prefetch(k, [&] { return affine(gamma, i); });  // in flight during the reductions
    bs.prefetch(k, [&] { return affine(beta, i); });
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_float(v.data[j]);
  });
  const float mean = team.sum(sum) / static_cast<float>(hidden);

  float sum_sq = 0.f;
  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const V v = xs.get(k, [&] { return x[i]; });
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = to_float(v.data[j]) - mean;
      sum_sq += d * d;
    }
  });
  const float inv_std = rsqrtf(team.sum(sum_sq) / static_cast<float>(hidden) + eps);

  team.template for_each<kCache>(num_vecs, [&](int k, int i) {
    const V v = xs.get(k, [&] { return x[i]; });
    const Vec<float, VEC> g = gs.get(k, [&] { return affine(gamma, i); });
    const Vec<float, VEC> b = bs.get(k, [&] { return affine(beta, i); });
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.data[j] = from_float<T>((to_float(v.data[j]) - mean) * inv_std * g.data[j] + b.data[j]);
    }
    y[i] = o;
  });
  pdl_launch_dependents();
}

inline bool IsAligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
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

enum class RowMode { kGroups, kCachedBlock, kLoopingBlock };

// The launch shape for `rows` rows of `units` vectors each (see the top of this file).
struct RowPlan {
  RowMode mode;
  unsigned grid;
  unsigned block;
  int lanes;
};

inline RowPlan PlanRows(int64_t rows, int64_t units, int cache) {
  if (units <= 32 * cache) {
    int lanes = 1;
    while (lanes < units && lanes < 32) lanes *= 2;
    const int64_t per_block = kGroupThreads / lanes;
    return {RowMode::kGroups, static_cast<unsigned>((rows + per_block - 1) / per_block),
            kGroupThreads, lanes};
  }
  if (units <= int64_t{kMaxBlockThreads} * cache) {
    const int64_t warps = ((units + cache - 1) / cache + 31) / 32;
    return {RowMode::kCachedBlock, static_cast<unsigned>(rows), static_cast<unsigned>(32 * warps),
            32};
  }
  return {RowMode::kLoopingBlock, static_cast<unsigned>(rows), kMaxBlockThreads, 32};
}

// Launches Family::kernel<VEC, kGroups, kCache> for the plan of rows of `units` vectors;
// the kernel's first argument is the RowSplit, then `args`.
template <typename Family, int VEC, typename... Args>
cudaError_t LaunchPlanned(int64_t rows, int64_t units, bool pdl, cudaStream_t stream,
                          Args... args) {
  constexpr int kCache = CacheVectors(VEC);
  const RowPlan plan = PlanRows(rows, units, kCache);
  const RowSplit split{rows, plan.lanes};
  switch (plan.mode) {
    case RowMode::kGroups:
      return launch_kernel(Family::template kernel<VEC, true, kCache>(), dim3(plan.grid),
                           dim3(plan.block), 0, stream, pdl, split, args...);
    case RowMode::kCachedBlock:
      return launch_kernel(Family::template kernel<VEC, false, kCache>(), dim3(plan.grid),
                           dim3(plan.block), 0, stream, pdl, split, args...);
    default:
      return launch_kernel(Family::template kernel<VEC, false, 0>(), dim3(plan.grid),
                           dim3(plan.block), 0, stream, pdl, split, args...);
  }
}

// 16-byte vectors of T when `vec`, else scalars; empty inputs launch nothing.
template <typename Family, typename T, typename... Args>
cudaError_t LaunchNorm(bool vec, int64_t rows, int64_t hidden, bool pdl, cudaStream_t stream,
                       Args... args) {
  constexpr int kVec = 16 / sizeof(T);
  if (rows == 0 || hidden == 0) return cudaSuccess;
  // Rows are indexed with int and counted by grid.x (at most 2^31 - 1 blocks).
  if (hidden > INT32_MAX || rows > INT32_MAX) return cudaErrorInvalidValue;
  return vec ? LaunchPlanned<Family, kVec>(rows, hidden / kVec, pdl, stream, args...)
             : LaunchPlanned<Family, 1>(rows, hidden, pdl, stream, args...);
}

template <typename T, typename O>
struct RMSNormFamily {
  template <int VEC, bool kGroups, int kCache>
  static auto kernel() {
    return RMSNormKernel<T, O, VEC, kGroups, kCache>;
  }
};

template <typename T, typename O>
struct FusedAddRMSNormFamily {
  template <int VEC, bool kGroups, int kCache>
  static auto kernel() {
    return FusedAddRMSNormKernel<T, O, VEC, kGroups, kCache>;
  }
};

template <typename T>
struct LayerNormFamily {
  template <int VEC, bool kGroups, int kCache>
  static auto kernel() {
    return LayerNormKernel<T, VEC, kGroups, kCache>;
  }
};

template <typename T, typename O>
cudaError_t RMSNorm(O* out, const T* in, const T* weight, int64_t rows, int64_t hidden,
                    RowLayout in_layout, RowLayout out_layout, float eps, float weight_offset,
                    QuantScale scale, bool pdl, cudaStream_t stream) {
  const bool vec = UseVectors<T>(hidden, {{in, in_layout, sizeof(T)},
                                          {out, out_layout, sizeof(O)},
                                          RowAccess::Vector(weight, sizeof(T))});
  return LaunchNorm<RMSNormFamily<T, O>, T>(vec, rows, hidden, pdl, stream, out, in, weight, hidden,
                                            in_layout, out_layout, eps, weight_offset, scale);
}

// `out` is `input` (with in_layout) for the in-place API, or a separate (fp8) output.
template <typename T, typename O>
cudaError_t FusedAddRMSNorm(O* out, const T* input, T* residual, const T* weight, int64_t rows,
                            int64_t hidden, RowLayout in_layout, RowLayout res_layout,
                            RowLayout out_layout, float eps, float weight_offset, QuantScale scale,
                            bool pdl, cudaStream_t stream) {
  const bool vec = UseVectors<T>(hidden, {{input, in_layout, sizeof(T)},
                                          {residual, res_layout, sizeof(T)},
                                          {out, out_layout, sizeof(O)},
                                          RowAccess::Vector(weight, sizeof(T))});
  return LaunchNorm<FusedAddRMSNormFamily<T, O>, T>(vec, rows, hidden, pdl, stream, out, input,
                                                    residual, weight, hidden, in_layout, res_layout,
                                                    out_layout, eps, weight_offset, scale);
}

template <typename T>
cudaError_t LayerNorm(T* out, const T* in, const float* gamma, const float* beta, int64_t rows,
                      int64_t hidden, RowLayout in_layout, RowLayout out_layout, float eps,
                      bool pdl, cudaStream_t stream) {
  // gamma and beta are float4 loads when both are 16-byte aligned (checked in the kernel),
  // else per element, so only the rows decide the vector width.
  const bool vec =
      UseVectors<T>(hidden, {{in, in_layout, sizeof(T)}, {out, out_layout, sizeof(T)}});
  return LaunchNorm<LayerNormFamily<T>, T>(vec, rows, hidden, pdl, stream, out, in, gamma, beta,
                                           hidden, in_layout, out_layout, eps);
}

}  // namespace norm
}  // namespace flashinfer
