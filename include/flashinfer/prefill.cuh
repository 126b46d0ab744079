// Prefill attention on tensor cores, FlashAttention-2 style: many query tokens per request
// against its KV (ragged: contiguous per request; paged: a page table; single: one request).
// Framework-agnostic: raw pointers, strides and a cudaStream_t.
//
// Work decomposition. A request's query rows are packed with its GQA group: packed row
// p = t * group + g is query token t of query head kv_head * group + g, so every query head
// of a KV head shares each K/V tile (and decode, one token per request, fills a tile with its
// group). A CTA computes one work item -- (request, tile of kTileRows packed rows, KV chunk c
// of n) -- for one KV head; grid = (work items, kv heads). flashinfer/prefill_schedule.py
// decides the chunks; the kernel reads query and KV lengths from the device (indptr,
// last_page_len) when it runs, chunk c covering [c * chunk_tokens, ...) and the last chunk
// running to the request's end. Split requests write float32 partial states (v, base-2 LSE)
// to tmp row tmp_base + t * n + c, and cascade::MergeStatesKernel merges each token's n rows.
//
// Inside a CTA. Its warps each own kMTiles x 16 packed rows (Tiling: 8 warps of 16 rows, or 4
// of 32 so that every K/V fragment read from shared memory feeds two mma, FlashAttention-2's
// layout); 128 rows share each K/V tile (half the L2 traffic per flop of a 64-row tile). Q
// (kTileRows x head_dim) is staged once; K and V arrive in tiles of kTileKV tokens through a
// two-stage cp.async pipeline (tile i + 1 in flight while tile i is computed; with kOverlap, K
// a tile ahead of V, so that tile i + 1's S = Q K^T runs on the tensor cores during tile i's
// softmax). Shared memory rows are swizzled (16-byte chunk c of row r stored at chunk
// c ^ row_key(r), swizzle.h) so that ldmatrix reads and the K/V copies' stores are free of
// bank conflicts while each token's copies read whole 32-byte sectors (of rows that start on
// 32-byte boundaries; the host guarantees 16).
// S = Q K^T and O += P V run on mma.sync m16n8k16 with float32 accumulators; the softmax is online
// in log2 units (running row max m, running sum d, O rescaled by 2^(m_old - m_new) when a row's
// max moves, which it does only past a lag of kMaxLag, so most tiles skip the rescale). Only tiles
// that reach a mask boundary (causal diagonal, window edge, chunk end, custom mask, a page
// outside the cache) mask their scores, each row by one word of visible columns
// (prefill_mask.h); KV tiles wholly outside the causal or window range are never loaded, and
// a warp none of whose rows sees a key of a tile skips that tile's math.
//
// An fp8 KV cache (e4m3 or e5m2; q and the output stay 16-bit): tiles land as fp8 in a ring of
// two slots that fills the second K and V stages' bytes, and after a tile's barrier each
// thread widens some of its 16-byte chunks (exactly: fp8.cuh) into the first stage's swizzled
// 16-bit rows, which the math reads after one more barrier. The copies stay a tile ahead in
// the fp8 ring, so one 16-bit stage serves; the shared memory is the 16-bit build's. The caller
// folds its k_scale into the score scale and its v_scale into the output, as the reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "flashinfer/cascade.cuh"
#include "flashinfer/fast_math.cuh"
#include "flashinfer/fp8.cuh"
#include "flashinfer/kv_table.cuh"
#include "flashinfer/mma.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/pos_encoding.h"
#include "flashinfer/prefill_mask.h"
#include "flashinfer/attention_rope.cuh"
#include "flashinfer/ptx.cuh"
#include "flashinfer/schedule.cuh"
#include "flashinfer/swizzle.h"

