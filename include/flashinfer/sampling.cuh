// Sorting-free sampling over a vocabulary: softmax, filtered sampling, renormalization.
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
//
// One thread block owns one row (one request) and streams over its vocabulary in tiles of
// kThreads * 4 elements; nothing is ever sorted. Two primitives do all the work:
//
// 1. Pivot search by radix select. Top-k, top-p and min-p all keep an *upper set* of the
//    row: every element whose value is >= a pivot. Values map to 32-bit keys whose unsigned
//    order is the float order (ordered_key, -0.0 tying +0.0). The pivot's key is found one
//    byte at a time, most significant first: a pass builds a 256-bin histogram of the next
//    byte over the elements that match the bytes fixed so far, and one warp scans the bins
//    from the top until the cumulative weight reaches the target. Four passes give the
//    exact pivot. Top-k weighs each element 1 (target k); top-p weighs it by its share of
//    the row's total in fixed point (the row scaled by a power of two that brings its total
//    to [2^39, 2^40), target ceil(top_p * total)), so the histograms use integer atomics,
//    the result does not depend on the order threads add in, and it is the same for a row
//    and the row times any power of two. Ties with the pivot are kept. Top-p keeps token j
//    iff the mass of tokens strictly more likely than j is < top_p of the row's mass; its
//    total is the first histogram's sum, so it costs no pass of its own.
//    A row's elements crowd into a few bins (probabilities share a handful of exponents), so
//    the lanes of a warp that hit one bin sum their weights first and one lane adds the sum,
//    with native 32-bit shared atomics on the bin's two 32-bit words: a 64-bit shared atomic
//    add compiles to a compare-and-swap retry loop, which the crowding serializes.
//
// 2. Exponential race. Drawing j with probability p_j / sum(p) over a kept set S equals
//    taking argmax_{j in S} p_j / E_j with E_j ~ Exp(1) i.i.d. (for logits: argmax of
//    logit_j + Gumbel_j, Gumbel = -log E). One pass, no prefix sums, no normalization.
//    E_j comes from word offset + j of Philox4x32-10 subsequence `output row` (the counter
//    layout of curand and torch, see philox.h), so a draw is a pure function of (seed,
//    offset, row, inputs) whatever the launch shape, and a call consumes offsets
//    [offset, offset + 4 * ceil(n / 4)) of a torch generator. Ties go to the lowest index.
//
// Every reduction runs in a fixed order, so every kernel here is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/pdl.cuh"
#include "flashinfer/philox.h"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace sampling {

constexpr int kThreads = 1024;
constexpr int kVec = 4;              // elements per thread per tile; also words per Philox block
constexpr int kFixedPointBits = 40;  // a row's total mass lies in [2^39, 2^40) fixed point

// The power of two that brings a row's total into [2^39, 2^40) (2^127 at most, for rows
// whose total is below about 2^-87); 0 for a row without finite positive mass.
__device__ __forceinline__ float mass_scale(float total) {
  if (!(total > 0.f) || !isfinite(total)) return 0.f;
  int exponent;
  frexpf(total, &exponent);  // total = m * 2^exponent, m in [0.5, 1)
  return ldexpf(1.f, min(kFixedPointBits - exponent, 127));
}

__device__ __forceinline__ unsigned long long fixed_point_mass(float p, float scale) {
  return p > 0.f ? __float2ull_rz(p * scale) : 0ull;
}

// Loads the 4 elements of group g (elements 4g .. 4g+3) as floats; the count of those
// inside the row is returned (the rest read 0). Loops over a group's lanes are unrolled
// with a guard, so x stays in registers.
template <bool kAligned, typename T>
__device__ __forceinline__ int load_group(const T* row, int64_t n, int64_t g, float (&x)[kVec]) {
  const int64_t first = g * kVec;
  if (kAligned && first + kVec <= n) {
    const Vec<T, kVec> v = reinterpret_cast<const Vec<T, kVec>*>(row)[g];
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[j] = to_float(v.data[j]);
    return kVec;
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) x[j] = first + j < n ? to_float(row[first + j]) : 0.f;
  return static_cast<int>(n - first < kVec ? n - first : kVec);
}

// Calls f(j) for the lanes j < valid of a group.
template <typename F>
__device__ __forceinline__ void for_lanes(int valid, F&& f) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (j < valid) f(j);
  }
}

