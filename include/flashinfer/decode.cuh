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
// cascade::MergeStatesKernel merges a request's chunks; a request with one chunk writes its
// output directly.
//
// Tiling inside a CTA. Threads are (tx, ty, tz): tx owns 8 consecutive dims of head_dim
// (one 16-byte vector; kBdx = head_dim / 8 lanes span a row), ty is the query head within
// the GQA group (all of a KV head's query heads share each K/V load), tz splits the tile's
// tokens. KV arrives in tiles of kTileTokens tokens (4096 / head_dim: 8 KiB of K and 8 KiB of
// V per tile at 16 bits) through a two-stage cp.async pipeline in shared memory: while the
// CTA computes on tile t, tile t+1 is in flight. Each 16-byte cp.async fetches one token's
// 8-dim slice; the page table is consulted once per token for K and V, so pages of any size
// and order work. A token whose page id is out of range is not scored at all (a flag per
// token in shared memory). For each token a (ty, tz) group computes q.k by a shuffle
// reduction across its kBdx lanes and folds the token into an online softmax (running max,
// sum and weighted V, in log2 units). At the end the tz groups' states merge through shared
// memory, in order.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "flashinfer/cascade.cuh"
#include "flashinfer/kv_table.cuh"
#include "flashinfer/pdl.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace decode {

constexpr int kVec = 8;  // elements per 16-byte vector (16-bit types)
constexpr float kLog2e = 1.4426950408889634f;

// The schedule. Batch mode: plan points at [num_work, chunk_tokens, request[cap],
// chunk[cap], num_chunks[cap], tmp_row[cap]] on the device (tmp_row -1: write the output
// directly). Single mode (plan null): request 0 of length `single_len` in gridDim.x chunks of
// `chunk_tokens`, chunk c = blockIdx.x written to tmp row c when split.
struct WorkList {
  const int32_t* plan;
  int64_t capacity;
  int64_t chunk_tokens;  // single mode: tokens per chunk of a split request
  int64_t window_left;   // >= 0: attend to the last window_left + 1 tokens only
  int64_t single_len;
  bool single_split;
};

struct WorkItem {
  int64_t request, start, end, tmp_row;
};

__device__ __forceinline__ bool work_item(const WorkList& w, const PageTable& pt, int64_t i,
                                          WorkItem* item) {
  int64_t request = 0, chunk = i, chunks = gridDim.x, tmp_row = w.single_split ? i : -1;
  int64_t length = w.single_len, chunk_tokens = w.chunk_tokens;
  if (w.plan) {
    if (i >= w.plan[0]) return false;
    chunk_tokens = max(w.plan[1], 1);
    const int32_t* a = w.plan + 2;
    request = a[i];
    chunk = a[w.capacity + i];
    chunks = a[2 * w.capacity + i];
    tmp_row = a[3 * w.capacity + i];
    length = request_length(pt, request);
  }
  const int64_t begin = w.window_left >= 0 ? max(int64_t{0}, length - w.window_left - 1) : 0;
  const int64_t start = min(begin + chunk * chunk_tokens, length);
  const int64_t end = chunk + 1 >= chunks ? length : min(start + chunk_tokens, length);
  *item = {request, start, end, tmp_row};
  return true;
}

struct Scores {
  float scale;  // applied to q.k: sm_scale * log2e, or sm_scale / cap with a soft cap
  float cap;    // > 0: score = cap * log2e * tanh(scaled q.k), else 0
};

template <typename T>
struct DecodeParams {
  const T* q;
  int64_t q_batch_stride, q_head_stride;
  KVCache<T> k, v;
  PageTable pages;
  T* out;
  int64_t out_batch_stride, out_head_stride;
  float* lse;      // [batch, qo_heads] base-2 LSE, may be null
  float* tmp_v;    // [tmp rows, qo_heads, head_dim]
  float* tmp_lse;  // [tmp rows, qo_heads]
  int64_t num_qo_heads;
  Scores scores;
};