namespace flashinfer {
namespace prefill {

constexpr int kTileRows = 128;  // packed query rows per CTA (prefill_schedule.py's TILE_ROWS)
// How far (log2 units) a tile's score max may pass a row's running max before the row rescales
// to it: its exponentials reach at most 2^kMaxLag, far inside fp16's range for P.
constexpr float kMaxLag = 8.f;

// What the main loop and the epilogue read of a CTA's work item: kept in shared memory and
// read where used, not held in registers through the loop (m2's O and score accumulators
// leave none to spare). hi: the end of the KV range; delta = kv_len - qo_len; packed rows
// [row0, ...) of `rows`; keys [clear_lo, clear_hi), which every row sees under the causal and
// window masks (prefill_mask.h's keys_seen_by_all); the request's KV offset (ragged) or first page
// (paged); its first query row; its first custom-mask bit; where the output goes: tmp_base < 0, the
// output rows, else partial-state rows tmp_base + t * chunks + chunk; and the num_tiles K/V tiles
// of kTileKV tokens from key lo the loop runs over.
struct TileBounds {
  int hi, delta, row0, rows, clear_lo, clear_hi, kv_len, kv_offset, page_base, q_start;
  int tmp_base, chunk, chunks, lo, num_tiles;
  int64_t mask_bit0;
};

// A CTA's shape: kMTiles 16-row mma tiles per warp (1 or 2) and kTileKV tokens per K/V tile,
// for q and K rows of kHeadDim and V and output rows of kHeadDimVO (DeepSeek's MLA prefill:
// 192 and 128). A lane holds kMTiles * (kHeadDimVO + kTileKV) / 2 float32 accumulators (O and
// the scores): the register file bounds both. kMinCTAs: CTAs per SM the compiler must fit in
// registers (__launch_bounds__; 1 leaves it up to 255 registers a thread, 2 caps 256-thread
// CTAs at 128).
template <int kHeadDim_, int kMTiles_, int kTileKV_, int kMinCTAs_ = 1, bool kOverlap_ = false,
          int kHeadDimVO_ = kHeadDim_>
struct Tiling {
  static constexpr int kHeadDim = kHeadDim_, kMTiles = kMTiles_, kTileKV = kTileKV_;
  static constexpr int kHeadDimVO = kHeadDimVO_;
  static constexpr int kMinCTAs = kMinCTAs_;
  // The next tile's S = Q K^T overlaps this tile's softmax (the main loop's second form): a
  // lane holds two tiles' scores, kMTiles * kTileKV / 2 registers more.
  static constexpr bool kOverlap = kOverlap_;
  static_assert(kMinCTAs == 1 || kMinCTAs == 2, "one or two CTAs per SM");
  static_assert(kHeadDim % 64 == 0 && kHeadDimVO % 64 == 0,
                "the swizzle needs rows of whole groups of 8 chunks of 16 bytes");
  static_assert(kHeadDimVO <= kHeadDim, "V rows are at most as long as K rows");
  static_assert(kMTiles == 1 || kMTiles == 2, "a warp owns 16 or 32 rows");
  // (one or two 32-token ballots and mask-bit groups cover a tile's tokens)
  static_assert(kTileKV == 16 || kTileKV == 32 || kTileKV == 64, "K/V tiles of 16, 32 or 64");
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kWarps = kTileRows / kWarpRows;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kHeadDim / 8, kVChunks = kHeadDimVO / 8;  // 16-byte chunks a row
  static_assert(kTileKV * kChunks % kThreads == 0 && kTileKV * kVChunks % kThreads == 0,
                "every thread loads as many K (and V) chunks");
  static constexpr int kQElems = kTileRows * kHeadDim;
  static constexpr int kKElems = kTileKV * kHeadDim, kVElems = kTileKV * kHeadDimVO;
  // K and V stages: the tile computed and the one in flight (kOverlap: K a tile ahead of V)
  static constexpr int kStages = 2;
  // Bytes marking a tile's tokens on pages outside the cache, written with its K: a ring of
  // one slot per tile from the oldest one read to the newest one loaded.
  static constexpr int kMaskSlots = kOverlap ? 3 : 2;
  // A warp skips the O rescale of rows whose max did not move (kMaxLag), except in the shape
  // with the most accumulators (head_dim 128 m2kv64: 192 a lane in 255 registers), where the
  // branch around the rescale costs 24 bytes of spills: it rescales every tile.
  static constexpr bool kLazyRescale = kMTiles * (kHeadDimVO + kTileKV) / 2 < 192;
  // Q, then kStages stages of K, then kStages of V (16-bit elements), then per mask slot one
  // byte per token: 1 when the token is on a page outside the cache (not scored), then the
  // work item's TileBounds
  static constexpr size_t kBoundsOffset =
      (kQElems + kStages * (kKElems + kVElems)) * 2 + kMaskSlots * kTileKV;
  static_assert(kBoundsOffset % alignof(TileBounds) == 0, "TileBounds is aligned");
  // then per warp the keys its rows may see (prefill_mask.h's KeyRange)
  static constexpr size_t kKeysOffset = kBoundsOffset + sizeof(TileBounds);
  static_assert(kKeysOffset % alignof(KeyRange) == 0, "KeyRanges are aligned");
  static constexpr size_t kSharedBytes = kKeysOffset + kWarps * sizeof(KeyRange);
};

// T: q and the output; TKV: the KV cache (T, or an fp8 type).
template <typename T, typename TKV = T>
struct PrefillParams {
  const T* q;
  int64_t q_row_stride, q_head_stride;
  // [batch + 1] query row offsets; null: one request of single_qo_len rows (single prefill)
  const int32_t* qo_indptr;
  KVCache<TKV> k, v;
  // Paged: indices, indptr (page offsets) and last_page_len. Ragged: indices null, indptr the
  // token offsets. Single: indptr null too, kv_len = single_kv_len.
  PageTable pages;
  FastDiv page_div;  // divides by pages.page_size (set up on the host, once per launch)
  // Bit-packed boolean masks (little bit order): request b's [qo_len, kv_len] mask, row-major,
  // starts at byte mask_indptr[b] (at 0 when mask_indptr is null). Null: no custom mask.
  const uint8_t* mask;
  const int32_t* mask_indptr;
  T* out;
  int64_t out_row_stride, out_head_stride;
  float* lse;      // [rows, qo_heads] base-2 LSE, may be null
  float* tmp_v;    // [tmp rows, qo_heads, head_dim_vo]
  float* tmp_lse;  // [tmp rows, qo_heads]
  int64_t num_qo_heads, group;
  FastDiv group_div;  // divides by group (set up on the host)
  float scale;        // applied to q.k: sm_scale * log2e, or sm_scale / cap with a soft cap
  float cap;          // > 0: score = cap * log2e * tanh(scaled q.k)
  // The causal mask applies: false with a custom mask, which the reference lets override it
  // (the launch folds that in, so the loop reads one parameter, not a flag it must keep)
  bool causal;
  // >= 0: token t sees key j only if j >= t + kv_len - qo_len - window_left
  int64_t window_left;
  int64_t single_qo_len, single_kv_len;
  Rope rope;                  // read only by the kernels built with RoPE (attention_rope.cuh)
  const float* alibi_slopes;  // [num_qo_heads], log2 units; read by the ALiBi kernels
};

// Batch mode: plan points at the packed schedule (schedule.cuh) on the device, its work
// columns request, q_tile, chunk, chunks and tmp_base (see prefill_schedule.py). Single mode
// (plan null): item i is q tile i / single_chunks, chunk i % single_chunks.
using Schedule = PackedSchedule<0, 0, 0, 1, -1>;

struct WorkList {
  const int32_t* plan;
  int64_t capacity;
  int64_t chunk_tokens;   // single mode
  int64_t single_chunks;  // single mode
};

struct Item {
  int request, q_tile, chunk, chunks, tmp_base, chunk_tokens;
};

__device__ __forceinline__ bool work_item(const WorkList& w, int i, Item* item) {
  if (w.plan) {
    int32_t word[Schedule::kColumns];
    int tokens;
    if (!Schedule::item(w.plan, w.capacity, i, word, &tokens)) return false;
    *item = {word[0], word[1], word[2], word[3], word[4], tokens};
    return true;
  }
  // The grid is exactly the items; the last query tiles go first (under a causal mask they see
  // the most keys), as the batch plan orders its items longest first.
  i = static_cast<int>(gridDim.x) - 1 - i;
  const int chunks = static_cast<int>(w.single_chunks);
  *item = {0,      i / chunks,          i % chunks,
           chunks, chunks > 1 ? 0 : -1, static_cast<int>(w.chunk_tokens)};
  return true;
}

// Bits [begin_bit, begin_bit + kCols) of a bit-packed mask (little bit order) as bit c of the
// result; bytes at or past `end_bit` (the mask row's end) are never read and read as 0. A
// few byte loads at one base address per 32 columns, not one load (and one 64-bit address
// register) per column.
template <int kCols>
__device__ __forceinline__ uint64_t mask_bits(const uint8_t* mask, int64_t begin_bit,
                                              int64_t end_bit) {
  static_assert(kCols <= 64, "a tile row's bits fit one 64-bit word");
  constexpr int kGroupCols = kCols < 32 ? kCols : 32;
  constexpr int kBytes = (kGroupCols + 7 + 7) / 8;  // a group's bits behind a 0..7-bit offset
  const int64_t last_byte = (end_bit - 1) >> 3;
  uint64_t bits = 0;
#pragma unroll
  for (int g = 0; g < kCols / kGroupCols; ++g) {
    const int64_t first = begin_bit + g * kGroupCols, byte0 = first >> 3;
    uint64_t word = 0;
#pragma unroll
    for (int k = 0; k < kBytes; ++k) {
      if (byte0 + k <= last_byte) word |= uint64_t{mask[byte0 + k]} << (8 * k);
    }
    bits |= ((word >> (first & 7)) & ((uint64_t{1} << kGroupCols) - 1)) << (g * kGroupCols);
  }
  return bits;
}

// Where the request's query tokens start and how many it has (clamped to [0, 2^31)).
template <typename P>
__device__ __forceinline__ void query_span(const P& p, int request, int* q_start, int* qo_len) {
  int64_t start = 0, len = p.single_qo_len;
  if (p.qo_indptr) {
    start = p.qo_indptr[request];
    len = int64_t{p.qo_indptr[request + 1]} - start;
  }
  *q_start = static_cast<int>(start);
  *qo_len = static_cast<int>(min(max(len, int64_t{0}), int64_t{0x7fffffff}));
}

// (the minimum CTAs per SM is always named: without one, ptxas may cap registers on its own
// for occupancy and spill, as it did for 64:m2kv16 at 128). kPos (pos_encoding.h): RoPE
// rotates queries and keys (attention_rope.cuh) in shared memory before any warp reads them;
// ALiBi adds each row's slope times (key index - query index) to the scores of every tile.
template <typename T, typename TKV, typename Tl, PosEncoding kPos>
__global__ void __launch_bounds__(Tl::kThreads, Tl::kMinCTAs)
    PrefillKernel(PrefillParams<T, TKV> p, WorkList w) {
  // (an fp8 cache: see the top)
  constexpr bool kFp8 = sizeof(TKV) == 1;
  static_assert(kFp8 || std::is_same_v<T, TKV>, "the KV cache is q's dtype or an fp8 type");
  // RoPE with an fp8 cache is refused (on the host too), as in decode, whose kernel would
  // round the rotated keys to the cache's type
  static_assert(!kFp8 || kPos != PosEncoding::kRopeLlama, "RoPE needs a 16-bit cache");
  // (each thread rotates one chunk of a half row in every row it takes: the CTA's threads
  // must be a multiple of the half row's chunks, which 192's 12 are not)
  static_assert(kPos != PosEncoding::kRopeLlama || Tl::kHeadDim == Tl::kHeadDimVO,
                "RoPE needs q, K and V rows of one head_dim");
  constexpr int kHeadDim = Tl::kHeadDim, kHeadDimVO = Tl::kHeadDimVO;
  constexpr int kMTiles = Tl::kMTiles, kThreads = Tl::kThreads;
  constexpr int kTileKV = Tl::kTileKV, kChunks = Tl::kChunks, kVChunks = Tl::kVChunks;
  constexpr int kScoreTiles = kTileKV / 8, kDimTiles = kHeadDimVO / 8;
  uint8_t* const shared_bytes = dynamic_shared();
  T* const sq = reinterpret_cast<T*>(shared_bytes);
  T* const sk = sq + Tl::kQElems;
  T* const sv = sk + Tl::kStages * Tl::kKElems;
  uint8_t* const unscored = reinterpret_cast<uint8_t*>(sv + Tl::kStages * Tl::kVElems);
  static_assert(Tl::kStages == 2, "the main loops below are written for two stages");
  // fp8: the ring's two slots of a tile's fp8 rows (swizzle.h's landing_chunk) in the second
  // stage's bytes
  uint8_t* const k_landing = reinterpret_cast<uint8_t*>(sk + Tl::kKElems);
  uint8_t* const v_landing = reinterpret_cast<uint8_t*>(sv + Tl::kVElems);
  // The 16-bit stage the math reads tile `tile` from (fp8: always the first)
  auto stage_of = [](int tile) { return kFp8 ? 0 : tile % Tl::kStages; };
  TileBounds* const shared_bounds = reinterpret_cast<TileBounds*>(shared_bytes + Tl::kBoundsOffset);
  KeyRange* const warp_keys = reinterpret_cast<KeyRange*>(shared_bytes + Tl::kKeysOffset);

  // The schedule is written by plan()'s host copies, never by a kernel, so its words load
  // before the wait, under the previous kernel's tail (schedule.cuh); all else after it.
  Item item;
  const bool planned = work_item(w, blockIdx.x, &item);
  pdl_wait();
  // The next kernel (the merge of split KV) may launch into free SMs now and load its
  // schedule; its own pdl_wait() still waits for this whole grid.
  pdl_launch_dependents();
  if (!planned) return;
  // Token positions are 32-bit (lengths < 2^31, checked on the host): the registers they
  // would take as 64-bit values are the accumulators'.
  const int64_t kv_head = blockIdx.y;
  const int group = static_cast<int>(p.group);  // <= num_qo_heads < 2^16
  int q_start, qo_len, kv_offset = 0, page_base = 0;
  query_span(p, item.request, &q_start, &qo_len);
  int64_t kv_len64 = p.single_kv_len;
  if (p.qo_indptr) {
    if (p.pages.indices) {
      page_base = p.pages.indptr[item.request];
      kv_len64 = request_length(p.pages, item.request);
    } else {
      kv_offset = p.pages.indptr[item.request];
      kv_len64 = int64_t{p.pages.indptr[item.request + 1]} - kv_offset;
    }
  }
  const int kv_len = static_cast<int>(min(max(kv_len64, int64_t{0}), int64_t{0x7fffffff}));
  // Packed rows are 32-bit too: tokens x query heads < 2^31 (checked on the host).
  const int rows = static_cast<int>(min(int64_t{qo_len} * group, int64_t{0x7fffffff}));
  const int row0 = item.q_tile * kTileRows;
  if (row0 >= rows) return;  // no query token of this tile (lengths shrank since the plan)
  const FastDiv& by_group = p.group_div;
  const int t_first = by_group.quotient(row0);
  const int t_last = by_group.quotient(min(row0 + kTileRows - 1, rows - 1));
  const int delta = kv_len - qo_len;  // bottom-right alignment of causal and window masks

  // The KV range this tile attends in its chunk: [lo, hi).
  int64_t lo64 = min(int64_t{item.chunk} * item.chunk_tokens, int64_t{kv_len});
  int64_t hi64 =
      item.chunk + 1 >= item.chunks ? kv_len : min(lo64 + item.chunk_tokens, int64_t{kv_len});
  if (p.causal) hi64 = min(hi64, int64_t{t_last} + delta + 1);
  if (p.window_left >= 0) lo64 = max(lo64, int64_t{t_first} + delta - p.window_left);
  const int lo = static_cast<int>(lo64), hi = static_cast<int>(max(hi64, lo64));
  const int num_tiles = static_cast<int>((int64_t{hi} - lo + kTileKV - 1) / kTileKV);
  const int64_t mask_bit0 = p.mask && p.mask_indptr ? int64_t{p.mask_indptr[item.request]} * 8 : 0;
  TileBounds bounds;  // (by name: fifteen ints in a row could swap unnoticed)
  bounds.hi = hi;
  bounds.delta = delta;
  bounds.row0 = row0;
  bounds.rows = rows;
  const MaskShape shape{hi, delta, p.causal, p.window_left};
  const KeyRange clear = keys_seen_by_all(shape, t_first, t_last);
  bounds.clear_lo = clear.begin;
  bounds.clear_hi = clear.end;
  bounds.kv_len = kv_len;
  bounds.kv_offset = kv_offset;
  bounds.page_base = page_base;
  bounds.q_start = q_start;
  bounds.tmp_base = item.tmp_base;
  bounds.chunk = item.chunk;
  bounds.chunks = item.chunks;
  bounds.lo = lo;
  bounds.num_tiles = num_tiles;
  bounds.mask_bit0 = mask_bit0;
  // published by the barrier before the loop; nothing writes it again
  if (threadIdx.x == 0) *shared_bounds = bounds;
  if (threadIdx.x % 32 == 0) {
    const int warp_row = threadIdx.x / 32 * Tl::kWarpRows;
    warp_keys[threadIdx.x / 32] = row_keys(shape, row0 + warp_row, Tl::kWarpRows, rows, by_group);
  }

  // Q: the tile's 16-byte chunks dealt out to the threads in turn, chunk c of the tile being
  // chunk c % kChunks of row c / kChunks (once per CTA; with 8, 16 or 32 chunks a row, a
  // thread's chunk column stays the same); packed rows past the request's end are
  // zero-filled (their results are never stored).
#pragma unroll
  for (int i = 0; i < kTileRows * kChunks / kThreads; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = c / kChunks, col = c % kChunks, packed = row0 + r;
    const bool valid = packed < rows;
    const int t = by_group.quotient(packed);
    const int64_t head = kv_head * group + (packed - t * group);
    const T* src = p.q + (q_start + int64_t{t}) * p.q_row_stride + head * p.q_head_stride + col * 8;
    cp_async_16(sq + swizzle<kHeadDim>(r, col), valid ? src : p.q, valid);
  }
  // K and V tiles are copied by token: the kTokenThreads consecutive threads of token
  // tid / kTokenThreads copy its chunks (swizzle.h's TokenChunks), so a thread looks up one
  // page and computes one K and one V row address per tile. Tokens at or past `hi` (all those
  // of a tile past the last, whose copies fill a stage no one reads with zeros), and tokens on
  // pages outside the cache, read as zeros (never memory another request owns) and are
  // masked: the first by `hi`, the second by their byte in `unscored`, written with the K
  // copies by the token's first thread. No branch: a thread's K and V copies start at the
  // same chunk of their rows (TokenChunks; the rows' lengths may differ, 192 and 128) and add
  // compile-time offsets to one row address each.
  constexpr int kTokenThreads = kThreads / kTileKV;
  constexpr int kThreadChunks = kChunks / kTokenThreads, kVThreadChunks = kVChunks / kTokenThreads;
  // fp8: a row's 16-byte chunks (16 codes each); the token's thread `part` copies chunks
  // part + i * kTokenThreads (none when there are fewer chunks than threads)
  constexpr int kLandChunks = kHeadDim / 16, kVLandChunks = kHeadDimVO / 16;
  constexpr int kLandCopies = (kLandChunks + kTokenThreads - 1) / kTokenThreads;
  constexpr int kVLandCopies = (kVLandChunks + kTokenThreads - 1) / kTokenThreads;
  static_assert(kTileRows * kChunks % kThreads == 0 && kThreads % kTileKV == 0 &&
                    kChunks % kTokenThreads == 0 && kVChunks % kTokenThreads == 0,
                "whole rows per load");
  // This thread's token of tile `tile`: its position (its index in the request, plus the
  // request's offset into a ragged cache) and whether it is one of the tile's tokens.
  // (kv0 + token may pass 2^31 - 1 in a request's last tile: the bound is end - kv0 > token,
  // and a token past it stands at position kv0 instead)
  struct TokenAt {
    int position;
    bool in_range;
  };
  auto token_at = [&](int tile, const TileBounds& cta) -> TokenAt {
    const int token = thread_index() / kTokenThreads;
    const int kv0 = cta.lo + min(tile, cta.num_tiles - 1) * kTileKV;
    const bool in_range = tile < cta.num_tiles && token < cta.hi - kv0;
    return {cta.kv_offset + (in_range ? kv0 + token : kv0), in_range};
  };
  // The page-table entry of that token (kv_table.cuh's page_entry), loaded a step before its
  // rows are located: the load's latency then passes under a tile's math, not at the top of
  // the next, where every warp would wait for it together.
  auto entry_ahead = [&](int tile, const TileBounds& cta) {
    return page_entry(p.pages, p.page_div, cta.page_base, token_at(tile, cta).position);
  };
  // Its K and V rows as pointers to the thread's first chunk (an unfilled copy names q's first
  // row, which holds a whole head's row of chunks, K's and V's: Tiling has kHeadDimVO <=
  // kHeadDim), given its page-table entry (entry_ahead). The first chunk is K's and V's
  // alike (TokenChunks: the thread's `part`).
  struct TokenRows {
    const TKV* k;
    const TKV* v;
    bool valid, unscored;
  };
  auto locate = [&](int tile, const TileBounds& cta, int entry) -> TokenRows {
    const TokenAt at = token_at(tile, cta);
    const int page = entry_page(p.pages, entry);
    const bool valid = at.in_range && page >= 0;
    const int64_t slot = slot_of(p.pages, p.page_div, at.position);
    const int token = thread_index() / kTokenThreads, part = thread_index() % kTokenThreads;
    const int first = part * (kFp8 ? 16 : 8);  // TokenChunks: chunk `part` (K's and V's)
    auto row = [&](const KVCache<TKV>& cache) {
      return (valid ? cache.data + page * cache.page_stride + slot * cache.slot_stride +
                          kv_head * cache.head_stride
                    : reinterpret_cast<const TKV*>(p.q)) +
             first;
    };
    return {row(p.k), row(p.v), valid, at.in_range && !valid};
  };
  // Copies K of tile k_tile from `k_at` and (with_v) V of tile v_tile from `v_at` into their
  // stages (fp8: their ring slots): the same tile, or (kOverlap) V a tile behind K, whose rows
  // were located with the K of the loop's previous step.
  auto load_kv = [&](int k_tile, const TokenRows& k_at, int v_tile, const TokenRows& v_at,
                     bool with_v) {
    const unsigned tid = thread_index();
    const int token = tid / kTokenThreads, part = tid % kTokenThreads;
    if (part == 0) unscored[k_tile % Tl::kMaskSlots * kTileKV + token] = k_at.unscored;
    // (K's and V's copies interleaved, as many of each as their rows have)
    if constexpr (kFp8) {
      uint8_t* const k_row = k_landing + k_tile % 2 * Tl::kKElems + token * kHeadDim;
      uint8_t* const v_row = v_landing + v_tile % 2 * Tl::kVElems + token * kHeadDimVO;
#pragma unroll
      for (int i = 0; i < kLandCopies; ++i) {
        const int chunk = part + i * kTokenThreads, offset = i * kTokenThreads * 16;
        if (kLandChunks % kTokenThreads == 0 || chunk < kLandChunks) {
          cp_async_16(k_row + 16 * landing_chunk<kHeadDim>(token, chunk), k_at.k + offset,
                      k_at.valid);
        }
        if (with_v && i < kVLandCopies &&
            (kVLandChunks % kTokenThreads == 0 || chunk < kVLandChunks)) {
          cp_async_16(v_row + 16 * landing_chunk<kHeadDimVO>(token, chunk), v_at.v + offset,
                      v_at.valid);
        }
      }
      return;
    }
    const TokenChunks<kHeadDim, kTokenThreads> chunks(token, part);
    const TokenChunks<kHeadDimVO, kTokenThreads> v_chunks(token, part);
    T* const k_stage = sk + k_tile % Tl::kStages * Tl::kKElems;
    T* const v_stage = sv + v_tile % Tl::kStages * Tl::kVElems;
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      cp_async_16(k_stage + chunks.at(i), k_at.k + chunks.offset(i) * 8, k_at.valid);
      if (with_v && i < kVThreadChunks) {
        cp_async_16(v_stage + v_chunks.at(i), v_at.v + v_chunks.offset(i) * 8, v_at.valid);
      }
    }
  };
  // fp8: widens the tile in ring slot `slot` of `landing` into the 16-bit stage `stage`, its
  // rows of `dim` (a std::integral_constant: kHeadDim for K, kHeadDimVO for V), the tile's
  // 16-byte chunks dealt out to the threads in turn (consecutive threads read consecutive
  // places, each holding the row's chunk j that landing_chunk put there). Chunk j of a row
  // widens into 16-bit chunks 2j and 2j + 1; threads with j % 8 = 4..7 store the odd one
  // first, so that each quarter warp's first (and second) stores fall in eight different bank
  // groups of the swizzled rows (a quarter warp's eight places hold j = 0..7 of a row, or of
  // 8..15, or j = 4..11 of one of head_dim 192's rows of 12, or span rows 2k and 2k + 1,
  // whose keys' bit 0 differs: head_dim 64 and 192; test_prefill_host.py checks each).
  // Called by every thread between two barriers: the first publishes the landed codes (and
  // frees the stage), the second the widened rows.
  auto widen = [&](auto dim, const uint8_t* landing, int slot, T* stage) {
    if constexpr (kFp8) {
      constexpr int kDim = decltype(dim)::value, kRowChunks = kDim / 16;
      constexpr int kTileChunks = kTileKV * kRowChunks;
#pragma unroll
      for (int i = 0; i < (kTileChunks + kThreads - 1) / kThreads; ++i) {
        const int c = thread_index() + i * kThreads;
        if (kTileChunks % kThreads == 0 || c < kTileChunks) {
          const uint4 codes =
              *reinterpret_cast<const uint4*>(landing + slot * kTileKV * kDim + c * 16);
          uint4 lo, hi;
          fp8x16_to<T, TKV>(codes, &lo, &hi);
          const int r = c / kRowChunks, j = landing_chunk<kDim>(r, c % kRowChunks);
          const int odd = j >> 2 & 1;
          *reinterpret_cast<uint4*>(stage + swizzle<kDim>(r, 2 * j + odd)) = odd ? hi : lo;
          *reinterpret_cast<uint4*>(stage + swizzle<kDim>(r, 2 * j + 1 - odd)) = odd ? lo : hi;
        }
      }
    }
  };
  const std::integral_constant<int, kHeadDim> k_dim;
  const std::integral_constant<int, kHeadDimVO> v_dim;
  // RoPE: query row r of the tile at its token's position (bottom-right aligned, as the
  // causal mask: negative for the first queries of a request with fewer keys than queries,
  // so the sum is signed), key r of K tile `tile` at its index in the request. Called by every
  // thread between two barriers: the first publishes the landed rows, the second the
  // rotated ones. (Instantiated by the RoPE builds only: others may have rows it cannot take.)
  auto rotate_q = [&]() {
    if constexpr (kPos == PosEncoding::kRopeLlama) {
      rotate_swizzled_rows<kHeadDim, kTileRows, kThreads>(sq, p.rope, thread_index(), [&](int r) {
        return static_cast<float>(static_cast<int>(by_group.quotient(row0 + r)) + delta);
      });
    }
  };
  auto rotate_k = [&](int stage, int tile, const TileBounds& cta) {
    if constexpr (kPos == PosEncoding::kRopeLlama) {
      const int64_t kv0 = cta.lo + int64_t{tile} * kTileKV;
      rotate_swizzled_rows<kHeadDim, kTileKV, kThreads>(
          sk + stage * Tl::kKElems, p.rope, thread_index(),
          [&](int r) { return static_cast<float>(kv0 + r); });
    }
  };
  // Prologue: tile 0 (kOverlap: its K), in a commit group of its own.
  const TokenRows first_rows = locate(0, bounds, entry_ahead(0, bounds));
  load_kv(0, first_rows, 0, first_rows, !Tl::kOverlap);
  cp_async_commit();