// Calls f(g, x, valid) for every group of the row this thread owns. The lanes of a warp run
// the same iterations (a lane past the end of the row gets valid = 0), so f may use warp-wide
// intrinsics.
template <bool kAligned, typename T, typename F>
__device__ __forceinline__ void for_each_group(const T* row, int64_t n, F&& f) {
  const int64_t groups = (n + kVec - 1) / kVec;
  const int lane = threadIdx.x & 31;
  for (int64_t warp_first = threadIdx.x - lane; warp_first < groups; warp_first += blockDim.x) {
    const int64_t g = warp_first + lane;
    float x[kVec] = {};
    const int valid = g < groups ? load_group<kAligned>(row, n, g, x) : 0;
    f(g, x, valid);
  }
}

// Calls f(i, x) for every element i (value x) of the row this thread owns.
template <bool kAligned, typename T, typename F>
__device__ __forceinline__ void for_each_element(const T* row, int64_t n, F&& f) {
  for_each_group<kAligned>(row, n, [&](int64_t g, const float (&x)[kVec], int valid) {
    for_lanes(valid, [&](int j) { f(g * kVec + j, x[j]); });
  });
}

// The best (score, index) of the block: higher score wins, then lower index. index -1
// means no candidate.
struct Best {
  float score;
  int64_t index;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (a.score != b.score) return a.score > b.score ? a : b;
  return a.index < b.index ? a : b;
}

__device__ __forceinline__ Best block_best(Best value) {
  __shared__ Best warp_values[kThreads / 32];
  __syncthreads();
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, value.score, offset),
               __shfl_xor_sync(0xffffffffu, value.index, offset)};
    value = better(value, other);
  }
  if ((threadIdx.x & 31) == 0) warp_values[threadIdx.x >> 5] = value;
  __syncthreads();
  value = warp_values[threadIdx.x & 31];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, value.score, offset),
               __shfl_xor_sync(0xffffffffu, value.index, offset)};
    value = better(value, other);
  }
  return value;
}

// A per-request parameter: entry row * stride of the array when given (stride 0: one value
// for every row), else the scalar.
template <typename V>
struct Param {
  const V* values;
  V scalar;
  int64_t stride = 1;
  __device__ __forceinline__ V at(int64_t row) const {
    return values ? values[row * stride] : scalar;
  }
};

// Four Exp(1) variates for elements 4g .. 4g+3 of one output row: words offset + 4g ..
// offset + 4g + 3 of Philox subsequence `row` under `seed`.
struct RandomStream {
  uint64_t seed, offset, row;

  __device__ __forceinline__ void exponentials(int64_t g, float (&e)[kVec]) const {
    const PhiloxBlock r = philox_words(seed, row, offset, static_cast<uint64_t>(g));
    e[0] = exponential_from_uniform(uniform_open01(r.x));
    e[1] = exponential_from_uniform(uniform_open01(r.y));
    e[2] = exponential_from_uniform(uniform_open01(r.z));
    e[3] = exponential_from_uniform(uniform_open01(r.w));
  }
};

// Seeds and offsets, per output row (device arrays, read when the kernel runs) or scalars.
struct RandomSource {
  Param<uint64_t> seed, offset;
  __device__ __forceinline__ RandomStream stream(int64_t row) const {
    return {seed.at(row), offset.at(row), static_cast<uint64_t>(row)};
  }
};

// A 256-bin histogram of 64-bit weights, each bin two 32-bit words (see the header comment).
struct SelectShared {
  uint32_t low[256], high[256];
  unsigned long long above;
  uint32_t bin;
  bool found;

  __device__ __forceinline__ unsigned long long weight(int b) const {
    return (static_cast<unsigned long long>(high[b]) << 32) | low[b];
  }
  // Exact modulo 2^64 whatever the order of the adds: each add's carry out of `low` goes to
  // `high`.
  __device__ __forceinline__ void add(uint32_t b, unsigned long long w) {
    const uint32_t w_low = static_cast<uint32_t>(w);
    const uint32_t carry = atomicAdd(&low[b], w_low) > 0xFFFFFFFFu - w_low ? 1u : 0u;
    const uint32_t w_high = static_cast<uint32_t>(w >> 32) + carry;
    if (w_high != 0) atomicAdd(&high[b], w_high);
  }
};

