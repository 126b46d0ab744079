// The keys a prefill query token may see under the causal and sliding-window masks, and
// whether a warp's rows see any key of a K/V tile. Plain C++ when not compiled by nvcc, so a
// CPU test evaluates exactly what the prefill kernel computes.
#pragma once

#include <cstdint>

#include "flashinfer/fastdiv.h"
#include "flashinfer/host_device.h"

namespace flashinfer {
namespace prefill {

// Masks of one CTA's work: keys at or past `hi` (its KV range's end) are never seen; with kv_len
// keys and qo_len query tokens, delta = kv_len - qo_len aligns both masks bottom-right.
struct MaskShape {
  int hi, delta;
  bool causal;
  int64_t window_left;  // < 0: no window
};

// Keys [begin, end) token `token` may see (none when end <= begin). Both bounds are
// non-decreasing in the token, so tokens t0..t1 see no key outside [span(t0).begin,
// span(t1).end).
struct KeySpan {
  int64_t begin, end;
};

FLASHINFER_HOST_DEVICE KeySpan visible_keys(const MaskShape& m, int token) {
  KeySpan span{0, m.hi};
  const int64_t diagonal = int64_t{token} + m.delta;  // the last key a causal mask shows
  if (m.causal && diagonal + 1 < span.end) span.end = diagonal + 1;
  if (m.window_left >= 0 && diagonal - m.window_left > span.begin) {
    span.begin = diagonal - m.window_left;
  }
  return span;
}

// Bits [first, last) of a 64-bit word, for 0 <= first, last <= 64 (none when last <= first).
FLASHINFER_HOST_DEVICE uint64_t bit_range(int first, int last) {
  const uint64_t below_last = last >= 64 ? ~uint64_t{0} : (uint64_t{1} << last) - 1;
  const uint64_t below_first = first >= 64 ? ~uint64_t{0} : (uint64_t{1} << first) - 1;
  return below_last & ~below_first;
}

// Bit c (c < tile_kv <= 64): token `token` sees key kv0 + c under the causal and window masks.
FLASHINFER_HOST_DEVICE uint64_t visible_bits(const MaskShape& m, int token, int kv0, int tile_kv) {
  const KeySpan span = visible_keys(m, token);
  const int64_t first = span.begin - kv0, last = span.end - kv0;
  const auto clamp = [tile_kv](int64_t x) {
    return static_cast<int>(x < 0 ? 0 : x > tile_kv ? tile_kv : x);
  };
  return bit_range(clamp(first), clamp(last));
}

// Keys [begin, end) within [0, hi] (so 32-bit); empty when begin >= end.
struct KeyRange {
  int begin, end;
};

FLASHINFER_HOST_DEVICE KeyRange clamped_keys(const MaskShape& m, int64_t begin, int64_t end) {
  const auto clamp = [&m](int64_t x) { return static_cast<int>(x < 0 ? 0 : x > m.hi ? m.hi : x); };
  return {clamp(begin), clamp(end)};
}

// The keys packed rows [first_row, first_row + num_rows) below `rows` (token = row / group)
// may see: from the first row's first visible key to the last row's end; empty when no row
// is below `rows`. Computed once per warp: a tile none of whose keys is in it may be skipped
// by a warp of those rows (exact when every token sees some key, as with kv_len >= qo_len).
FLASHINFER_HOST_DEVICE KeyRange row_keys(const MaskShape& m, int first_row, int num_rows, int rows,
                                         const FastDiv& group) {
  if (first_row >= rows) return {0, 0};
  const int tail = rows - 1 - first_row;  // rows - 1 may sit near 2^31: no first_row + num_rows
  const int last_row = first_row + (num_rows - 1 < tail ? num_rows - 1 : tail);
  return clamped_keys(m, visible_keys(m, group.quotient(first_row)).begin,
                      visible_keys(m, group.quotient(last_row)).end);
}

// The keys every token of t_first..t_last sees: past the last token's window start and before
// the first token's causal diagonal. Computed once per CTA: a tile inside needs no causal or
// window masking.
FLASHINFER_HOST_DEVICE KeyRange keys_seen_by_all(const MaskShape& m, int t_first, int t_last) {
  return clamped_keys(m, visible_keys(m, t_last).begin, visible_keys(m, t_first).end);
}

// Whether a key of [kv0, kv0 + tile_kv) is in `keys` (kv0 + tile_kv may pass 2^31 - 1 in a
// request's last tile: the bound is compared as kv0 > begin - tile_kv).
FLASHINFER_HOST_DEVICE bool keys_meet_tile(const KeyRange& keys, int kv0, int tile_kv) {
  return keys.begin < keys.end && kv0 < keys.end && kv0 > keys.begin - tile_kv;
}

// Whether packed rows [first_row, first_row + num_rows) below `rows` may see a key in
// [kv0, kv0 + tile_kv): false only when none of them does (see row_keys).
FLASHINFER_HOST_DEVICE bool rows_see_tile(const MaskShape& m, int first_row, int num_rows, int rows,
                                          const FastDiv& group, int kv0, int tile_kv) {
  return keys_meet_tile(row_keys(m, first_row, num_rows, rows, group), kv0, tile_kv);
}

}  // namespace prefill
}  // namespace flashinfer