  float o[kMTiles][kDimTiles][4];
  // m: each of the lane's rows' running max (the same in a row's four lanes). d: one row's
  // running sum, that of row 2 * mt + h == lane % 4 of the lane's rows (the quad adds its
  // lanes' columns each tile): 1 register, not 2 * kMTiles, which m2kv64 does not have.
  float m[kMTiles][2];
  float d = 0.f;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
  }
  // ALiBi: row (mt, h) of this lane gains slope * key - slope * query (its token's index) in
  // the raw q.k units the scores are in until the softmax scales them (p.scale: no soft cap).
  float slope[kMTiles][2], row_bias[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      slope[mt][h] = row_bias[mt][h] = 0.f;
      if constexpr (kPos == PosEncoding::kAlibi) {
        const int packed =
            row0 + thread_index() / 32 * Tl::kWarpRows + thread_index() % 32 / 4 + mt * 16 + 8 * h;
        const int t = by_group.quotient(packed);
        slope[mt][h] = p.alibi_slopes[kv_head * group + (packed - t * group)] / p.scale;
        row_bias[mt][h] = -slope[mt][h] * static_cast<float>(t);
      }
    }
  }
  __syncthreads();  // shared_bounds, warp_keys

  // A tile's scores: this lane's elements of its warp's kMTiles x kScoreTiles mma tiles. Its
  // rows are two of each of the warp's 16-row mma tiles, tile rows warp_row + mt * 16 +
  // lane / 4 + 8h. The lambdas below recompute what a lane derives from its thread index.
  using Scores = float[kMTiles][kScoreTiles][4];
  // S = Q K^T of the tile in `stage`: each K fragment read from shared memory feeds every
  // m-tile of the warp. ldmatrix addresses: a tile's 32-bit shared-window address plus a row
  // offset (swizzle.h).
  auto qk = [&](int stage, Scores& s) {
    const int lane = thread_index() % 32, warp_row = thread_index() / 32 * Tl::kWarpRows;
    const LaneRow q = q_lane_row(lane), k = k_lane_row(lane);
    const SwizzledRows<kHeadDim> q_rows(warp_row + q.row, q.half), k_rows(k.row, k.half);
    const uint32_t q_base = mma::smem_address(sq);
    const uint32_t k_base = mma::smem_address(sk) + stage * Tl::kKElems * 2;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int i = 0; i < kScoreTiles; ++i)
        s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma::ldmatrix_x4(a[mt], q_base + q_rows.at(mt * 16, ks));
