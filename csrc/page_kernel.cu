// Kernel TU of the page module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/page.cuh"
#include "page_config.h"
#include "page_launcher.h"

namespace fp = flashinfer::page;

namespace {
fp::CacheLayout ToCache(PagedCacheLayout l) {
  return {l.num_pages, l.page_size, l.page_stride, l.slot_stride, l.head_stride};
}
fp::AppendLayout ToAppend(AppendTokensLayout l) { return {l.token_stride, l.head_stride}; }
}  // namespace

cudaError_t append_paged_kv_launch(void* k_cache, void* v_cache, const void* key, const void* value,
                                   const int32_t* batch_indices, const int32_t* positions,
                                   const int32_t* kv_indices, int64_t num_indices,
                                   const int32_t* kv_indptr, int64_t batch_size, int64_t nnz,
                                   int64_t heads, int64_t head_dim, AppendTokensLayout k_in,
                                   AppendTokensLayout v_in, PagedCacheLayout k_cache_layout,
                                   PagedCacheLayout v_cache_layout, cudaStream_t stream) {
  const fp::PageTable table{kv_indices, kv_indptr, num_indices, batch_size};
  return fp::AppendPagedKV<DType>(
      static_cast<DType*>(k_cache), static_cast<DType*>(v_cache), static_cast<const DType*>(key),
      static_cast<const DType*>(value), batch_indices, positions, table, nnz, heads, head_dim,
      ToAppend(k_in), ToAppend(v_in), ToCache(k_cache_layout), ToCache(v_cache_layout), stream);
}