// Adds weight w of each lane with `active` to its bin, one atomic per distinct bin of the warp.
// Every lane of the warp calls it. Weights are 1 (kUnit) or below 2^40 (fixed-point mass).
template <bool kUnit>
__device__ __forceinline__ void histogram_add(SelectShared& sh, bool active, uint32_t bin,
                                              unsigned long long w) {
  const unsigned members = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned lane = threadIdx.x & 31;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)members;
  const unsigned peers = 1u << lane;  // no warp reduction before sm_80: every lane adds its own
  const unsigned long long sum = w;
#else
  const unsigned peers = __match_any_sync(members, bin);
  unsigned long long sum;
  if (kUnit) {
    sum = __popc(peers);
  } else {  // 20-bit halves: 32 of either sum to under 2^25
    const uint32_t low = __reduce_add_sync(peers, static_cast<uint32_t>(w) & 0xFFFFFu);
    const uint32_t high = __reduce_add_sync(peers, static_cast<uint32_t>(w >> 20));
    sum = (static_cast<unsigned long long>(high) << 20) + low;
  }
#endif
  if (lane != static_cast<unsigned>(__ffs(peers) - 1)) return;
  if (kUnit) {
    atomicAdd(&sh.low[bin], static_cast<uint32_t>(sum));  // a count never carries: n < 2^31
  } else {
    sh.add(bin, sum);
  }
}

// Radix select (see the header comment). weigh(x, &key) returns element x's weight and sets
// its key; Weigh::kUnit says every weight is 1. target_of(total) maps the row's total weight
// to the target (>= 1). Returns the key of the first element, in descending key order, at
// which the cumulative weight reaches the target; 0 (keep everything) if the total is below
// it.
template <bool kAligned, typename T, typename Weigh, typename Target>
__device__ uint32_t radix_select(const T* row, int64_t n, Target target_of, Weigh weigh,
                                 SelectShared& sh) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;   // weight of the elements above the current key range
  unsigned long long target = 0;  // set in the scan warp by the first level
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sh.low[b] = sh.high[b] = 0;
    __syncthreads();
    for_each_group<kAligned>(row, n, [&](int64_t, const float (&x)[kVec], int valid) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        uint32_t key;
        const unsigned long long w = weigh(x[j], &key);
        histogram_add<Weigh::kUnit>(sh, j < valid && w != 0 && (key & mask) == prefix,
                                    (key >> shift) & 255u, w);
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // lane l covers bins 255 - 8l down to 248 - 8l: lanes in order scan the bins from the top
      // (adding its eight from the (l / 4)-th on, so that a round's 32 reads of a word array
      // fall in 32 different banks: lanes 4 apart are 32 bins apart)
      const int lane = threadIdx.x;
      unsigned long long sum = 0;
      for (int b = 0; b < 8; ++b) sum += sh.weight(255 - 8 * lane - ((b + lane / 4) & 7));
      unsigned long long inclusive = sum;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += up;
      }
      if (shift == 24) target = target_of(__shfl_sync(0xffffffffu, inclusive, 31));
      const unsigned crossing = __ballot_sync(0xffffffffu, above + inclusive >= target);
      if (lane == 0) sh.found = crossing != 0;
      if (crossing != 0 && lane == __ffs(crossing) - 1) {
        unsigned long long running = above + inclusive - sum;
        for (int b = 0; b < 8; ++b) {
          const int bin = 255 - 8 * lane - b;
          if (running + sh.weight(bin) >= target) {
            sh.bin = bin;
            sh.above = running;
            break;
          }
          running += sh.weight(bin);
        }
      }
    }
    // The next level's scan warp writes found, bin and above again only after the two
    // barriers every thread passes once it has read them here; the clearing of the bins
    // before the first of those touches no field read here. So no barrier closes a level.
    __syncthreads();
    if (!sh.found) return 0;
    prefix |= sh.bin << shift;
    mask |= 0xFFu << shift;
    above = sh.above;
  }
  return prefix;
}

struct Filters {
  Param<int32_t> top_k;  // k >= vocab or k < 0 (or the filter off) keeps everything; 0 acts as 1
  Param<float> top_p;    // >= 1 keeps everything; <= 0 keeps the most likely tokens only
  Param<float> min_p;    // <= 0 keeps everything; >= 1 keeps the most likely tokens only
  bool use_top_k, use_top_p, use_min_p;
  bool top_k_first;  // top-p over the renormalized top-k set, else over the whole row (joint)
};

// The k to select for a requested top_k over n elements, or 0 when the filter keeps the whole
// row (k >= n, or a negative k: the reference reads k as unsigned).
__device__ __forceinline__ int64_t top_k_target(int32_t k, int64_t n) {
  if (k < 0 || k >= n) return 0;
  return k < 1 ? 1 : k;
}