#pragma unroll
      for (int n2 = 0; n2 < kTileKV / 16; ++n2) {
        uint32_t b[4];  // keys 0-7 then 8-15 of this step (swizzle.h's k_lane_row)
        mma::ldmatrix_x4(b, k_base + k_rows.at(n2 * 16, ks));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma::mma_16816<T>(s[mt][2 * n2], a[mt], b[0], b[1]);
          mma::mma_16816<T>(s[mt][2 * n2 + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };
  // Masks the scores of tile `tile` where it reaches a mask boundary and applies the soft
  // cap; returns the factor that takes the scores to log2 units.
  auto mask_scores = [&](int tile, const TileBounds& cta, Scores& s) -> float {
    const int kv0 = cta.lo + tile * kTileKV;
    const int lane = thread_index() % 32;
    const int lane_row = thread_index() / 32 * Tl::kWarpRows + lane / 4;
    // Bit c: the tile's token c is on a page outside the cache (only a page table has them).
    uint64_t blocked = 0;
    if (p.pages.indices) {
      const uint8_t* const tile_unscored = unscored + tile % Tl::kMaskSlots * kTileKV;
      blocked = __ballot_sync(0xffffffffu, lane < kTileKV && tile_unscored[lane] != 0);
      if (kTileKV > 32) {
        blocked |= uint64_t{__ballot_sync(0xffffffffu, tile_unscored[32 + lane] != 0)} << 32;
      }
    }
    // (kv0 + kTileKV may pass 2^31 - 1 in a request's last tile: compared as kv0 > end - tile)
    const bool needs_mask = p.mask || blocked || kv0 < cta.clear_lo || kv0 > cta.clear_hi - kTileKV;
    if (needs_mask) {
      // Per row, one word of visible columns (causal and window range, custom mask, pages
      // in the cache), shifted so that this lane's columns i * 8 + e % 2 test at
      // compile-time bit positions: no per-element branch, load or variable shift.
      const MaskShape shape{cta.hi, cta.delta, p.causal, p.window_left};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        uint64_t visible[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int packed = cta.row0 + lane_row + mt * 16 + 8 * h;
          const int token = by_group.quotient(packed);
          uint64_t bits = visible_bits(shape, token, kv0, kTileKV) & ~blocked;
          if (p.mask && packed < cta.rows) {  // a padding row has no mask bits
            const int64_t row_bit = cta.mask_bit0 + int64_t{token} * cta.kv_len;
            bits &= mask_bits<kTileKV>(p.mask, row_bit + kv0, row_bit + cta.kv_len);
          }
          visible[h] = bits >> (2 * (lane % 4));
        }
#pragma unroll
        for (int i = 0; i < kScoreTiles; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!((visible[e / 2] >> (i * 8 + e % 2)) & 1)) s[mt][i][e] = -INFINITY;
          }
        }
      }
    }
    if constexpr (kPos == PosEncoding::kAlibi) {
      // (a masked score stays -inf) The bias of column c: slope * (kv0 + c) - slope * query.
      const float col0 = static_cast<float>(kv0 + 2 * (lane % 4));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        float base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) base[h] = fmaf(slope[mt][h], col0, row_bias[mt][h]);
