// Decode attention: one query token per request against its KV cache (contiguous or
// paged), with split-KV so that a few long requests still fill the GPU.
// Framework-agnostic: raw pointers, strides and a cudaStream_t.
//
// Work decomposition. A work item is (request, chunk c of n, destination); the grid is
// (work items, kv heads). The host scheduler (flashinfer/decode_schedule.py) decides how many
// chunks of `chunk_tokens` tokens each request gets; the kernel reads the request's KV length
// from the page table on the device (indptr, last_page_len) when it runs, and chunk c covers
// [begin + c * chunk_tokens, ...) up to the next chunk, the last one up to the end of the
// request. So a CUDA-graph replay after the page-table buffers were rewritten attends to the
// new lengths, whatever the schedule assumed (a longer request only makes its last chunk
// longer). A chunk writes a partial state (float32 v, base-2 LSE) to a temporary row, and
// MergeChunksKernel merges a request's chunks; a request with one chunk writes its output
// directly.
//
// Tiling inside a CTA. Threads are (tx, ty, tz): tx owns 8 consecutive dims of head_dim
// (one 16-byte vector; kBdx = head_dim / 8 lanes span a row), ty picks the thread's query
// heads within the GQA group (two for an even group, so each K/V vector read from shared
// memory and widened to float serves two heads; all of a KV head's query heads share each
// K/V load), tz splits the tile's tokens. Decode reads each K/V byte once, so the kernel is
// a stream from HBM and its speed is the bytes it keeps in flight: KV arrives in tiles of
// kTileTokens tokens (4096 / head_dim: 8 KiB of K and 8 KiB of V at 16 bits) through a
// kStages-deep cp.async ring, so two tiles are in flight while the CTA folds the third (four
// CTAs of 128 threads fit an H100 SM: up to 128 KiB in flight per SM). The page table is read
// once per token per tile, by one thread, one ring round ahead of its use (so the load's
// latency hides behind a tile's compute); the token's K and V offsets go to shared memory,
// where the copies of every 16-byte chunk find them. A token whose page id (or position in
// the page table) is out of range gets offset -1: its rows are zero-filled, never read, and
// it is not scored. Each (ty, tz) group folds its tokens kBatch at a time: kBatch independent
// q.k dot products and shuffle reductions across the row's kBdx lanes (instruction-level
// parallelism instead of one token's latency chain), then one online-softmax update (running
// max, sum and weighted V, in log2 units). At the end the tz groups' states merge through
// shared memory, in order.
//
// An fp8 KV cache (e4m3 or e5m2; q and the output stay 16-bit): tiles hold twice the tokens
// (the same bytes), rows land as fp8 and widen to float where they are read, two codes an
// instruction (cvt.f16x2 on sm_89 and later). The caller folds its k_scale into the score
// scale and its v_scale into the output, as the reference does.
//
// Position encodings (pos_encoding.h), one kernel build each. RoPE: the query is rotated in
// registers at the request's last position (length - 1), each K tile in shared memory after it
// lands (attention_rope.cuh), every token at its index in the request, between the tile's
// barrier and one more, so the dot products read rotated rows. ALiBi: a token's score gains
// its query head's slope times the token's index in the request (the query's index is 0).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flashinfer/attention_rope.cuh"
#include "flashinfer/cascade.cuh"
#include "flashinfer/fast_math.cuh"
#include "flashinfer/fp8.cuh"
#include "flashinfer/kv_table.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/pos_encoding.h"
#include "flashinfer/ptx.cuh"
#include "flashinfer/schedule.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace decode {

constexpr int kVec = 8;  // dims of a row a thread owns: one 16-byte vector of q (16-bit)

// The schedule. Batch mode: plan points at the packed schedule (schedule.cuh) on the device,
// its work columns request, chunk, num_chunks and tmp_row (-1: write the output directly).
// Single mode (plan null): request 0 of length `single_len` in gridDim.x chunks of
// `chunk_tokens`, chunk c = blockIdx.x written to tmp row c when split.
using Schedule = PackedSchedule<0, 0, 1, -1>;

struct WorkList {
  const int32_t* plan;
  int64_t capacity;
  int64_t chunk_tokens;  // single mode: tokens per chunk of a split request
  int64_t window_left;   // >= 0: attend to the last window_left + 1 tokens only
  int64_t single_len;
  bool single_split;
};

