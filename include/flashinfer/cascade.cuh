// Merging attention states. An attention state over a set of keys is (v, s): v the
// softmax-weighted sum of the values, s = log2(sum(exp(score))) the log-sum-exp of the
// scores in base 2, as the reference library defines it (so states from either library
// merge). Two states over disjoint key sets merge exactly:
//   s = log2(2^s_a + 2^s_b),  v = 2^(s_a - s) * v_a + 2^(s_b - s) * v_b
// Split-KV decode computes one state per KV chunk and merges them with MergeStatesKernel,
// the kernel behind flashinfer.merge_states. Framework-agnostic: raw pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/pdl.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace cascade {

// Where states live. State i of a head: v at v + i * v_state_stride + head * v_head_stride
// (head_dim contiguous elements), s at s + i * s_state_stride + head * s_head_stride.
template <typename T>
struct StateArray {
  const T* v;
  const float* s;
  int64_t v_state_stride, v_head_stride, s_state_stride, s_head_stride;
};

template <typename T>
struct OutputArray {
  T* v;
  float* s;  // may be null
  int64_t v_row_stride, v_head_stride, s_row_stride, s_head_stride;
};

// Which states each output position merges: positions p < count (count read from the
// device when count_on_device is set, for launches captured in CUDA graphs); position p
// merges states indptr[p] .. indptr[p+1] (or p * per_position .. + per_position when indptr
// is null) into output row out_rows[p] (or p). The arrays are a plan's words (schedule.cuh),
// which only host copies write: kernels read them before pdl_wait().
struct MergeSchedule {
  const int32_t* count_on_device;
  const int32_t* indptr;
  const int32_t* out_rows;
  int64_t per_position;
};

// grid (positions, heads), block kMergeThreads: each thread owns head_dim / kMergeThreads
// (at most kMaxDimsPerThread) dims and walks the states in order (deterministic).
constexpr int kMergeThreads = 64;
constexpr int kMaxDimsPerThread = 8;  // head_dim <= 512

// A running merge of states for this thread's dims, in a numerically safe form: every
// weight is 2^(s_i - max_s). A state with s = -inf (over no keys) contributes nothing;
// merging nothing gives v = 0, s = -inf. A state with s = NaN makes v and s NaN (its weight
// is NaN, and 0 scales that NaN to NaN in store()), so a NaN is never merged away.
struct StateMerger {
  float max_s = -INFINITY;
  float weight = 0.f;                 // sum of 2^(s_i - max_s)
  float acc[kMaxDimsPerThread] = {};  // sum of 2^(s_i - max_s) * v_i

  template <typename T>
  __device__ __forceinline__ void add(float s, const T* v, int64_t head_dim) {
    if (s == -INFINITY) return;
    if (s > max_s) {
      const float rescale = exp2f(max_s - s);  // 0 when max_s was -inf
#pragma unroll
      for (int j = 0; j < kMaxDimsPerThread; ++j) acc[j] *= rescale;
      weight *= rescale;
      max_s = s;
    }
    const float w = exp2f(s - max_s);
    weight += w;
    if (w == 0.f) return;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerThread; ++j) {
      const int64_t d = threadIdx.x + j * kMergeThreads;
      if (d < head_dim) acc[j] += w * to_float(v[d]);
    }
  }

  template <typename T>
  __device__ __forceinline__ void store(T* dst, int64_t head_dim) const {
    const float scale = weight > 0.f ? 1.f / weight : 0.f;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerThread; ++j) {
      const int64_t d = threadIdx.x + j * kMergeThreads;
      if (d < head_dim) dst[d] = from_float<T>(acc[j] * scale);
    }
  }

  // -inf only when nothing was merged; a state whose s is NaN gives NaN, as in the reference.
  __device__ __forceinline__ float lse() const {
    return weight == 0.f ? -INFINITY : max_s + log2f(weight);
  }
};

