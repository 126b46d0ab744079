// Llama-style RoPE inside the prefill kernel (pos_encoding_mode "ROPE_LLAMA", as the reference
// library applies it): dims i and i + head_dim / 2 of a query or key row at position `pos`
// rotate together by the angle pos * rcp_scale * rcp_theta^(2i / head_dim). Applied in place to
// the swizzled shared-memory tiles (swizzle.h), the results rounded to the tile's dtype: Q once
// per CTA, each K tile once after it lands, between two barriers, so the tensor-core code reads
// rotated rows only and stays as it is. Framework-agnostic.
#pragma once

#include <cstdint>

#include "flashinfer/fast_math.cuh"
#include "flashinfer/swizzle.h"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace prefill {

struct Rope {
  float rcp_scale;       // 1 / rope_scale
  float log2_rcp_theta;  // log2(1 / rope_theta)
};

// Rotates rows [0, kRows) of the swizzled [kRows][kHeadDim] tile at `tile`, row r at position
// position(r) (a float), spread over the kThreads threads of the CTA (`tid` this one's index).
// A thread takes a 16-byte chunk of a row's first half and its partner in the second half; it
// keeps the same chunk from row to row, so it works out its eight frequencies once.
template <int kHeadDim, int kRows, int kThreads, typename T, typename Position>
__device__ __forceinline__ void rotate_rows(T* tile, const Rope& rope, unsigned tid,
                                            Position position) {
  constexpr int kHalf = kHeadDim / 16;  // 16-byte chunks in half a row
  constexpr int kUnits = kRows * kHalf;
  static_assert(kThreads % kHalf == 0, "each thread keeps one chunk of the half row");
  const int chunk = static_cast<int>(tid % kHalf);
  float freq[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float exponent = static_cast<float>(2 * (chunk * 8 + e)) / kHeadDim;
    freq[e] = rope.rcp_scale * exp2_approx(rope.log2_rcp_theta * exponent);
  }
#pragma unroll
  for (int j = 0; j < (kUnits + kThreads - 1) / kThreads; ++j) {
    const int unit = static_cast<int>(tid) + j * kThreads;
    if (kUnits % kThreads != 0 && unit >= kUnits) break;
    const int row = unit / kHalf;
    Vec<T, 8>* const first = reinterpret_cast<Vec<T, 8>*>(tile + swizzle<kHeadDim>(row, chunk));
    Vec<T, 8>* const second =
        reinterpret_cast<Vec<T, 8>*>(tile + swizzle<kHeadDim>(row, chunk + kHalf));
    Vec<T, 8> x = *first, y = *second;
    const float pos = position(row);
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
}

}  // namespace prefill
}  // namespace flashinfer