// A work item as the plan gives it: the request's chunk `chunk` of `chunks`, each
// `chunk_tokens` long (the last to the request's end).
struct PlannedItem {
  int64_t request, chunk, chunks, tmp_row, chunk_tokens;
};

// Item i of the plan: reads the plan's words only (not the page table), so that it may run
// before pdl_wait(): the schedule is written by plan()'s host copies, never by a kernel.
__device__ __forceinline__ bool planned_item(const WorkList& w, int64_t i, PlannedItem* item) {
  if (!w.plan) {
    *item = {0, i, gridDim.x, w.single_split ? i : -1, w.chunk_tokens};
    return true;
  }
  int32_t word[Schedule::kColumns];
  int tokens;
  const bool valid = Schedule::item(w.plan, w.capacity, i, word, &tokens);
  *item = {word[0], word[1], word[2], word[3], tokens};
  return valid;
}

struct WorkItem {
  int64_t request, start, end, tmp_row, length;  // length: the request's KV length
};

// The item's KV range, from its request's length (read from the page table in batch mode).
__device__ __forceinline__ WorkItem locate(const WorkList& w, const PageTable& pt,
                                           const PlannedItem& planned) {
  const int64_t length = w.plan ? request_length(pt, planned.request) : w.single_len;
  const int64_t begin = w.window_left >= 0 ? max(int64_t{0}, length - w.window_left - 1) : 0;
  const int64_t start = min(begin + planned.chunk * planned.chunk_tokens, length);
  const int64_t end =
      planned.chunk + 1 >= planned.chunks ? length : min(start + planned.chunk_tokens, length);
  return {planned.request, start, end, planned.tmp_row, length};
}

struct Scores {
  float scale;  // applied to q.k: sm_scale * log2e, or sm_scale / cap with a soft cap
  float cap;    // > 0: score = cap * log2e * tanh(scaled q.k), else 0
};

// T: q and the output; TKV: the KV cache (T, or an fp8 type).
template <typename T, typename TKV>
struct DecodeParams {
  const T* q;
  int64_t q_batch_stride, q_head_stride;
  KVCache<TKV> k, v;
  PageTable pages;
  T* out;
  int64_t out_batch_stride, out_head_stride;
  float* lse;      // [batch, qo_heads] base-2 LSE, may be null
  float* tmp_v;    // [tmp rows, qo_heads, head_dim]
  float* tmp_lse;  // [tmp rows, qo_heads]
  int64_t num_qo_heads;
  Scores scores;
  Rope rope;                  // read only by the RoPE kernels
  const float* alibi_slopes;  // [num_qo_heads], log2 units; read by the ALiBi kernels
};

// kKVBytes: bytes of a KV element (2, or 1 for fp8).
template <int kHeadDim, int kKVBytes>
struct Tiling {
  static constexpr int kBdx = kHeadDim / kVec;
  static constexpr int kTileTokens = 8192 / (kHeadDim * kKVBytes);  // 8 KiB of K
  static constexpr int kStages = 3;  // tiles in shared memory: two in flight, one being folded
  static constexpr int kStageBytes = 2 * kTileTokens * kHeadDim * kKVBytes;  // K and V tiles
  static constexpr int kCopyElems = 16 / kKVBytes;  // KV elements of one 16-byte cp.async
  static constexpr int kRowCopies = kHeadDim / kCopyElems;
  // after the stages: the tokens' offsets, one slot per tile, one slot more than stages
  // (a slot is refilled one ring round ahead, while the tile before it is still folded)
  static constexpr int kOffsetSlots = kStages + 1;
  static constexpr int kOffsetBytes = kOffsetSlots * kTileTokens * 16;
  static constexpr int kBatch = 4;  // tokens folded into the online softmax at once
};

// Where a token's K and V rows (of this CTA's KV head) start, in elements; k = -1: the token
// is not scored (past the chunk's end, or an out-of-range page id or page-table position).
struct TokenOffsets {
  int64_t k, v;
};

// A token's page-table entry, fetched before its offsets are needed: the caller issues the
// load, does other work, and only then inspects `page` (in offsets_of).
struct PendingToken {
  int64_t page, slot;
};