template <typename I>
struct RowSource {
  const I* indices;    // output row -> input row; null: the identity
  int64_t row_stride;  // elements
  int64_t rows;        // input rows: an index outside [0, rows) reads nothing
  // The input row of output row `out_row`, or -1 when its index is out of range.
  __device__ __forceinline__ int64_t row(int64_t out_row) const {
    const int64_t r = indices ? static_cast<int64_t>(indices[out_row]) : out_row;
    return r >= 0 && r < rows ? r : -1;
  }
};

// Weights for radix_select: top-k counts elements, top-p adds up their fixed-point mass over
// the keys >= floor_key (the top-k set when top-k applies first: the elements below it come
// after the pivot in descending order, so dropping them only drops them from the total).
struct CountWeight {
  static constexpr bool kUnit = true;
  __device__ __forceinline__ unsigned long long operator()(float x, uint32_t* key) const {
    *key = ordered_key(x);
    return 1;
  }
};
struct MassWeight {
  static constexpr bool kUnit = false;
  float scale;
  uint32_t floor_key;
  __device__ __forceinline__ unsigned long long operator()(float x, uint32_t* key) const {
    *key = ordered_key(x);
    return *key >= floor_key ? fixed_point_mass(x, scale) : 0ull;
  }
};

// Targets for radix_select: k elements; top_p of the total mass, rounded up (at least 1).
struct CountTarget {
  int64_t k;
  __device__ __forceinline__ unsigned long long operator()(unsigned long long) const {
    return static_cast<unsigned long long>(k);
  }
};
struct MassTarget {
  float top_p;
  __device__ __forceinline__ unsigned long long operator()(unsigned long long total) const {
    const double wanted = ceil(static_cast<double>(fmaxf(top_p, 0.f)) * static_cast<double>(total));
    return wanted < 1.0 ? 1ull : static_cast<unsigned long long>(wanted);
  }
};

// The pivot key of one row of probabilities under `f`: elements with key >= pivot are kept.
template <bool kAligned, typename T>
__device__ uint32_t filter_pivot(const T* row, int64_t n, const Filters& f, int64_t out_row,
                                 SelectShared& sh) {
  uint32_t pivot = 0;
  uint32_t top_k_pivot = 0;
  if (f.use_top_k) {
    const int64_t k = top_k_target(f.top_k.at(out_row), n);
    if (k > 0) {
      top_k_pivot = radix_select<kAligned>(row, n, CountTarget{k}, CountWeight(), sh);
      pivot = top_k_pivot;
    }
  }
  const float top_p = f.use_top_p ? f.top_p.at(out_row) : 1.f;
  const float min_p = f.use_min_p ? f.min_p.at(out_row) : 0.f;
  if (top_p < 1.f || min_p > 0.f) {
    float total = 0.f, largest = 0.f;
    for_each_element<kAligned>(row, n, [&](int64_t, float x) {
      total += x > 0.f ? x : 0.f;
      largest = fmaxf(largest, x);
    });
    total = block_reduce<kThreads / 32>(total, Sum(), 0.f);
    largest = block_reduce<kThreads / 32>(largest, Max(), 0.f);
    if (top_p < 1.f) {
      // the mass top-p is measured against: the top-k set's when top-k applies first (a row
      // without mass there selects 0, keeping the pivot)
      const MassWeight weigh{mass_scale(total), f.top_k_first ? top_k_pivot : 0u};
      pivot = max(pivot, radix_select<kAligned>(row, n, MassTarget{top_p}, weigh, sh));
    }
    if (min_p > 0.f) pivot = max(pivot, ordered_key(fminf(min_p, 1.f) * largest));
  }
  return pivot;
}

// ---------------------------------------------------------------------------------------
// Kernels: one block of kThreads per output row. Those that search a pivot declare one
// block per SM, so ptxas may use the 64 registers a thread can have instead of spilling
// to fit two blocks.