template <int kHeadDim>
struct Tiling {
  static constexpr int kBdx = kHeadDim / kVec;
  static constexpr int kTileTokens = 4096 / kHeadDim;
  // bytes of one stage of K plus V tiles, at 16-bit elements
  static constexpr int kStageBytes = 2 * kTileTokens * kHeadDim * 2;
  // after both stages: one "scored" flag per token per stage
  static constexpr int kFlagBytes = 2 * kTileTokens;
};

// Lanes [base, base + kBdx) of this thread's warp: one row's shuffle partners. A partial last
// warp (an odd GQA group) has only whole rows active, so the mask never names an idle lane.
template <int kBdx>
__device__ __forceinline__ unsigned row_mask() {
  if (kBdx >= 32) return 0xffffffffu;
  const unsigned lane = threadIdx.x + kBdx * (threadIdx.y + blockDim.y * threadIdx.z);
  return ((1u << kBdx) - 1u) << ((lane % 32) & ~(kBdx - 1u));
}

// blockDim = (kBdx, group, bdz); grid = (work items, kv heads). Dynamic shared memory:
// max(2 stages, the final merge's bdz * group * (head_dim + 2) floats).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(1024) DecodeKernel(DecodeParams<T> p, WorkList work) {
  using Tile = Tiling<kHeadDim>;
  constexpr int kBdx = Tile::kBdx, kTile = Tile::kTileTokens;
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();  // everything below may read what the previous kernel wrote
  WorkItem item;
  if (!work_item(work, p.pages, blockIdx.x, &item)) return;
  const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
  const int group = blockDim.y, bdz = blockDim.z;
  const int tid = tx + kBdx * (ty + group * tz);
  const int threads = kBdx * group * bdz;
  const int64_t kv_head = blockIdx.y;
  const int64_t qo_head = kv_head * group + ty;
  const int64_t page_base = p.pages.indices ? p.pages.indptr[item.request] : 0;

  float q[kVec];
  {
    const Vec<T, kVec> qv = *reinterpret_cast<const Vec<T, kVec>*>(
        p.q + item.request * p.q_batch_stride + qo_head * p.q_head_stride + tx * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) q[j] = to_float(qv.data[j]) * p.scores.scale;
  }

  // stage s: K tile at smem + s * kStageBytes, V tile right after it
  auto k_tile = [&](int stage) { return reinterpret_cast<T*>(smem + stage * Tile::kStageBytes); };
  auto v_tile = [&](int stage) { return k_tile(stage) + kTile * kHeadDim; };
  auto scored = [&](int stage) { return smem + 2 * Tile::kStageBytes + stage * kTile; };

  auto load_tile = [&](int64_t tile_start, int stage) {
    for (int c = tid; c < kTile * kBdx; c += threads) {
      const int token = c / kBdx, part = c % kBdx;
      const int64_t t = tile_start + token;
      int64_t page = -1, slot = 0;
      if (t < item.end) locate(p.pages, page_base, t, &page, &slot);
      const bool valid = page >= 0;
      const int64_t k_at =
          page * p.k.page_stride + slot * p.k.slot_stride + kv_head * p.k.head_stride + part * kVec;
      const int64_t v_at =
          page * p.v.page_stride + slot * p.v.slot_stride + kv_head * p.v.head_stride + part * kVec;
      // not scored: zero-fill from a valid dummy address
      cp_async_16(k_tile(stage) + token * kHeadDim + part * kVec, p.k.data + (valid ? k_at : 0),
                  valid);
      cp_async_16(v_tile(stage) + token * kHeadDim + part * kVec, p.v.data + (valid ? v_at : 0),
                  valid);
      if (part == 0) scored(stage)[token] = valid;
    }
    cp_async_commit();
  };

  float m = -INFINITY, d = 0.f, o[kVec] = {};
  const int64_t tiles = (item.end - item.start + kTile - 1) / kTile;
  const int per_lane = kTile / bdz;
  if (tiles > 0) load_tile(item.start, 0);
  for (int64_t i = 0; i < tiles; ++i) {
    const int stage = static_cast<int>(i & 1);
    if (i + 1 < tiles) {
      load_tile(item.start + (i + 1) * kTile, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t tile_start = item.start + i * kTile;
    for (int u = 0; u < per_lane; ++u) {
      const int token = tz * per_lane + u;
      const Vec<T, kVec> kv =
          *reinterpret_cast<const Vec<T, kVec>*>(k_tile(stage) + token * kHeadDim + tx * kVec);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) s += q[j] * to_float(kv.data[j]);
#pragma unroll
      for (int offset = kBdx / 2; offset > 0; offset >>= 1) {
        s += __shfl_xor_sync(row_mask<kBdx>(), s, offset);
      }
      if (tile_start + token >= item.end || !scored(stage)[token]) continue;
      if (p.scores.cap > 0.f) s = p.scores.cap * tanhf(s);
      const float m_new = fmaxf(m, s);
      const float rescale = exp2f(m - m_new);
      const float w = exp2f(s - m_new);
      const Vec<T, kVec> vv =
          *reinterpret_cast<const Vec<T, kVec>*>(v_tile(stage) + token * kHeadDim + tx * kVec);
      d = d * rescale + w;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = o[j] * rescale + w * to_float(vv.data[j]);
      m = m_new;
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }
  pdl_launch_dependents();  // the merge (or the next kernel) may start its prologue

  // Merge the bdz partial states of each query head, in tz order.
  float* merge_o = reinterpret_cast<float*>(smem);     // [bdz][group][head_dim]
  float* merge_md = merge_o + bdz * group * kHeadDim;  // [bdz][group][2]
  const int slot = tz * group + ty;
#pragma unroll
  for (int j = 0; j < kVec; ++j) merge_o[slot * kHeadDim + tx * kVec + j] = o[j];
  if (tx == 0) {
    merge_md[2 * slot] = m;
    merge_md[2 * slot + 1] = d;
  }
  __syncthreads();
  if (tz != 0) return;
  float total_m = -INFINITY;
  for (int z = 0; z < bdz; ++z) total_m = fmaxf(total_m, merge_md[2 * (z * group + ty)]);
  float total_d = 0.f, acc[kVec] = {};
  if (total_m != -INFINITY) {
    for (int z = 0; z < bdz; ++z) {
      const int zs = z * group + ty;
      const float w = exp2f(merge_md[2 * zs] - total_m);
      total_d += merge_md[2 * zs + 1] * w;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += merge_o[zs * kHeadDim + tx * kVec + j] * w;
    }
  }
  const float inv = total_d > 0.f ? 1.f / total_d : 0.f;
  const float lse = total_d > 0.f ? total_m + log2f(total_d) : -INFINITY;
  if (item.tmp_row < 0) {
    Vec<T, kVec> ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) ov.data[j] = from_float<T>(acc[j] * inv);
    *reinterpret_cast<Vec<T, kVec>*>(p.out + item.request * p.out_batch_stride +
                                     qo_head * p.out_head_stride + tx * kVec) = ov;
    if (p.lse && tx == 0) p.lse[item.request * p.num_qo_heads + qo_head] = lse;
  } else {
    float* dst = p.tmp_v + (item.tmp_row * p.num_qo_heads + qo_head) * kHeadDim + tx * kVec;
#pragma unroll
    for (int j = 0; j < kVec; ++j) dst[j] = acc[j] * inv;
    if (tx == 0) p.tmp_lse[item.tmp_row * p.num_qo_heads + qo_head] = lse;
  }
}

