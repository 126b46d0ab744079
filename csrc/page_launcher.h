// Plain C++ launcher exported by page_kernel.cu and called by the binding (page.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

struct PagedCacheLayout {
  int64_t num_pages, page_size;
  int64_t page_stride, slot_stride, head_stride;  // elements
};

struct AppendTokensLayout {
  int64_t token_stride, head_stride;  // elements
};

// Keys, values and caches are the module's DType; all indices int32. kv_indices has
// num_indices elements, kv_indptr batch_size + 1.
cudaError_t append_paged_kv_launch(void* k_cache, void* v_cache, const void* key, const void* value,
                                   const int32_t* batch_indices, const int32_t* positions,
                                   const int32_t* kv_indices, int64_t num_indices,
                                   const int32_t* kv_indptr, int64_t batch_size, int64_t nnz,
                                   int64_t heads, int64_t head_dim, AppendTokensLayout k_in,
                                   AppendTokensLayout v_in, PagedCacheLayout k_cache_layout,
                                   PagedCacheLayout v_cache_layout, cudaStream_t stream);