#pragma unroll
        for (int i = 0; i < kScoreTiles; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][i][e] += fmaf(slope[mt][e / 2], static_cast<float>(i * 8 + e % 2), base[e / 2]);
          }
        }
      }
    }
    // Without a soft cap the scale is folded into the exponent (scale > 0, so the row max of
    // raw scores is the max of scaled ones): one FFMA per score.
    if (p.cap <= 0.f) return p.scale;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int i = 0; i < kScoreTiles; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float capped = p.cap * tanh_approx(s[mt][i][e] * p.scale);
          s[mt][i][e] = s[mt][i][e] == -INFINITY ? -INFINITY : capped;
        }
      }
    }
    return 1.f;
  };
  // O's rows (mt, h) times `factor`: a warp's 8 rows of (mt, h) skip it when none of them
  // moved its max (kLazyRescale).
  auto rescale_o = [&](int mt, int h, float factor, bool moved) {
    if (!Tl::kLazyRescale || __any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        o[mt][i][2 * h] *= factor;
        o[mt][i][2 * h + 1] *= factor;
      }
    }
  };
  // Online softmax, per row; a row's four lanes (lane % 4) share its max. Reductions over
  // a lane's columns run as trees, not as serial chains of dependent instructions. A row
  // keeps its running max until a tile's max passes it by more than kMaxLag (log2 units):
  // exponentials against the stale max stay below 2^kMaxLag (fp16's P holds that), and
  // a warp none of whose rows moved skips the O rescale, most tiles past the first few.
  // Leaves P in s; O is rescaled here, or (kOverlap) by the caller from factor and moved, so
  // that this code has no branch and interleaves with the next tile's S = Q K^T.
  auto softmax = [&](Scores& s, float unit, float (&factor)[kMTiles][2],
                     bool (&moved)[kMTiles][2]) {
    const int lane = thread_index() % 32;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float part[kScoreTiles];
#pragma unroll
        for (int i = 0; i < kScoreTiles; ++i) part[i] = fmaxf(s[mt][i][2 * h], s[mt][i][2 * h + 1]);
#pragma unroll
        for (int width = kScoreTiles / 2; width > 0; width /= 2) {
#pragma unroll
          for (int i = 0; i < width; ++i) part[i] = fmaxf(part[i], part[i + width]);
        }
        float tile_max = part[0];
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        tile_max *= unit;
        // (-inf + kMaxLag is -inf: a row's first visible tile always moves it)
        const bool rises = !Tl::kLazyRescale || tile_max > m[mt][h] + kMaxLag;
        const float row_max = rises ? fmaxf(m[mt][h], tile_max) : m[mt][h];
        const float base = row_max == -INFINITY ? 0.f : row_max;  // nothing visible yet
        const float rescale = exp2_approx(m[mt][h] - base);       // 2^0 for a row that kept its max
        m[mt][h] = row_max;
#pragma unroll
        for (int i = 0; i < kScoreTiles; ++i) {
          s[mt][i][2 * h] = exp2_approx(fmaf(s[mt][i][2 * h], unit, -base));
          s[mt][i][2 * h + 1] = exp2_approx(fmaf(s[mt][i][2 * h + 1], unit, -base));
          part[i] = s[mt][i][2 * h] + s[mt][i][2 * h + 1];
        }
#pragma unroll
        for (int width = kScoreTiles / 2; width > 0; width /= 2) {
#pragma unroll
          for (int i = 0; i < width; ++i) part[i] += part[i + width];
        }
        float sum = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);  // the row's tile
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (lane % 4 == 2 * mt + h) d = d * rescale + sum;
        factor[mt][h] = rescale;
        moved[mt][h] = rises;
        if (!Tl::kOverlap) rescale_o(mt, h, rescale, rises);
      }
    }
  };
  // O += P V of the tile in `stage` (kOverlap: O first rescaled as softmax left it to): P's
  // accumulator fragments are the A operand of the next mma, 16 keys a step; each V fragment
  // read from shared memory feeds every m-tile of the warp.
  auto pv = [&](int stage, const Scores& s, const float (&factor)[kMTiles][2],
                const bool (&moved)[kMTiles][2]) {
    if (Tl::kOverlap) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        rescale_o(mt, 0, factor[mt][0], moved[mt][0]);
        rescale_o(mt, 1, factor[mt][1], moved[mt][1]);
      }
    }
    const int lane = thread_index() % 32;
    const LaneRow v = v_lane_row(lane);
    const SwizzledRows<kHeadDimVO> v_rows(v.row, v.half);
    const uint32_t v_base = mma::smem_address(sv) + stage * Tl::kVElems * 2;