// Threads along tokens: a power of two dividing the tile, doubled while the block has fewer
// than 128 threads or a partial warp, and never past 1024 threads (an odd GQA group may then
// end in a partial warp: see row_mask).
template <int kHeadDim>
inline int TokenLanes(int group) {
  int bdz = 1;
  const int row = Tiling<kHeadDim>::kBdx * group;
  while (bdz < Tiling<kHeadDim>::kTileTokens && row * bdz * 2 <= 1024 &&
         (row * bdz < 128 || (row * bdz) % 32 != 0)) {
    bdz *= 2;
  }
  return bdz;
}

template <int kHeadDim>
inline size_t SharedBytes(int group, int bdz) {
  const size_t merge = static_cast<size_t>(bdz) * group * (kHeadDim + 2) * sizeof(float);
  const size_t stages =
      2 * static_cast<size_t>(Tiling<kHeadDim>::kStageBytes) + Tiling<kHeadDim>::kFlagBytes;
  return merge > stages ? merge : stages;
}

// The launch shape for a group size. Raising the kernel's dynamic shared memory limit is
// done once per size and never again at that size, so launches captured in a CUDA graph
// (after a warm-up run) make no attribute calls.
template <typename T, int kHeadDim>
cudaError_t PrepareDecodeKernel(int group, dim3* block, size_t* smem) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> configured[kMaxDevices] = {};  // bytes set, per device
  const int bdz = TokenLanes<kHeadDim>(group);
  *block = dim3(Tiling<kHeadDim>::kBdx, group, bdz);
  *smem = SharedBytes<kHeadDim>(group, bdz);
  const int bytes = static_cast<int>(*smem);
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool tracked = device < kMaxDevices;
  if (tracked && bytes <= configured[device].load()) return cudaSuccess;
  err = cudaFuncSetAttribute(DecodeKernel<T, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             bytes);
  if (err == cudaSuccess && tracked) configured[device].store(bytes);
  return err;
}