// softmax(x / t); t = 0 (like t = inf) gives the uniform distribution over the finite logits.
template <bool kAligned, typename T>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(float* __restrict__ out, const T* __restrict__ logits, int64_t n,
                  int64_t in_stride, int64_t out_stride, Param<float> temperature, bool pdl) {
  if (pdl) {
    pdl_wait();
    pdl_launch_dependents();
  }
  const T* row = logits + blockIdx.x * in_stride;
  float* dst = out + blockIdx.x * out_stride;
  const float t = temperature.at(blockIdx.x);
  const float inv_t = t == 0.f ? 0.f : 1.f / t;
  const auto scaled = [inv_t](float x) {
    return inv_t != 0.f ? x * inv_t : (x > -INFINITY ? 0.f : -INFINITY);
  };
  float largest = -INFINITY;
  for_each_element<kAligned>(row, n,
                             [&](int64_t, float x) { largest = fmaxf(largest, scaled(x)); });
  largest = block_reduce<kThreads / 32>(largest, Max(), -INFINITY);
  float total = 0.f;
  for_each_element<kAligned>(row, n,
                             [&](int64_t, float x) { total += __expf(scaled(x) - largest); });
  const float inv_total = 1.f / block_reduce<kThreads / 32>(total, Sum(), 0.f);
  for_each_element<kAligned>(
      row, n, [&](int64_t i, float x) { dst[i] = __expf(scaled(x) - largest) * inv_total; });
}

// The input row of this block's output row, or null (and token -1, not valid, written) when
// its index is out of range.
template <typename T, typename I>
__device__ __forceinline__ const T* source_row(const T* base, const RowSource<I>& source, I* out,
                                               bool* valid) {
  const int64_t src = source.row(blockIdx.x);
  if (src >= 0) return base + src * source.row_stride;
  if (threadIdx.x == 0) {
    out[blockIdx.x] = static_cast<I>(-1);
    if (valid) valid[blockIdx.x] = false;
  }
  return nullptr;
}

// The exponential race over a row: score(x, e, &s) says whether element x (with its Exp(1)
// variate e) runs and sets its score s. The winner's index goes to out[blockIdx.x] (0 if
// none ran) and whether one ran to valid[blockIdx.x] (when valid is set).
template <bool kAligned, typename T, typename I, typename Score>
__device__ __forceinline__ void exponential_race(const T* row, int64_t n, const RandomStream& rng,
                                                 Score score, I* out, bool* valid) {
  Best best{0.f, -1};
  for_each_group<kAligned>(row, n, [&](int64_t g, const float (&x)[kVec], int count) {
    float e[kVec];
    rng.exponentials(g, e);
    for_lanes(count, [&](int j) {
      float s;
      if (score(x[j], e[j], &s)) best = better(best, {s, g * kVec + j});
    });
  });
  best = block_best(best);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = static_cast<I>(best.index < 0 ? 0 : best.index);
    if (valid) valid[blockIdx.x] = best.index >= 0;
  }
}

// Sampling from probabilities, optionally filtered: pivot search, then one race pass.
template <bool kAligned, typename I>
__global__ void __launch_bounds__(kThreads, 1)
    FilteredSamplingKernel(I* __restrict__ out, bool* __restrict__ valid,
                           const float* __restrict__ probs, int64_t n, RowSource<I> source,
                           Filters filters, RandomSource random) {
  __shared__ SelectShared sh;
  const float* row = source_row(probs, source, out, valid);
  if (!row) return;
  const uint32_t pivot = filter_pivot<kAligned>(row, n, filters, blockIdx.x, sh);
  const auto score = [pivot](float x, float e, float* s) {
    *s = x / e;
    return x > 0.f && ordered_key(x) >= pivot;
  };
  exponential_race<kAligned>(row, n, random.stream(blockIdx.x), score, out, valid);
}

// Sampling from logits: argmax of logit + Gumbel noise, Gumbel = -log(E) (a row of -inf
// logits yields 0).
template <bool kAligned, typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    LogitsSamplingKernel(I* __restrict__ out, const T* __restrict__ logits, int64_t n,
                         RowSource<I> source, RandomSource random) {
  const T* row = source_row(logits, source, out, static_cast<bool*>(nullptr));
  if (!row) return;
  const auto score = [](float x, float e, float* s) {
    *s = x - __logf(e);
    return x > -INFINITY;
  };
  exponential_race<kAligned>(row, n, random.stream(blockIdx.x), score, out,
                             static_cast<bool*>(nullptr));
}