#pragma unroll
    for (int kk = 0; kk < kTileKV / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = mma::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = mma::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = mma::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = mma::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < kHeadDimVO / 16; ++n2) {
        uint32_t b[4];  // dims 0-7 then 8-15 of this step (swizzle.h's v_lane_row)
        mma::ldmatrix_x4_trans(b, v_base + v_rows.at(kk * 16, n2));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma::mma_16816<T>(o[mt][2 * n2], a[mt], b[0], b[1]);
          mma::mma_16816<T>(o[mt][2 * n2 + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };

  // A warp none of whose rows can see a key of a tile skips its math: its state is what
  // every score masked would leave. Its rows are padding past the request's end (one-token
  // decode of a GQA group of 4 fills 4 of 128 rows), or under a causal mask their tokens all
  // precede the tile, or under a window they all start past it. The branch is warp-uniform;
  // the warp's keys were computed once, before the loop.
  Scores s;
  if (!Tl::kOverlap) {
    // One barrier a tile. Tile it + 1's rows are located before it, while other warps may
    // still run tile it - 1's math on the tensor cores, and copied after it, into the stage
    // tile it - 1 left (every warp is past it then); the copies stay a whole tile ahead of
    // their use. The page-table entry they are located from was loaded a tile before.
    int entry = entry_ahead(1, bounds);  // of tile it + 1
    // (the loop's test reads the tile count afresh: with no barrier between the top of a
    // tile and its end, the compiler would keep the count read after the barrier through
    // the math, and head_dim 128 m2kv64, at 255 registers, spills it)
    const volatile int* const num_tiles_now = &shared_bounds->num_tiles;
    if (kPos == PosEncoding::kRopeLlama) {
      cp_async_wait<0>();  // Q (and tile 0) have landed
      __syncthreads();
      rotate_q();  // published by the loop's first barrier
    }
    for (int it = 0; it < *num_tiles_now; ++it) {
      const TileBounds& cta = *shared_bounds;
      const TokenRows at = locate(it + 1, cta, entry);
      entry = entry_ahead(it + 2, cta);
      cp_async_wait<0>();  // tile it has landed
      __syncthreads();     // for every thread; and every warp is done with tile it - 1
      load_kv(it + 1, at, it + 1, at, true);  // (past the last tile: zeros no one reads)
      cp_async_commit();
      const int stage = stage_of(it);
      if constexpr (kFp8) {
        widen(k_dim, k_landing, it % 2, sk);
        widen(v_dim, v_landing, it % 2, sv);
        __syncthreads();
      }
      if (kPos == PosEncoding::kRopeLlama) {
        rotate_k(stage, it, cta);
        __syncthreads();
      }
      if (keys_meet_tile(warp_keys[thread_index() / 32], cta.lo + it * kTileKV, kTileKV)) {
        qk(stage, s);
        const float unit = mask_scores(it, cta, s);
        float factor[kMTiles][2];
        bool moved[kMTiles][2];
        softmax(s, unit, factor, moved);
        pv(stage, s, factor, moved);
      }
    }
  } else {
    // Software-pipelined (FlashAttention-3's intra-warp overlap, on mma.sync): while a tile's
    // softmax runs on the ALUs and the special-function unit, the tensor cores compute the
    // next tile's S = Q K^T, issued from the same branch-free code (the compiler interleaves
    // them). So K runs a tile ahead of V: tile it starts with K of it + 1 and V of it landed,
    // and loads K of it + 2 and V of it + 1 into the stages tile it - 1 left; one barrier a
    // tile, and the shared memory of two stages.
    // Unrolled by two, so that the two tiles' scores swap roles without register copies,
    // as do the two steps' Lookaheads.
    // What a step leaves the next, made at its end so that only the copies are left between
    // the barrier and the math: the rows of K of tile it + 3, those of V of tile it + 2 (the
    // ones located for its K a step before), and the page-table entry of tile it + 4's token.
    struct Lookahead {
      TokenRows k, v;
      int entry;
    };
    const TokenRows rows1 = locate(1, bounds, entry_ahead(1, bounds));
    Lookahead ahead{locate(2, bounds, entry_ahead(2, bounds)), rows1, entry_ahead(3, bounds)},
        later;
    load_kv(1, rows1, 0, first_rows, true);
    cp_async_commit();
    cp_async_wait<1>();  // K of tile 0 has landed
    __syncthreads();
    if constexpr (kFp8) {
      widen(k_dim, k_landing, 0, sk);
      __syncthreads();
    }
    if (kPos == PosEncoding::kRopeLlama) {
      rotate_q();
      rotate_k(0, 0, bounds);
      __syncthreads();
    }
    Scores s_other;
    if (num_tiles > 0 && keys_meet_tile(warp_keys[thread_index() / 32], lo, kTileKV)) qk(0, s);
    // Tile it: its scores in `cur` (when the warp meets it), the next tile's computed into
    // `nxt`; K of it + 2 and V of it + 1 copied from the rows of the previous step's Lookahead
    // `in`, the next step's left in `out`.
    auto step = [&](int it, Scores& cur, Scores& nxt, const Lookahead& in, Lookahead& out) {
      const TileBounds& cta = *shared_bounds;
      cp_async_wait<0>();  // K of it + 1 and V of it have landed
      __syncthreads();     // for every thread; and every warp is done with tile it - 1
      load_kv(it + 2, in.k, it + 1, in.v, true);
      cp_async_commit();
      if constexpr (kFp8) {  // K of it + 1 (its slot is the one K of it + 2 did not take)
        widen(k_dim, k_landing, (it + 1) % 2, sk);
        widen(v_dim, v_landing, it % 2, sv);
        __syncthreads();
      }
      const int stage = stage_of(it), next_stage = stage_of(it + 1);
      if (kPos == PosEncoding::kRopeLlama) {
        rotate_k(next_stage, it + 1, cta);  // (past the last tile: zeros, rotated to zeros)
        __syncthreads();
      }
      const int kv0 = cta.lo + it * kTileKV;
      const KeyRange keys = warp_keys[thread_index() / 32];
      const bool next = it + 1 < cta.num_tiles && keys_meet_tile(keys, kv0 + kTileKV, kTileKV);
      if (keys_meet_tile(keys, kv0, kTileKV)) {
        const float unit = mask_scores(it, cta, cur);
        float factor[kMTiles][2];
        bool moved[kMTiles][2];
        // (softmax and pv written twice: in this copy no branch separates the next tile's
        // qk from the softmax, so the compiler can interleave them)
        if (next) {
          qk(next_stage, nxt);
          softmax(cur, unit, factor, moved);
          pv(stage, cur, factor, moved);
        } else {
          softmax(cur, unit, factor, moved);
          pv(stage, cur, factor, moved);
        }
      } else if (next) {
        qk(next_stage, nxt);
      }
      out.k = locate(it + 3, cta, in.entry);
      out.v = in.k;
      out.entry = entry_ahead(it + 4, cta);
    };
    for (int it = 0; it < shared_bounds->num_tiles; it += 2) {
      step(it, s, s_other, ahead, later);
      if (it + 1 >= shared_bounds->num_tiles) break;
      step(it + 1, s_other, s, later, ahead);
    }
  }

  cp_async_wait<0>();

  const TileBounds& cta = *shared_bounds;
  const unsigned tid = thread_index();
  const int lane = tid % 32;
  const int tile_row0 = cta.row0 + tid / 32 * Tl::kWarpRows + lane / 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = __shfl_sync(0xffffffffu, d, (lane & ~3) | (2 * mt + h));
      const int packed = tile_row0 + mt * 16 + 8 * h;
      if (packed >= cta.rows) continue;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      // -inf when no key was visible; NaN when a visible score was NaN (so is the sum)
      const float lse = sum == 0.f ? -INFINITY : m[mt][h] + log2f(sum);
      const int64_t t = p.group_div.quotient(packed), head = kv_head * group + (packed - t * group);
      const int quad = lane % 4, dim = 2 * quad;
      if (cta.tmp_base < 0) {
        // A lane holds dims dim, dim + 1 of each n8 tile. Lanes q and q ^ 1 of the row swap a
        // packed pair, so that each stores four consecutive dims (even lanes of tile i, odd
        // lanes of tile i + 1): the row's four lanes write one whole 32-byte sector of the two
        // tiles (where the row starts on a 32-byte boundary; out is 16-byte aligned, checked
        // on the host), where a pair's store wrote half of one. The row's lanes alone
        // shuffle, as a row past the end skips them all.
        T* dst = p.out + (cta.q_start + t) * p.out_row_stride + head * p.out_head_stride +
                 (quad & 1) * 8 + (quad >> 1) * 4;
        const unsigned row_lanes = 0xfu << (lane & ~3);
        static_assert(kDimTiles % 2 == 0, "output rows of whole 16-dim pairs of tiles");
#pragma unroll
        for (int i = 0; i < kDimTiles; i += 2) {
          const uint32_t even = mma::pack2<T>(o[mt][i][2 * h] * inv, o[mt][i][2 * h + 1] * inv);
          const uint32_t odd =
              mma::pack2<T>(o[mt][i + 1][2 * h] * inv, o[mt][i + 1][2 * h + 1] * inv);
          const uint32_t got = __shfl_xor_sync(row_lanes, quad & 1 ? even : odd, 1);
          const uint2 dims = quad & 1 ? uint2{got, odd} : uint2{even, got};
          *reinterpret_cast<uint2*>(dst + i * 8) = dims;
        }
        if (p.lse && quad == 0) p.lse[(cta.q_start + t) * p.num_qo_heads + head] = lse;
      } else {
        const int64_t row = (cta.tmp_base + t * cta.chunks + cta.chunk) * p.num_qo_heads + head;
        float* dst = p.tmp_v + row * kHeadDimVO + dim;
#pragma unroll
        for (int i = 0; i < kDimTiles; ++i) {
          *reinterpret_cast<float2*>(dst + i * 8) =
              make_float2(o[mt][i][2 * h] * inv, o[mt][i][2 * h + 1] * inv);
        }
        if (lane % 4 == 0) p.tmp_lse[row] = lse;
      }
    }
  }
}

