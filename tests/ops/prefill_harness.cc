// Host harness for include/flashinfer/prefill_mask.h, fastdiv.h and swizzle.h, built and run by
// tests/ops/test_prefill_host.py with the host compiler. Reads queries from stdin, one per
// line, and prints what the prefill kernel computes for each (the test compares with an
// independent Python model):
//   span hi delta causal window_left token          -> "begin end"
//   bits hi delta causal window_left token kv0 tile_kv -> the visible columns' word, decimal
//   tile hi delta causal window_left first_row num_rows rows group kv0 tile_kv -> "0" or "1"
//   clear hi delta causal window_left t_first t_last -> "begin end" of the keys all see
//   div d n                                          -> n / d by FastDiv
//   rows q|k|v head_dim lane warp_row rows pair      -> the lane's ldmatrix offset (swizzle.h)
//   chunk head_dim token_threads token part i       -> "chunk offset" of a K/V load (swizzle.h)
//   land bytes row chunk                            -> where an fp8 landing row keeps the chunk
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "flashinfer/fastdiv.h"
#include "flashinfer/prefill_mask.h"
#include "flashinfer/swizzle.h"

namespace {

// Load i of thread `part` of `token`: the chunk and its element offset in the tile.
template <int kHeadDim, int kTokenThreads>
void print_chunk(int token, int part, int i) {
  const flashinfer::prefill::TokenChunks<kHeadDim, kTokenThreads> chunks(token, part);
  std::printf("%d %d\n", part + chunks.offset(i), chunks.at(i));
}

template <int kHeadDim>
bool print_chunk(int token_threads, int token, int part, int i) {
  switch (token_threads) {
    case 2:
      print_chunk<kHeadDim, 2>(token, part, i);
      return true;
    case 4:
      print_chunk<kHeadDim, 4>(token, part, i);
      return true;
    case 8:
      print_chunk<kHeadDim, 8>(token, part, i);
      return true;
    case 16:
      print_chunk<kHeadDim, 16>(token, part, i);
      return true;
    default:
      return false;
  }
}

template <int kHeadDim>
uint32_t swizzled_row(int row, int half, int rows, int pair) {
  return flashinfer::prefill::SwizzledRows<kHeadDim>(row, half).at(rows, pair);
}

}  // namespace

int main() {
  char kind[8];
  while (std::scanf("%7s", kind) == 1) {
    if (std::strcmp(kind, "div") == 0) {
      uint32_t d = 0, n = 0;
      if (std::scanf("%" SCNu32 " %" SCNu32, &d, &n) != 2) return 2;
      std::printf("%" PRIu32 "\n", flashinfer::FastDiv(d).quotient(n));
      continue;
    }
    if (std::strcmp(kind, "chunk") == 0) {
      int head_dim = 0, token_threads = 0, token = 0, part = 0, i = 0;
      if (std::scanf("%d %d %d %d %d", &head_dim, &token_threads, &token, &part, &i) != 5) return 2;
      const bool known = head_dim == 64    ? print_chunk<64>(token_threads, token, part, i)
                         : head_dim == 128 ? print_chunk<128>(token_threads, token, part, i)
                         : head_dim == 256 ? print_chunk<256>(token_threads, token, part, i)
                                           : false;
      if (!known) return 2;
      continue;
    }
    if (std::strcmp(kind, "land") == 0) {
      int bytes = 0, row = 0, chunk = 0;
      if (std::scanf("%d %d %d", &bytes, &row, &chunk) != 3) return 2;
      using flashinfer::prefill::landing_chunk;
      const int at = bytes == 64    ? landing_chunk<64>(row, chunk)
                     : bytes == 128 ? landing_chunk<128>(row, chunk)
                     : bytes == 192 ? landing_chunk<192>(row, chunk)
                     : bytes == 256 ? landing_chunk<256>(row, chunk)
                                    : -1;
      if (at < 0) return 2;
      std::printf("%d\n", at);
      continue;
    }
    if (std::strcmp(kind, "rows") == 0) {
      // operand (q, k or v), head_dim, lane, warp_row, rows, pair
      char operand[2];
      int head_dim = 0, lane = 0, warp_row = 0, rows = 0, pair = 0;
      if (std::scanf("%1s %d %d %d %d %d", operand, &head_dim, &lane, &warp_row, &rows, &pair) != 6)
        return 2;
      const flashinfer::prefill::LaneRow at =
          operand[0] == 'q'   ? flashinfer::prefill::q_lane_row(lane)
          : operand[0] == 'k' ? flashinfer::prefill::k_lane_row(lane)
                              : flashinfer::prefill::v_lane_row(lane);
      if (operand[0] != 'q' && operand[0] != 'k' && operand[0] != 'v') return 2;
      const int row = warp_row + at.row;
      if (head_dim == 64) {
        std::printf("%" PRIu32 "\n", swizzled_row<64>(row, at.half, rows, pair));
      } else if (head_dim == 128) {
        std::printf("%" PRIu32 "\n", swizzled_row<128>(row, at.half, rows, pair));
      } else if (head_dim == 256) {
        std::printf("%" PRIu32 "\n", swizzled_row<256>(row, at.half, rows, pair));
      } else {
        return 2;
      }
      continue;
    }
    flashinfer::prefill::MaskShape shape{};
    int causal = 0;
    if (std::scanf("%d %d %d %" SCNd64, &shape.hi, &shape.delta, &causal, &shape.window_left) != 4)
      return 2;
    shape.causal = causal != 0;
    if (std::strcmp(kind, "span") == 0) {
      int token = 0;
      if (std::scanf("%d", &token) != 1) return 2;
      const flashinfer::prefill::KeySpan span = flashinfer::prefill::visible_keys(shape, token);
      std::printf("%" PRId64 " %" PRId64 "\n", span.begin, span.end);
    } else if (std::strcmp(kind, "bits") == 0) {
      int token = 0, kv0 = 0, tile_kv = 0;
      if (std::scanf("%d %d %d", &token, &kv0, &tile_kv) != 3) return 2;
      std::printf("%" PRIu64 "\n", flashinfer::prefill::visible_bits(shape, token, kv0, tile_kv));
    } else if (std::strcmp(kind, "tile") == 0) {
      int first_row = 0, num_rows = 0, rows = 0, group = 0, kv0 = 0, tile_kv = 0;
      if (std::scanf("%d %d %d %d %d %d", &first_row, &num_rows, &rows, &group, &kv0, &tile_kv) !=
          6)
        return 2;
      std::printf("%d\n",
                  flashinfer::prefill::rows_see_tile(shape, first_row, num_rows, rows,
                                                     flashinfer::FastDiv(group), kv0, tile_kv)
                      ? 1
                      : 0);
    } else if (std::strcmp(kind, "clear") == 0) {
      int t_first = 0, t_last = 0;
      if (std::scanf("%d %d", &t_first, &t_last) != 2) return 2;
      const flashinfer::prefill::KeyRange keys =
          flashinfer::prefill::keys_seen_by_all(shape, t_first, t_last);
      std::printf("%d %d\n", keys.begin, keys.end);
    } else {
      return 2;
    }
  }
  return 0;
}