// top_k_renorm_probs / top_p_renorm_probs: kept probabilities over their sum, others 0.
template <bool kAligned, typename T>
__global__ void __launch_bounds__(kThreads, 1)
    RenormProbsKernel(T* __restrict__ out, const T* __restrict__ probs, int64_t n,
                      int64_t in_stride, int64_t out_stride, Filters filters) {
  __shared__ SelectShared sh;
  const T* row = probs + blockIdx.x * in_stride;
  T* dst = out + blockIdx.x * out_stride;
  const uint32_t pivot = filter_pivot<kAligned>(row, n, filters, blockIdx.x, sh);
  float kept = 0.f;
  for_each_element<kAligned>(row, n,
                             [&](int64_t, float x) { kept += ordered_key(x) >= pivot ? x : 0.f; });
  kept = block_reduce<kThreads / 32>(kept, Sum(), 0.f);
  const float scale = kept > 0.f ? 1.f / kept : 0.f;
  for_each_element<kAligned>(row, n, [&](int64_t i, float x) {
    dst[i] = from_float<T>(ordered_key(x) >= pivot ? x * scale : 0.f);
  });
}

// top_k_mask_logits: logits outside the top k become -inf.
template <bool kAligned, typename T>
__global__ void __launch_bounds__(kThreads)
    MaskLogitsKernel(T* __restrict__ out, const T* __restrict__ logits, int64_t n,
                     int64_t in_stride, int64_t out_stride, Param<int32_t> top_k) {
  __shared__ SelectShared sh;
  const T* row = logits + blockIdx.x * in_stride;
  T* dst = out + blockIdx.x * out_stride;
  const int64_t k = top_k_target(top_k.at(blockIdx.x), n);
  const uint32_t pivot =
      k > 0 ? radix_select<kAligned>(row, n, CountTarget{k}, CountWeight(), sh) : 0u;
  for_each_element<kAligned>(row, n, [&](int64_t i, float x) {
    dst[i] = from_float<T>(ordered_key(x) >= pivot ? x : -INFINITY);
  });
}

// ---------------------------------------------------------------------------------------
// Launchers. `aligned`: every row starts on a 4-element boundary, so a group loads as one
// vector; the scalar path gives the same results. `pdl` launches with programmatic
// dependent launch (sm90+): the kernel may start while the previous one drains.

template <typename... Params, typename... Args>
inline cudaError_t launch_rows(void (*kernel)(Params...), int64_t rows, cudaStream_t stream,
                               bool pdl, Args... args) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, pdl,
                       args...);
}

// Both instantiations of a kernel share one signature, so `aligned` picks the pointer.
template <typename T>
cudaError_t Softmax(float* out, const T* logits, int64_t rows, int64_t n, int64_t in_stride,
                    int64_t out_stride, Param<float> temperature, bool aligned, bool pdl,
                    cudaStream_t stream) {
  return launch_rows(aligned ? SoftmaxKernel<true, T> : SoftmaxKernel<false, T>, rows, stream, pdl,
                     out, logits, n, in_stride, out_stride, temperature, pdl);
}

// Tokens (and `valid`, when set) of type I, the type of the indices.
template <typename I>
cudaError_t FilteredSampling(I* out, bool* valid, const float* probs, int64_t rows, int64_t n,
                             RowSource<I> source, Filters filters, RandomSource random,
                             bool aligned, cudaStream_t stream) {
  return launch_rows(aligned ? FilteredSamplingKernel<true, I> : FilteredSamplingKernel<false, I>,
                     rows, stream, false, out, valid, probs, n, source, filters, random);
}

template <typename T, typename I>
cudaError_t LogitsSampling(I* out, const T* logits, int64_t rows, int64_t n, RowSource<I> source,
                           RandomSource random, bool aligned, cudaStream_t stream) {
  return launch_rows(aligned ? LogitsSamplingKernel<true, T, I> : LogitsSamplingKernel<false, T, I>,
                     rows, stream, false, out, logits, n, source, random);
}

template <typename T>
cudaError_t RenormProbs(T* out, const T* probs, int64_t rows, int64_t n, int64_t in_stride,
                        int64_t out_stride, Filters filters, bool aligned, cudaStream_t stream) {
  return launch_rows(aligned ? RenormProbsKernel<true, T> : RenormProbsKernel<false, T>, rows,
                     stream, false, out, probs, n, in_stride, out_stride, filters);
}

template <typename T>
cudaError_t MaskLogits(T* out, const T* logits, int64_t rows, int64_t n, int64_t in_stride,
                       int64_t out_stride, Param<int32_t> top_k, bool aligned,
                       cudaStream_t stream) {
  return launch_rows(aligned ? MaskLogitsKernel<true, T> : MaskLogitsKernel<false, T>, rows, stream,
                     false, out, logits, n, in_stride, out_stride, top_k);
}

}  // namespace sampling
}  // namespace flashinfer