__device__ __forceinline__ PendingToken fetch_token(const PageTable& pt, int64_t page_base,
                                                    int64_t token, int64_t end) {
  if (token >= end) return {-1, 0};
  if (!pt.indices) return {0, token};
  // 32-bit division: KV lengths and page sizes are < 2^31 (checked on the host)
  const uint32_t t = static_cast<uint32_t>(token), size = static_cast<uint32_t>(pt.page_size);
  const int64_t at = page_base + t / size;
  const int64_t page = at >= 0 && at < pt.num_indices ? pt.indices[at] : -1;
  return {page, t % size};
}

template <typename T, typename TKV>
__device__ __forceinline__ TokenOffsets offsets_of(const DecodeParams<T, TKV>& p, PendingToken x,
                                                   int64_t kv_head) {
  if (x.page < 0 || x.page >= p.pages.num_pages) return {-1, -1};
  return {x.page * p.k.page_stride + x.slot * p.k.slot_stride + kv_head * p.k.head_stride,
          x.page * p.v.page_stride + x.slot * p.v.slot_stride + kv_head * p.v.head_stride};
}

// Lanes [base, base + kBdx) of this thread's warp: one row's shuffle partners. A partial last
// warp (an odd GQA group) has only whole rows active, so the mask never names an idle lane.
template <int kBdx>
__device__ __forceinline__ unsigned row_mask() {
  if constexpr (kBdx >= 32) {
    return 0xffffffffu;  // the shift below would be 1u << 32 here, undefined
  } else {
    const unsigned lane = threadIdx.x + kBdx * (threadIdx.y + blockDim.y * threadIdx.z);
    return ((1u << kBdx) - 1u) << ((lane % 32) & ~(kBdx - 1u));
  }
}

// Two 16-bit elements of a 32-bit word as floats (element 0 in the low half). A bf16 is the
// high half of a float: one shift or mask each.
__device__ __forceinline__ float2 widen(uint32_t w, __nv_bfloat16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 widen(uint32_t w, __half) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}

// The kVec elements at `src` (shared memory, aligned to their kVec-element size) as floats.
template <typename T>
__device__ __forceinline__ void load_floats(const T* src, float* f) {
  if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = widen(words[i], T{});
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  } else {
    static_assert(sizeof(T) == 1, "KV elements are 16-bit or fp8");
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    const uint32_t words[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 lo = fp8x2_to_float2<T>(words[i] & 0xffffu),
                   hi = fp8x2_to_float2<T>(words[i] >> 16);
      f[4 * i] = lo.x;
      f[4 * i + 1] = lo.y;
      f[4 * i + 2] = hi.x;
      f[4 * i + 3] = hi.y;
    }
  }
}

// acc[0..7] += w * (lo, hi)
__device__ __forceinline__ void add_scaled(float* acc, float4 lo, float4 hi, float w) {
  acc[0] += w * lo.x;
  acc[1] += w * lo.y;
  acc[2] += w * lo.z;
  acc[3] += w * lo.w;
  acc[4] += w * hi.x;
  acc[5] += w * hi.y;
  acc[6] += w * hi.z;
  acc[7] += w * hi.w;
}

