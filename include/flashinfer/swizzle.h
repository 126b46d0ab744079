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

// The chunks one thread copies of a K/V tile's token: the kTokenThreads consecutive threads
// of a token share its chunks, thread `part` taking chunk first + offset(i) in its load i
// (offset is a compile-time constant, the same for every thread). A thread's chunks come in
// runs of 8 / kTokenThreads (one from 8 threads a token on), so that the eight 16-byte
// stores of each quarter warp land in eight different bank groups of the swizzled tile.
template <int kHeadDim, int kTokenThreads>
struct TokenChunks {
  static constexpr int kRun = kTokenThreads < 8 ? 8 / kTokenThreads : 1;
  int first;     // the chunk of load 0
  int first_at;  // its element offset in the tile: swizzle(token, first)
  FLASHINFER_HOST_DEVICE TokenChunks(int token, int part)
      : first(part * kRun), first_at(swizzle<kHeadDim>(token, part * kRun)) {}
  static FLASHINFER_HOST_DEVICE constexpr int offset(int i) {
    return i / kRun * (kRun * kTokenThreads) + i % kRun;
  }
  // swizzle(token, first + offset(i)): chunks first .. first + kRun - 1 differ from `first`
  // in bits it leaves clear (bits 0-2 only, where first < 8), and a run's start adds a
  // multiple of 8 chunks, which the swizzle keeps
  FLASHINFER_HOST_DEVICE int at(int i) const {
    return (first_at ^ (i % kRun * 8)) + i / kRun * (kRun * kTokenThreads * 8);
  }
};

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

// The row (from the operand tile's first) and chunk half whose address a lane gives ldmatrix
// x4, which loads matrix i from the addresses of lanes 8i .. 8i + 7, in the order the kernel
// passes the four registers to mma.sync m16n8k16 (prefill.cuh: a[mt] whole as A; b[0], b[1]
// as the B of one n8 tile, b[2], b[3] of the next). The CPU test checks these mappings; the
// order of those mma calls is the other half of the contract.
struct LaneRow {
  int row, half;
};
// Q, the A operand (16 rows x 16 dims): rows 0-7 then 8-15 of dims 0-7, then of dims 8-15.
FLASHINFER_HOST_DEVICE LaneRow q_lane_row(int lane) { return {lane % 16, lane / 16}; }
// K, the B operand of Q K^T (16 keys x 16 dims a step): dims 0-7 then 8-15 of keys 0-7 (the
// first n8 tile), then of keys 8-15.
FLASHINFER_HOST_DEVICE LaneRow k_lane_row(int lane) {
  return {lane % 8 + lane / 16 * 8, lane / 8 % 2};
}
// V, the B operand of P V, read transposed (16 keys x 16 dims a step): keys 0-7 then 8-15 of
// dims 0-7 (the first n8 tile), then of dims 8-15.
FLASHINFER_HOST_DEVICE LaneRow v_lane_row(int lane) {
  return {lane % 8 + lane / 8 % 2 * 8, lane / 16};
}

}  // namespace prefill
}  // namespace flashinfer