// CTAs of DecodeKernel resident per SM for this group size (the scheduler's unit of fill).
template <typename T, int kHeadDim>
cudaError_t DecodeBlocksPerSM(int group, int* blocks) {
  dim3 block;
  size_t smem;
  cudaError_t err = PrepareDecodeKernel<T, kHeadDim>(group, &block, &smem);
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, DecodeKernel<T, kHeadDim>, static_cast<int>(block.x * block.y * block.z), smem);
}

// Launches the decode kernel over `grid_work` work items, then (when merge_positions > 0)
// the merge of split requests' tmp rows into the output. `pdl`: both launch with
// programmatic dependent launch (see pdl.cuh).
template <typename T, int kHeadDim>
cudaError_t Decode(const DecodeParams<T>& p, const WorkList& work, int64_t grid_work,
                   int64_t num_kv_heads, const cascade::MergeSchedule& merge,
                   int64_t merge_positions, bool pdl, cudaStream_t stream) {
  if (grid_work == 0 || num_kv_heads == 0) return cudaSuccess;
  const int group = static_cast<int>(p.num_qo_heads / num_kv_heads);
  dim3 block;
  size_t smem;
  cudaError_t err = PrepareDecodeKernel<T, kHeadDim>(group, &block, &smem);
  if (err != cudaSuccess) return err;
  err = launch_kernel(DecodeKernel<T, kHeadDim>,
                      dim3(static_cast<unsigned>(grid_work), static_cast<unsigned>(num_kv_heads)),
                      block, smem, stream, pdl, p, work);
  if (err != cudaSuccess || merge_positions == 0) return err;
  const int64_t h = p.num_qo_heads;
  return cascade::MergeStates<float, T>({p.out, p.lse, p.out_batch_stride, p.out_head_stride, h, 1},
                                        {p.tmp_v, p.tmp_lse, h * kHeadDim, kHeadDim, h, 1}, merge,
                                        merge_positions, h, kHeadDim, stream, pdl);
}

}  // namespace decode
}  // namespace flashinfer