// blockDim = (kBdx, group / kHeads, bdz) with at most kMaxThreads threads; grid = (work
// items, kv heads). Each thread folds kHeads query heads (ty * kHeads + h of the group) over
// the same K/V vectors, so a vector's shared-memory read and conversion to float serve
// kHeads heads. Dynamic shared memory: SharedBytes. Blocks of up to 256 threads get up to
// 128 registers a thread, larger ones 64. kPos: the position encoding (see the top).
template <typename T, typename TKV, int kHeadDim, int kHeads, int kMaxThreads, PosEncoding kPos>
__global__ void __launch_bounds__(kMaxThreads, kMaxThreads <= 256 ? 2 : 1)
    DecodeKernel(DecodeParams<T, TKV> p, WorkList work) {
  // RoPE rotates K rows in shared memory, in their own type: fp8 would round them
  static_assert(kPos != PosEncoding::kRopeLlama || sizeof(TKV) == 2, "RoPE needs a 16-bit cache");
  using Tile = Tiling<kHeadDim, sizeof(TKV)>;
  constexpr int kBdx = Tile::kBdx, kTile = Tile::kTileTokens, kStages = Tile::kStages;
  constexpr int kSlots = Tile::kOffsetSlots, kBatch = Tile::kBatch;
  uint8_t* const smem = dynamic_shared();
  PlannedItem planned;  // loads under the previous kernel's tail
  const bool valid = planned_item(work, blockIdx.x, &planned);
  pdl_wait();  // everything below may read what the previous kernel wrote
  // The next kernel (the merge) may launch into free SMs now and load its schedule; its own
  // pdl_wait() still waits for this whole grid. Nothing is held back by it: every CTA of this
  // grid has started once all of them have come here.
  pdl_launch_dependents();
  if (!valid) return;
  const WorkItem item = locate(work, p.pages, planned);
  const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
  const int rows = blockDim.y, bdz = blockDim.z, group = rows * kHeads;
  const int tid = tx + kBdx * (ty + rows * tz);
  const int threads = kBdx * rows * bdz;  // >= kTile (see TokenLanes)
  const int64_t kv_head = blockIdx.y;
  const int64_t head0 = kv_head * group + ty * kHeads;  // this thread's first query head
  const int64_t page_base = p.pages.indices ? p.pages.indptr[item.request] : 0;

  float q[kHeads][kVec];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const T* const row = p.q + item.request * p.q_batch_stride + (head0 + h) * p.q_head_stride;
    const Vec<T, kVec> qv = *reinterpret_cast<const Vec<T, kVec>*>(row + tx * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) q[h][j] = to_float(qv.data[j]) * p.scores.scale;
    if constexpr (kPos == PosEncoding::kRopeLlama) {
      // lane tx ^ half holds the partner dims (the other half of the row): read them too
      constexpr int kHalf = kBdx / 2;
      const Vec<T, kVec> pv = *reinterpret_cast<const Vec<T, kVec>*>(row + (tx ^ kHalf) * kVec);
      float freq[kVec];
      chunk_frequencies<kHeadDim>(p.rope, tx % kHalf, freq);
      const float pos = static_cast<float>(item.length - 1), sign = tx < kHalf ? -1.f : 1.f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float s, c;
        sincos_approx(pos * freq[j], &s, &c);
        q[h][j] = q[h][j] * c + sign * to_float(pv.data[j]) * p.scores.scale * s;
      }
    }
  }

  // ALiBi: the slope of each of this thread's heads (log2 units, as the scores)
  float slope[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
    slope[h] = kPos == PosEncoding::kAlibi ? p.alibi_slopes[head0 + h] : 0.f;

  // Tile j: its K rows at stage j % kStages, its V rows right after; its tokens' offsets in
  // slot j % kSlots. Thread tid < kTile owns token tid of every tile's page-table lookup.
  TKV* const stages = reinterpret_cast<TKV*>(smem);
  TokenOffsets* const offsets = reinterpret_cast<TokenOffsets*>(smem + kStages * Tile::kStageBytes);
  auto k_tile = [&](int j) { return stages + (j % kStages) * 2 * kTile * kHeadDim; };
  auto slot = [&](int j) { return offsets + (j % kSlots) * kTile; };
  auto token_of = [&](int j) { return item.start + static_cast<int64_t>(j) * kTile + tid; };
  auto issue = [&](int j) {
    TKV* const kt = k_tile(j);
    TKV* const vt = kt + kTile * kHeadDim;
    const TokenOffsets* const off = slot(j);
    for (int c = tid; c < kTile * Tile::kRowCopies; c += threads) {
      const int token = c / Tile::kRowCopies, col = (c % Tile::kRowCopies) * Tile::kCopyElems;
      const TokenOffsets at = off[token];
      const bool valid = at.k >= 0;  // not scored: zero-fill from a valid dummy address
      cp_async_16(kt + token * kHeadDim + col, p.k.data + (valid ? at.k + col : 0), valid);
      cp_async_16(vt + token * kHeadDim + col, p.v.data + (valid ? at.v + col : 0), valid);
    }
  };

  const int tiles = static_cast<int>((item.end - item.start + kTile - 1) / kTile);
  if (tid < kTile) {
#pragma unroll
    for (int j = 0; j < kStages; ++j) {
      slot(j)[tid] = offsets_of(p, fetch_token(p.pages, page_base, token_of(j), item.end), kv_head);
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < tiles) issue(j);
    cp_async_commit();  // one group per tile, empty past the end: the waits count tiles
  }

  float m[kHeads], d[kHeads], o[kHeads][kVec];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    d[h] = 0.f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o[h][j] = 0.f;
  }
  const int per_lane = kTile / bdz;  // tokens of a tile each tz group folds: kBatch * n
  const unsigned mask = row_mask<kBdx>();
  for (int i = 0; i < tiles; ++i) {
    PendingToken ahead{-1, 0};
    if (tid < kTile) ahead = fetch_token(p.pages, page_base, token_of(i + kStages), item.end);
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i has landed; every thread is done with tile i - 1's stage
    if (i + kStages - 1 < tiles) issue(i + kStages - 1);
    cp_async_commit();
    if constexpr (kPos == PosEncoding::kRopeLlama) {
      const int64_t first = item.start + static_cast<int64_t>(i) * kTile;
      rotate_rows<kHeadDim>(k_tile(i), p.rope, kTile, tid, threads,
                            [&](int r) { return static_cast<float>(first + r); });
      __syncthreads();  // the rotated rows are published
    }

    // this thread's rows of tile i: tokens tz, tz + bdz, ... (per_lane of them)
    const int64_t first_token = item.start + static_cast<int64_t>(i) * kTile + tz;
    const TKV* const kt = k_tile(i) + tz * kHeadDim + tx * kVec;
    const TKV* const vt = kt + kTile * kHeadDim;
    const TokenOffsets* const off = slot(i) + tz;
    for (int u0 = 0; u0 < per_lane; u0 += kBatch) {
      float s[kHeads][kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        float k[kVec];
        load_floats(kt + (u0 + b) * bdz * kHeadDim, k);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          s[h][b] = 0.f;
#pragma unroll
          for (int j = 0; j < kVec; ++j) s[h][b] += q[h][j] * k[j];
        }
      }
#pragma unroll
      for (int offset = kBdx / 2; offset > 0; offset >>= 1) {
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
#pragma unroll
          for (int b = 0; b < kBatch; ++b) s[h][b] += __shfl_xor_sync(mask, s[h][b], offset);
        }
      }
      float w[kHeads][kBatch];
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float m_new = m[h];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          float x = p.scores.cap > 0.f ? p.scores.cap * tanh_approx(s[h][b]) : s[h][b];
          if constexpr (kPos == PosEncoding::kAlibi) {
            x = fmaf(slope[h], static_cast<float>(first_token + (u0 + b) * bdz), x);
          }
          s[h][b] = off[(u0 + b) * bdz].k >= 0 ? x : -INFINITY;
          m_new = fmaxf(m_new, s[h][b]);
        }
        // nothing scored yet: every weight (and the rescale of the empty state) is 0
        const float base = m_new == -INFINITY ? 0.f : m_new;
        const float rescale = exp2_approx(m[h] - base);
        d[h] *= rescale;