template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kMergeThreads)
    MergeStatesKernel(OutputArray<TOut> out, StateArray<TIn> in, MergeSchedule schedule,
                      int64_t head_dim) {
  // The schedule is a plan's (host copies only: schedule.cuh), so it loads before the wait
  // for the kernel whose states this reads; a position past the count (a CUDA graph's grid)
  // reads words within the capacity.
  const int64_t p = blockIdx.x, head = blockIdx.y;
  const bool past = schedule.count_on_device && p >= *schedule.count_on_device;
  const int64_t first = schedule.indptr ? schedule.indptr[p] : p * schedule.per_position;
  const int64_t last = schedule.indptr ? schedule.indptr[p + 1] : first + schedule.per_position;
  const int64_t row = schedule.out_rows ? schedule.out_rows[p] : p;
  pdl_wait();
  if (past) return;
  StateMerger state;
  for (int64_t i = first; i < last; ++i) {
    state.add(in.s[i * in.s_state_stride + head * in.s_head_stride],
              in.v + i * in.v_state_stride + head * in.v_head_stride, head_dim);
  }
  state.store(out.v + row * out.v_row_stride + head * out.v_head_stride, head_dim);
  if (out.s && threadIdx.x == 0) {
    out.s[row * out.s_row_stride + head * out.s_head_stride] = state.lse();
  }
}

// merge_state / merge_state_in_place: out = merge(a, b) where mask[p] (everywhere when
// mask is null), else out = a. In place, `out` is `a` (in_place set: masked-off positions
// are left alone). grid (positions, heads).
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    MergeTwoStatesKernel(OutputArray<T> out, StateArray<T> a, StateArray<T> b, const uint8_t* mask,
                         bool in_place, int64_t head_dim) {
  const int64_t p = blockIdx.x, head = blockIdx.y;
  const bool merge = !mask || mask[p];
  if (!merge && in_place) return;
  StateMerger state;
  state.add(a.s[p * a.s_state_stride + head * a.s_head_stride],
            a.v + p * a.v_state_stride + head * a.v_head_stride, head_dim);
  if (merge) {
    state.add(b.s[p * b.s_state_stride + head * b.s_head_stride],
              b.v + p * b.v_state_stride + head * b.v_head_stride, head_dim);
  }
  __syncthreads();  // in place: every thread has read s_a before thread 0 overwrites it
  state.store(out.v + p * out.v_row_stride + head * out.v_head_stride, head_dim);
  if (threadIdx.x == 0) out.s[p * out.s_row_stride + head * out.s_head_stride] = state.lse();
}

// `pdl`: launch with programmatic dependent launch (see pdl.cuh).
template <typename TIn, typename TOut>
cudaError_t MergeStates(OutputArray<TOut> out, StateArray<TIn> in, MergeSchedule schedule,
                        int64_t positions, int64_t heads, int64_t head_dim, cudaStream_t stream,
                        bool pdl = false) {
  if (positions == 0 || heads == 0) return cudaSuccess;
  return launch_kernel(MergeStatesKernel<TIn, TOut>,
                       dim3(static_cast<unsigned>(positions), static_cast<unsigned>(heads)),
                       dim3(kMergeThreads), 0, stream, pdl, out, in, schedule, head_dim);
}

template <typename T>
cudaError_t MergeTwoStates(OutputArray<T> out, StateArray<T> a, StateArray<T> b,
                           const uint8_t* mask, bool in_place, int64_t positions, int64_t heads,
                           int64_t head_dim, cudaStream_t stream) {
  if (positions == 0 || heads == 0) return cudaSuccess;
  return launch_kernel(MergeTwoStatesKernel<T>,
                       dim3(static_cast<unsigned>(positions), static_cast<unsigned>(heads)),
                       dim3(kMergeThreads), 0, stream, false, out, a, b, mask, in_place, head_dim);
}

}  // namespace cascade
}  // namespace flashinfer
