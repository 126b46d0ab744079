// Append new tokens' keys and values into a paged KV cache.
// Token i belongs to request b = batch_indices[i] at position p = positions[i] of that
// request's sequence; it goes to page kv_indices[kv_indptr[b] + p / page_size], slot
// p % page_size. The caches' strides say where a (page, slot, head) starts, so NHD
// ([pages, page_size, heads, dim]) and HND ([pages, heads, page_size, dim]) are one kernel.
// Indices live on the device and cannot be checked on the host: a token whose request,
// page slot or page id is out of range is skipped, never written out of bounds.
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// grid (nnz, heads): one block copies one head of one token, for both k and v.
template <typename T>
__global__ void AppendPagedKVKernel(T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    const T* __restrict__ key, const T* __restrict__ value,
                                    const int32_t* __restrict__ batch_indices,
                                    const int32_t* __restrict__ positions,
                                    const int32_t* __restrict__ kv_indices,
                                    const int32_t* __restrict__ kv_indptr, int64_t batch_size,
                                    int64_t head_dim, AppendLayout k_in, AppendLayout v_in,
                                    CacheLayout k_cache_l, CacheLayout v_cache_l) {
  const int64_t token = blockIdx.x;
  const int64_t head = blockIdx.y;
  const int64_t b = batch_indices[token];
  const int64_t pos = positions[token];
  if (b < 0 || b >= batch_size || pos < 0) return;
  const int64_t page_iter = kv_indptr[b] + pos / k_cache_l.page_size;
  if (page_iter >= kv_indptr[b + 1]) return;
  const int64_t page = kv_indices[page_iter];
  if (page < 0 || page >= k_cache_l.num_pages) return;
  const int64_t slot = pos % k_cache_l.page_size;
  const T* ks = key + token * k_in.token_stride + head * k_in.head_stride;
  const T* vs = value + token * v_in.token_stride + head * v_in.head_stride;
  T* kd = k_cache + page * k_cache_l.page_stride + slot * k_cache_l.slot_stride +
          head * k_cache_l.head_stride;
  T* vd = v_cache + page * v_cache_l.page_stride + slot * v_cache_l.slot_stride +
          head * v_cache_l.head_stride;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    kd[d] = ks[d];
    vd[d] = vs[d];
  }
}

template <typename T>
cudaError_t AppendPagedKV(T* k_cache, T* v_cache, const T* key, const T* value,
                          const int32_t* batch_indices, const int32_t* positions,
                          const int32_t* kv_indices, const int32_t* kv_indptr, int64_t nnz,
                          int64_t heads, int64_t batch_size, int64_t head_dim,
                          AppendLayout k_in, AppendLayout v_in, CacheLayout k_cache_l,
                          CacheLayout v_cache_l, cudaStream_t stream) {
  if (nnz == 0 || heads == 0 || head_dim == 0) return cudaSuccess;
  const unsigned threads = head_dim >= 128 ? 128u : (head_dim >= 64 ? 64u : 32u);
  const dim3 grid(static_cast<unsigned>(nnz), static_cast<unsigned>(heads));
  AppendPagedKVKernel<T><<<grid, threads, 0, stream>>>(
      k_cache, v_cache, key, value, batch_indices, positions, kv_indices, kv_indptr, batch_size,
      head_dim, k_in, v_in, k_cache_l, v_cache_l);
  return cudaGetLastError();
}

}  // namespace page
}  // namespace flashinfer