#pragma unroll
        for (int j = 0; j < kVec; ++j) o[h][j] *= rescale;
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          w[h][b] = exp2_approx(s[h][b] - base);
          d[h] += w[h][b];
        }
        m[h] = m_new;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        float v[kVec];
        load_floats(vt + (u0 + b) * bdz * kHeadDim, v);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) o[h][j] += w[h][b] * v[j];
        }
      }
    }
    if (tid < kTile) slot(i + kStages)[tid] = offsets_of(p, ahead, kv_head);
  }
  cp_async_wait<0>();  // only empty groups are left
  __syncthreads();     // every thread is done with the stages: the merge reuses them

  // Merge the bdz partial states of each query head, in tz order. Each head's 8 dims of a
  // thread go to shared memory as two float4 halves, lane-contiguous (no bank conflicts).
  if (bdz > 1) {
    float4* const merge_o = reinterpret_cast<float4*>(smem);  // [bdz * group][2][kBdx]
    float2* const merge_md = reinterpret_cast<float2*>(merge_o + bdz * group * 2 * kBdx);
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const int me = tz * group + ty * kHeads + h;
      merge_o[2 * me * kBdx + tx] = make_float4(o[h][0], o[h][1], o[h][2], o[h][3]);
      merge_o[(2 * me + 1) * kBdx + tx] = make_float4(o[h][4], o[h][5], o[h][6], o[h][7]);
      if (tx == 0) merge_md[me] = make_float2(m[h], d[h]);
    }
    __syncthreads();
    if (tz != 0) return;
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const int mine = ty * kHeads + h;
      m[h] = -INFINITY;
      for (int z = 0; z < bdz; ++z) m[h] = fmaxf(m[h], merge_md[z * group + mine].x);
      d[h] = 0.f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[h][j] = 0.f;
      for (int z = 0; z < bdz; ++z) {
        const int zs = z * group + mine;
        const float2 md = merge_md[zs];
        // A part that scored nothing has m = -inf and weighs 0; one whose scores were all NaN
        // also has m = -inf (fmaxf skips NaN), and its NaN d and o survive the 0 weight.
        const float w = md.x == -INFINITY ? 0.f : exp2f(md.x - m[h]);
        d[h] += md.y * w;
        add_scaled(o[h], merge_o[2 * zs * kBdx + tx], merge_o[(2 * zs + 1) * kBdx + tx], w);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const int64_t qo_head = head0 + h;
    const float inv = d[h] > 0.f ? 1.f / d[h] : 0.f;
    // -inf when no key was scored; NaN when a score was NaN (so is d)
    const float lse = d[h] == 0.f ? -INFINITY : m[h] + log2f(d[h]);
    if (item.tmp_row < 0) {
      Vec<T, kVec> ov;
#pragma unroll
      for (int j = 0; j < kVec; ++j) ov.data[j] = from_float<T>(o[h][j] * inv);
      *reinterpret_cast<Vec<T, kVec>*>(p.out + item.request * p.out_batch_stride +
                                       qo_head * p.out_head_stride + tx * kVec) = ov;
      if (p.lse && tx == 0) p.lse[item.request * p.num_qo_heads + qo_head] = lse;
    } else {
      float4* const dst = reinterpret_cast<float4*>(
          p.tmp_v + (item.tmp_row * p.num_qo_heads + qo_head) * kHeadDim + tx * kVec);
      dst[0] = make_float4(o[h][0] * inv, o[h][1] * inv, o[h][2] * inv, o[h][3] * inv);
      dst[1] = make_float4(o[h][4] * inv, o[h][5] * inv, o[h][6] * inv, o[h][7] * inv);
      if (tx == 0) p.tmp_lse[item.tmp_row * p.num_qo_heads + qo_head] = lse;
    }
  }
}

