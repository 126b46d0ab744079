// The keys a prefill query token may see under the causal and sliding-window masks, and
// whether a warp's rows see any key of a K/V tile. Plain C++ when not compiled by nvcc, so a
// CPU test evaluates exactly what the prefill kernel computes.
#pragma once

#include <cstdint>

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

// Whether packed rows [first_row, first_row + num_rows) below `rows` (token = row / group)
// may see a key in [kv0, kv0 + tile_kv): false only when none of them does, so a warp of
// those rows may skip the tile (exact when every token sees some key, as with kv_len >=
// qo_len).
FLASHINFER_HOST_DEVICE bool rows_see_tile(const MaskShape& m, int first_row, int num_rows, int rows,
                                          int group, int kv0, int tile_kv) {
  if (first_row >= rows) return false;
  const int tail = rows - 1 - first_row;  // rows - 1 may sit near 2^31: no first_row + num_rows
  const int last_row = first_row + (num_rows - 1 < tail ? num_rows - 1 : tail);
  const int64_t begin = visible_keys(m, first_row / group).begin;
  const int64_t end = visible_keys(m, last_row / group).end;
  const int64_t tile_end = int64_t{kv0} + tile_kv;
  return (begin > kv0 ? begin : kv0) < (end < tile_end ? end : tile_end);
}

}  // namespace prefill
}  // namespace flashinfer