// Raising the kernel's dynamic shared memory limit happens once per device and never again,
// so launches captured in a CUDA graph (after a warm-up run) make no attribute calls.
template <typename T, typename TKV, typename Tl, PosEncoding kPos>
cudaError_t PreparePrefillKernel() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> configured[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxDevices && configured[device].load()) return cudaSuccess;
  err = cudaFuncSetAttribute(PrefillKernel<T, TKV, Tl, kPos>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Tl::kSharedBytes));
  if (err == cudaSuccess && device < kMaxDevices) configured[device].store(true);
  return err;
}

// CTAs of PrefillKernel resident per SM (the scheduler's unit of fill).
template <typename T, typename TKV, typename Tl, PosEncoding kPos>
cudaError_t PrefillBlocksPerSM(int* blocks) {
  cudaError_t err = PreparePrefillKernel<T, TKV, Tl, kPos>();
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, PrefillKernel<T, TKV, Tl, kPos>,
                                                       Tl::kThreads, Tl::kSharedBytes);
}

// Launches the prefill kernel over `grid_work` work items, then (when merge_positions > 0)
// the merge of split requests' tmp rows into the output. `pdl`: both launch with
// programmatic dependent launch (see pdl.cuh).
template <typename T, typename TKV, typename Tl, PosEncoding kPos>
cudaError_t Prefill(const PrefillParams<T, TKV>& p, const WorkList& work, int64_t grid_work,
                    int64_t num_kv_heads, const cascade::MergeSchedule& merge,
                    int64_t merge_positions, bool pdl, cudaStream_t stream) {
  if (grid_work == 0 || num_kv_heads == 0) return cudaSuccess;
  cudaError_t err = PreparePrefillKernel<T, TKV, Tl, kPos>();
  if (err != cudaSuccess) return err;
  err = launch_kernel(PrefillKernel<T, TKV, Tl, kPos>,
                      dim3(static_cast<unsigned>(grid_work), static_cast<unsigned>(num_kv_heads)),
                      dim3(Tl::kThreads), Tl::kSharedBytes, stream, pdl, p, work);
  if (err != cudaSuccess || merge_positions == 0) return err;
  const int64_t h = p.num_qo_heads;
  return cascade::MergeStates<float, T>(
      {p.out, p.lse, p.out_row_stride, p.out_head_stride, h, 1},
      {p.tmp_v, p.tmp_lse, h * Tl::kHeadDimVO, Tl::kHeadDimVO, h, 1}, merge, merge_positions, h,
      Tl::kHeadDimVO, stream, pdl);
}

}  // namespace prefill
}  // namespace flashinfer