// Merges each split request's chunk states (tmp rows) into its output row (the formula of
// cascade.cuh). grid (positions, qo heads), kMergeThreads threads: thread (tx, row) owns 8
// dims of head_dim (tx) and every kRows-th state (row). The states' maximum LSE comes first
// (a block reduction), so every state's weight is known up front and a row's loads do not
// wait on each other (no running rescale, no serial chain over the states); the rows' partial
// sums then add up in shared memory, in row order (deterministic).
constexpr int kMergeThreads = 128;

template <typename T, typename TKV, int kHeadDim>
__global__ void __launch_bounds__(kMergeThreads)
    MergeChunksKernel(DecodeParams<T, TKV> p, cascade::MergeSchedule schedule) {
  constexpr int kBdx = kHeadDim / kVec, kRows = kMergeThreads / kBdx;
  __shared__ float4 part_o[kRows][2][kBdx];
  __shared__ float part_w[kRows];
  // The schedule is the plan's (host copies only: schedule.cuh), so it loads before the wait
  // for the decode kernel whose states this reads; a position past the count (a CUDA graph's
  // grid) reads words within the capacity.
  const int64_t position = blockIdx.x, head = blockIdx.y, heads = p.num_qo_heads;
  const bool past = schedule.count_on_device && position >= *schedule.count_on_device;
  const int64_t first =
      schedule.indptr ? schedule.indptr[position] : position * schedule.per_position;
  const int64_t last =
      schedule.indptr ? schedule.indptr[position + 1] : first + schedule.per_position;
  const int64_t out_row = schedule.out_rows ? schedule.out_rows[position] : position;
  pdl_wait();
  if (past) return;
  const int tx = threadIdx.x % kBdx, row = threadIdx.x / kBdx;

  float max_s = -INFINITY;
  for (int64_t i = first + threadIdx.x; i < last; i += kMergeThreads) {
    max_s = fmaxf(max_s, p.tmp_lse[i * heads + head]);
  }
  max_s = block_reduce<kMergeThreads / 32>(max_s, Max(), -INFINITY);
  // An empty chunk (s = -inf, v = 0) weighs 0, so merging only such chunks gives v = 0 and
  // s = -inf; a NaN chunk (fmaxf skips its s) weighs NaN and makes v and s NaN.
  float weight = 0.f, acc[kVec] = {};
#pragma unroll 4
  for (int64_t i = first + row; i < last; i += kRows) {
    const float s = p.tmp_lse[i * heads + head];
    const float w = s == -INFINITY ? 0.f : exp2f(s - max_s);
    const float4* const src =
        reinterpret_cast<const float4*>(p.tmp_v + (i * heads + head) * kHeadDim + tx * kVec);
    weight += w;
    add_scaled(acc, src[0], src[1], w);
  }
  part_o[row][0][tx] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  part_o[row][1][tx] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  if (tx == 0) part_w[row] = weight;
  __syncthreads();
  if (row != 0) return;
  weight = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
  for (int r = 0; r < kRows; ++r) {
    weight += part_w[r];
    add_scaled(acc, part_o[r][0][tx], part_o[r][1][tx], 1.f);
  }
  const float inv = weight > 0.f ? 1.f / weight : 0.f;
  Vec<T, kVec> ov;
#pragma unroll
  for (int j = 0; j < kVec; ++j) ov.data[j] = from_float<T>(acc[j] * inv);
  *reinterpret_cast<Vec<T, kVec>*>(p.out + out_row * p.out_batch_stride + head * p.out_head_stride +
                                   tx * kVec) = ov;
  if (p.lse && tx == 0) {
    p.lse[out_row * heads + head] = weight == 0.f ? -INFINITY : max_s + log2f(weight);
  }
}

