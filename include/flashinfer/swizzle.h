// The prefill kernel's swizzled shared-memory tiles: rows of head_dim 16-bit elements, 16-byte
// chunk c of row r stored at chunk c ^ row_key(r). Any key that differs across eight
// consecutive rows puts the eight rows an ldmatrix reads at one chunk in eight different bank
// groups; this one also lets a K/V tile's token be copied by its threads as consecutive
// chunks (TokenChunks). Plain C++ when not compiled by nvcc, so a CPU test checks the address
// arithmetic the kernel uses.
#pragma once

#include <cstdint>

#include "flashinfer/host_device.h"

namespace flashinfer {
namespace prefill {

// 5 row % 8 (0 5 2 7 4 1 6 3 for rows 0-7; one multiply-add and the mask that XOR takes
// along): the keys of rows 2k and 2k + 1 differ in bit 2, those of rows 4k .. 4k + 3 in bits
// 1-2, and those of eight rows 8k .. 8k + 7 in bits 0-2.
FLASHINFER_HOST_DEVICE constexpr int row_key(int row) { return row * 5 & 7; }

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][kHeadDim] tile.
template <int kHeadDim>
FLASHINFER_HOST_DEVICE int swizzle(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ row_key(row)) << 3);
}

// Where chunk `chunk` (16 one-byte codes) of row `row` of an fp8 landing tile (prefill.cuh)
// sits in its row of kBytes codes, so that the copies into it are free of bank conflicts
// as the 16-bit tiles' are (TokenChunks; a token's threads take consecutive chunks):
// - rows of whole groups of 8 chunks (head_dim 128 and 256): chunk ^ row_key(row);
// - rows of 4 chunks (head_dim 64), two to a 128-byte line: chunk ^ 2 in rows 4k + 2 and
//   4k + 3, so that at 2 threads a token (m2kv64) the chunk pair a quarter warp's four
//   consecutive tokens store falls in four different pairs of bank groups (unswizzled,
//   rows 4k and 4k + 2 took the same two);
// - rows of 12 chunks (head_dim 192): as they are (rows 2k and 2k + 1 start half a line
//   apart; every tiling accepted for an fp8 cache copies them without conflicts).
// An involution: the widening finds chunk j of a row at landing_chunk(row, j) too.
template <int kBytes>
FLASHINFER_HOST_DEVICE int landing_chunk(int row, int chunk) {
  if constexpr (kBytes % 128 == 0) {
    return chunk ^ row_key(row);
  } else if constexpr (kBytes == 64) {
    return chunk ^ (row & 2);
  } else {
    return chunk;
  }
}

// The chunks one thread copies of a K/V tile's token: the kTokenThreads consecutive threads
// of a token share its chunks, thread `part` taking chunk part + offset(i) in its load i, so
// a load's threads of a token read kTokenThreads consecutive chunks of its row (whole 32-byte
// sectors from two threads on). Their stores stay free of bank conflicts: a quarter warp
// holds 8 / kTokenThreads consecutive tokens (or part of one), and their rows' keys differ in
// the bits that choose which run of kTokenThreads chunks of eight a token's stores fall in.
template <int kHeadDim, int kTokenThreads>
struct TokenChunks {
  static_assert(kHeadDim % 64 == 0, "rows of whole groups of 8 chunks");
  int first_at;  // load 0's element offset in the tile: swizzle(token, part)
  FLASHINFER_HOST_DEVICE TokenChunks(int token, int part)
      : first_at(swizzle<kHeadDim>(token, part)) {}
  static FLASHINFER_HOST_DEVICE constexpr int offset(int i) { return i * kTokenThreads; }
  // swizzle(token, part + offset(i)): offset(i)'s bits 0-2 are clear where part's may be set
  // (part < kTokenThreads, a power of two), so they XOR into the swizzled chunk, and its
  // higher bits add (rows are whole groups of 8 chunks)
  FLASHINFER_HOST_DEVICE int at(int i) const {
    return (first_at ^ ((offset(i) & 7) << 3)) + ((offset(i) & ~7) << 3);
  }
};

// A lane's ldmatrix rows in a swizzled tile: the byte offset from the tile's start of chunk
// 2 * pair + half of row `row + rows`, for `rows` a multiple of 8. Rows are 128 bytes or more,
// so bits 4-6 of an offset are its chunk's low three bits XOR row_key(row) and nothing else: the
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
