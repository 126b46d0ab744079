// Llama-style RoPE inside attention (pos_encoding_mode "ROPE_LLAMA", as the reference library
// applies it): dims i and i + head_dim / 2 of a query or key row at position `pos` rotate
// together by the angle pos * rcp_scale * rcp_theta^(2i / head_dim). The kernels rotate K
// tiles in shared memory after they land, between two barriers, the results rounded to the
// tile's dtype, so their dot-product code reads rotated rows only and stays as it is; prefill
// rotates its Q tile the same way, decode its query in registers. Framework-agnostic.
#pragma once

#include <cstdint>

#include "flashinfer/fast_math.cuh"
#include "flashinfer/swizzle.h"
#include "flashinfer/vec.cuh"

namespace flashinfer {

struct Rope {
  float rcp_scale;       // 1 / rope_scale
  float log2_rcp_theta;  // log2(1 / rope_theta)
};

// The frequencies of dims [8 * chunk, 8 * chunk + 8) of the first half of a row (and of
// their partners in the second half).
template <int kHeadDim>
__device__ __forceinline__ void chunk_frequencies(const Rope& rope, int chunk, float* freq) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float exponent = static_cast<float>(2 * (chunk * 8 + e)) / kHeadDim;
    freq[e] = rope.rcp_scale * exp2_approx(rope.log2_rcp_theta * exponent);
  }
}

// Rotates eight dims of a row's first half (`first`) with their partners (`second`), in
// place, at position `pos`.
template <typename T>
__device__ __forceinline__ void rotate_chunk(Vec<T, 8>* first, Vec<T, 8>* second, const float* freq,
                                             float pos) {
  Vec<T, 8> x = *first, y = *second;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float s, c;
    sincos_approx(pos * freq[e], &s, &c);
    const float a = to_float(x.data[e]), b = to_float(y.data[e]);
    x.data[e] = from_float<T>(a * c - b * s);
    y.data[e] = from_float<T>(b * c + a * s);
  }
  *first = x;
  *second = y;
}

// Rotates rows [0, kRows) of the swizzled [kRows][kHeadDim] tile at `tile` (prefill's
// layout, swizzle.h), row r at position position(r) (a float), spread over the kThreads
// threads of the CTA (`tid` this one's index). A thread takes a 16-byte chunk of a row's first
// half and its partner in the second half; it keeps the same chunk from row to row, so it
// works out its eight frequencies once.
template <int kHeadDim, int kRows, int kThreads, typename T, typename Position>
__device__ __forceinline__ void rotate_swizzled_rows(T* tile, const Rope& rope, unsigned tid,
                                                     Position position) {
  constexpr int kHalf = kHeadDim / 16;  // 16-byte chunks in half a row
  constexpr int kUnits = kRows * kHalf;
  static_assert(kThreads % kHalf == 0, "each thread keeps one chunk of the half row");
  const int chunk = static_cast<int>(tid % kHalf);
  float freq[8];
  chunk_frequencies<kHeadDim>(rope, chunk, freq);
#pragma unroll
  for (int j = 0; j < (kUnits + kThreads - 1) / kThreads; ++j) {
    const int unit = static_cast<int>(tid) + j * kThreads;
    if (kUnits % kThreads != 0 && unit >= kUnits) break;
    const int row = unit / kHalf;
    rotate_chunk(
        reinterpret_cast<Vec<T, 8>*>(tile + prefill::swizzle<kHeadDim>(row, chunk)),
        reinterpret_cast<Vec<T, 8>*>(tile + prefill::swizzle<kHeadDim>(row, chunk + kHalf)), freq,
        position(row));
  }
}

// Rotates rows [0, rows) of the row-major [rows][kHeadDim] tile at `tile` (decode's layout)
// over `threads` threads, a multiple of kHeadDim / 16 (so each keeps one chunk, as above).
template <int kHeadDim, typename T, typename Position>
__device__ __forceinline__ void rotate_rows(T* tile, const Rope& rope, int rows, int tid,
                                            int threads, Position position) {
  constexpr int kHalf = kHeadDim / 16;
  const int chunk = tid % kHalf;
  float freq[8];
  chunk_frequencies<kHeadDim>(rope, chunk, freq);
  for (int unit = tid; unit < rows * kHalf; unit += threads) {
    const int row = unit / kHalf;
    T* const at = tile + row * kHeadDim + chunk * 8;
    rotate_chunk(reinterpret_cast<Vec<T, 8>*>(at), reinterpret_cast<Vec<T, 8>*>(at + kHeadDim / 2),
                 freq, position(row));
  }
}

}  // namespace flashinfer