// Threads along tokens for `rows` thread rows of kBdx lanes: a power of two dividing the tile,
// doubled while the block has fewer than 128 threads or a partial warp, and never past 1024
// threads (an odd GQA group may then end in a partial warp: see row_mask). Doubling stops by
// bdz = 1024 / head_dim (the block then has 128 * rows threads, whole warps), so each tz
// group folds a multiple of kBatch tokens of a tile, and the block has at least kTileTokens
// threads (one page-table lookup per token; 128 at most, fp8 at head_dim 64).
template <typename Tile>
inline int TokenLanes(int rows) {
  int bdz = 1;
  const int row = Tile::kBdx * rows;
  while (bdz < Tile::kTileTokens && row * bdz * 2 <= 1024 &&
         (row * bdz < 128 || (row * bdz) % 32 != 0)) {
    bdz *= 2;
  }
  return bdz;
}

template <int kHeadDim, typename Tile>
inline size_t SharedBytes(int group, int bdz) {
  const size_t merge =
      bdz > 1 ? static_cast<size_t>(bdz) * group * (kHeadDim * sizeof(float) + sizeof(float2)) : 0;
  const size_t pipeline =
      static_cast<size_t>(Tile::kStages) * Tile::kStageBytes + Tile::kOffsetBytes;
  return merge > pipeline ? merge : pipeline;
}

template <typename T, typename TKV>
using DecodeKernelFn = void (*)(DecodeParams<T, TKV>, WorkList);

// Raising a kernel's dynamic shared memory limit is done once per size and device and never
// again at that size, so launches captured in a CUDA graph (after a warm-up run) make no
// attribute calls. The limit only rises, under a lock: two host threads raising it to
// different sizes at once could otherwise leave the smaller set and the larger recorded.
template <auto kKernel>
cudaError_t RaiseSharedLimit(int bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> configured[kMaxDevices] = {};  // bytes set, per device
  static std::mutex raising;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool tracked = device < kMaxDevices;
  if (tracked && bytes <= configured[device].load()) return cudaSuccess;
  std::lock_guard<std::mutex> guard(raising);
  if (tracked && bytes <= configured[device].load()) return cudaSuccess;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && tracked) configured[device].store(bytes);
  return err;
}

