// Append new tokens' keys and values into a paged KV cache.
// Token i belongs to request b = batch_indices[i] at position p = positions[i] of that
// request's sequence; it goes to page kv_indices[kv_indptr[b] + p / page_size], slot
// p % page_size. The caches' strides say where a (page, slot, head) starts, so NHD
// ([pages, page_size, heads, dim]) and HND ([pages, heads, page_size, dim]) are one kernel.
// Indices live on the device and cannot be checked on the host: a token whose request,
// position, page table entry (kv_indptr may hold anything, so the entry is bounded by both
// the request's range and the length of kv_indices) or page id is out of range is skipped.
// Every index is bounded before it is read, so no input makes the kernel read or write out
// of bounds.
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/pdl.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace page {

struct CacheLayout {
  int64_t num_pages;
  int64_t page_size;
  int64_t page_stride, slot_stride, head_stride;  // elements
};

struct AppendLayout {
  int64_t token_stride, head_stride;  // elements
};

// The page table: request b's pages are indices[indptr[b]:indptr[b+1]].
struct PageTable {
  const int32_t* __restrict__ indices;
  const int32_t* __restrict__ indptr;
  int64_t num_indices;  // length of indices
  int64_t batch_size;   // indptr has batch_size + 1 elements
};

// The offset of token `token`'s (page, slot) in a cache of layout `l`, or -1 when its
// request, position, page table entry or page id is out of range (the token is skipped).
__device__ __forceinline__ int64_t slot_offset(const CacheLayout& l, int64_t token,
                                               const int32_t* __restrict__ batch_indices,
                                               const int32_t* __restrict__ positions,
                                               const PageTable& t) {
  const int64_t b = batch_indices[token];
  const int64_t pos = positions[token];
  if (b < 0 || b >= t.batch_size || pos < 0) return -1;
  const int64_t begin = t.indptr[b];
  const int64_t page_iter = begin + pos / l.page_size;
  if (begin < 0 || page_iter >= t.indptr[b + 1] || page_iter >= t.num_indices) return -1;
  const int64_t page = t.indices[page_iter];
  if (page < 0 || page >= l.num_pages) return -1;
  return page * l.page_stride + (pos % l.page_size) * l.slot_stride;
}

// grid (nnz, ceil(heads / blockDim.y)), block (lanes, heads per block): each thread moves
// VEC elements at a time (one 16-byte vector when the host found everything aligned).
template <typename T, int VEC>
__global__ void AppendPagedKVKernel(T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    const T* __restrict__ key, const T* __restrict__ value,
                                    const int32_t* __restrict__ batch_indices,
                                    const int32_t* __restrict__ positions, PageTable table,
                                    int64_t heads, int64_t head_dim, AppendLayout k_in,
                                    AppendLayout v_in, CacheLayout k_cache_l,
                                    CacheLayout v_cache_l) {
  using V = Vec<T, VEC>;
  const int64_t token = blockIdx.x;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (head >= heads) return;
  const int64_t k_at = slot_offset(k_cache_l, token, batch_indices, positions, table);
  if (k_at < 0) return;
  const int64_t v_at = slot_offset(v_cache_l, token, batch_indices, positions, table);
  if (v_at < 0) return;
  const T* ks = key + token * k_in.token_stride + head * k_in.head_stride;
  const T* vs = value + token * v_in.token_stride + head * v_in.head_stride;
  T* kd = k_cache + k_at + head * k_cache_l.head_stride;
  T* vd = v_cache + v_at + head * v_cache_l.head_stride;
  for (int64_t d = threadIdx.x * VEC; d < head_dim; d += blockDim.x * VEC) {
    *reinterpret_cast<V*>(kd + d) = *reinterpret_cast<const V*>(ks + d);
    *reinterpret_cast<V*>(vd + d) = *reinterpret_cast<const V*>(vs + d);
  }
}

template <typename T, int VEC>
cudaError_t LaunchAppend(T* k_cache, T* v_cache, const T* key, const T* value,
                         const int32_t* batch_indices, const int32_t* positions,
                         const PageTable& table, int64_t nnz, int64_t heads, int64_t head_dim,
                         AppendLayout k_in, AppendLayout v_in, CacheLayout k_cache_l,
                         CacheLayout v_cache_l, cudaStream_t stream) {
  const int64_t vectors = (head_dim + VEC - 1) / VEC;
  const unsigned lanes = vectors >= 128 ? 128u : (vectors >= 64 ? 64u : 32u);
  const int64_t per_block = heads < 128 / lanes ? heads : 128 / lanes;  // >= 1
  const dim3 block(lanes, static_cast<unsigned>(per_block));
  const dim3 grid(static_cast<unsigned>(nnz),
                  static_cast<unsigned>((heads + per_block - 1) / per_block));
  return launch_kernel(AppendPagedKVKernel<T, VEC>, grid, block, 0, stream, false, k_cache, v_cache,
                       key, value, batch_indices, positions, table, heads, head_dim, k_in, v_in,
                       k_cache_l, v_cache_l);
}

// Every pointer 16-byte aligned and every stride and head_dim a multiple of the vector.
template <typename T>
bool VectorAligned(const void* const* pointers, const int64_t* counts, int num_pointers,
                   int num_counts) {
  constexpr int64_t kVec = 16 / sizeof(T);
  for (int i = 0; i < num_pointers; ++i) {
    if (reinterpret_cast<uintptr_t>(pointers[i]) % 16 != 0) return false;
  }
  for (int i = 0; i < num_counts; ++i) {
    if (counts[i] % kVec != 0) return false;
  }
  return true;
}

template <typename T>
cudaError_t AppendPagedKV(T* k_cache, T* v_cache, const T* key, const T* value,
                          const int32_t* batch_indices, const int32_t* positions,
                          const PageTable& table, int64_t nnz, int64_t heads, int64_t head_dim,
                          AppendLayout k_in, AppendLayout v_in, CacheLayout k_cache_l,
                          CacheLayout v_cache_l, cudaStream_t stream) {
  if (nnz == 0 || heads == 0 || head_dim == 0) return cudaSuccess;
  const void* pointers[] = {k_cache, v_cache, key, value};
  const int64_t counts[] = {head_dim,
                            k_in.token_stride,
                            k_in.head_stride,
                            v_in.token_stride,
                            v_in.head_stride,
                            k_cache_l.page_stride,
                            k_cache_l.slot_stride,
                            k_cache_l.head_stride,
                            v_cache_l.page_stride,
                            v_cache_l.slot_stride,
                            v_cache_l.head_stride};
  if (VectorAligned<T>(pointers, counts, 4, 11)) {
    return LaunchAppend<T, 16 / sizeof(T)>(k_cache, v_cache, key, value, batch_indices, positions,
                                           table, nnz, heads, head_dim, k_in, v_in, k_cache_l,
                                           v_cache_l, stream);
  }
  return LaunchAppend<T, 1>(k_cache, v_cache, key, value, batch_indices, positions, table, nnz,
                            heads, head_dim, k_in, v_in, k_cache_l, v_cache_l, stream);
}

}  // namespace page
}  // namespace flashinfer
