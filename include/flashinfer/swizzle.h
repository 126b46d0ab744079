// The prefill kernel's swizzled shared-memory tiles: rows of head_dim 16-bit elements, 16-byte
// chunk c of row r stored at chunk c ^ (r % 8), so that the eight rows an ldmatrix reads at
// one chunk fall in eight different bank groups. Plain C++ when not compiled by nvcc, so a CPU
// test checks the address arithmetic the kernel uses.
#pragma once

#include <cstdint>

#include "flashinfer/host_device.h"

namespace flashinfer {
namespace prefill {

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][kHeadDim] tile.
template <int kHeadDim>
FLASHINFER_HOST_DEVICE int swizzle(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// A lane's ldmatrix rows in a swizzled tile: the byte offset from the tile's start of chunk
// 2 * pair + half of row `row + rows`, for `rows` a multiple of 8. Rows are 128 bytes or more,
// so bits 4-6 of an offset are its chunk's low three bits XOR row % 8 and nothing else: the
// offset of chunk `half` XOR a compile-time constant, plus a compile-time offset, gives every
// (rows, pair) the loops visit from one register.
template <int kHeadDim>
struct SwizzledRows {
  static_assert(kHeadDim % 64 == 0, "rows of at least 8 chunks of 16 bytes");
  uint32_t first;
  FLASHINFER_HOST_DEVICE SwizzledRows(int row, int half)
      : first(static_cast<uint32_t>(2 * swizzle<kHeadDim>(row, half))) {}
  FLASHINFER_HOST_DEVICE uint32_t at(int rows, int pair) const {
    return (first ^ (32u * (pair & 3))) + 32u * (pair & ~3) + 2u * rows * kHeadDim;
  }
};

}  // namespace prefill
}  // namespace flashinfer