constexpr int kSmallBlock = 256;  // the most threads of the 128-register kernels

// The kernel and launch shape for a group size: two query heads a thread for an even group
// whose block stays small (every even group up to 32 at head_dim 128), else one.
template <typename T, typename TKV, int kHeadDim, PosEncoding kPos>
cudaError_t PrepareDecodeKernel(int group, DecodeKernelFn<T, TKV>* kernel, dim3* block,
                                size_t* smem) {
  using Tile = Tiling<kHeadDim, sizeof(TKV)>;
  const bool paired = group % 2 == 0 && Tile::kBdx * group / 2 <= kSmallBlock;
  const int rows = paired ? group / 2 : group;
  const int bdz = TokenLanes<Tile>(rows);
  *block = dim3(Tile::kBdx, rows, bdz);
  *smem = SharedBytes<kHeadDim, Tile>(group, bdz);
  const int threads = Tile::kBdx * rows * bdz;
  if (threads < Tile::kTileTokens || threads > 1024 || Tile::kTileTokens / bdz % Tile::kBatch) {
    return cudaErrorInvalidConfiguration;
  }
  const int bytes = static_cast<int>(*smem);
  if (paired) {
    *kernel = DecodeKernel<T, TKV, kHeadDim, 2, kSmallBlock, kPos>;
    return RaiseSharedLimit<DecodeKernel<T, TKV, kHeadDim, 2, kSmallBlock, kPos>>(bytes);
  }
  if (threads <= kSmallBlock) {
    *kernel = DecodeKernel<T, TKV, kHeadDim, 1, kSmallBlock, kPos>;
    return RaiseSharedLimit<DecodeKernel<T, TKV, kHeadDim, 1, kSmallBlock, kPos>>(bytes);
  }
  *kernel = DecodeKernel<T, TKV, kHeadDim, 1, 1024, kPos>;
  return RaiseSharedLimit<DecodeKernel<T, TKV, kHeadDim, 1, 1024, kPos>>(bytes);
}

// CTAs of DecodeKernel resident per SM for this group size (the scheduler's unit of fill).
template <typename T, typename TKV, int kHeadDim, PosEncoding kPos>
cudaError_t DecodeBlocksPerSM(int group, int* blocks) {
  DecodeKernelFn<T, TKV> kernel;
  dim3 block;
  size_t smem;
  cudaError_t err = PrepareDecodeKernel<T, TKV, kHeadDim, kPos>(group, &kernel, &block, &smem);
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, kernel, static_cast<int>(block.x * block.y * block.z), smem);
}

// Launches the decode kernel over `grid_work` work items, then (when merge_positions > 0)
// the merge of split requests' tmp rows into the output. `pdl`: both launch with
// programmatic dependent launch (see pdl.cuh).
template <typename T, typename TKV, int kHeadDim, PosEncoding kPos>
cudaError_t Decode(const DecodeParams<T, TKV>& p, const WorkList& work, int64_t grid_work,
                   int64_t num_kv_heads, const cascade::MergeSchedule& merge,
                   int64_t merge_positions, bool pdl, cudaStream_t stream) {
  if (grid_work == 0 || num_kv_heads == 0) return cudaSuccess;
  const int group = static_cast<int>(p.num_qo_heads / num_kv_heads);
  DecodeKernelFn<T, TKV> kernel;
  dim3 block;
  size_t smem;
  cudaError_t err = PrepareDecodeKernel<T, TKV, kHeadDim, kPos>(group, &kernel, &block, &smem);
  if (err != cudaSuccess) return err;
  err = launch_kernel(kernel,
                      dim3(static_cast<unsigned>(grid_work), static_cast<unsigned>(num_kv_heads)),
                      block, smem, stream, pdl, p, work);
  if (err != cudaSuccess || merge_positions == 0) return err;
  return launch_kernel(
      MergeChunksKernel<T, TKV, kHeadDim>,
      dim3(static_cast<unsigned>(merge_positions), static_cast<unsigned>(p.num_qo_heads)),
      dim3(kMergeThreads), 0, stream, pdl, p, merge);
}

}  // namespace decode
}  // namespace flashinfer
