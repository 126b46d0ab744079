// The KV cache as attention kernels read it (paged, or contiguous as one page): where a
// request's token lives. Shared by decode and prefill; the loads and copies are ptx.cuh's.
// Framework-agnostic: raw pointers and strides.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/fastdiv.h"
#include "flashinfer/ptx.cuh"

namespace flashinfer {

// K or V of a paged cache: token t of request b is slot t % page_size of page
// indices[indptr[b] + t / page_size]. A contiguous cache is one page (indices null) of
// page_size = kv_len. Strides in elements, every one a multiple of 8 (16 bytes; checked on
// the host).
template <typename T>
struct KVCache {
  const T* data;
  int64_t page_stride, slot_stride, head_stride;
};

struct PageTable {
  const int32_t* indices;  // null: contiguous
  const int32_t* indptr;
  const int32_t* last_page_len;
  int64_t page_size;
  int64_t num_indices;  // entries of `indices`; a position past them is skipped, never read
  int64_t num_pages;    // a page id outside [0, num_pages) is skipped, never read
};

// The request's KV length from the page table: full pages plus the filled part of the last
// one (clamped to [0, page_size], so a bad length never reaches past the request's pages).
// last_page_len is read even for a request without pages (every request has its entry), so
// its load issues with indptr's, not a round trip after them.
__device__ __forceinline__ int64_t request_length(const PageTable& pt, int64_t request) {
  const int64_t pages = static_cast<int64_t>(pt.indptr[request + 1]) - pt.indptr[request];
  const int64_t last =
      min(max(static_cast<int64_t>(pt.last_page_len[request]), int64_t{0}), pt.page_size);
  return pages > 0 ? (pages - 1) * pt.page_size + last : 0;
}

// The page-table entry of the request's token `token` as stored (-1 when its position in the
// table is out of range, or there is no table), and the page an entry names (-1 for an id
// outside [0, num_pages); 0 for a contiguous cache): two steps, so that a loop can issue a
// later tile's table load early and check it where it is used. `page_size` divides by
// pt.page_size. Token positions and page sizes are < 2^31 (checked on the host). Branch-free,
// so that the page-table loads of several tokens issue back to back.
__device__ __forceinline__ int page_entry(const PageTable& pt, const FastDiv& page_size,
                                          int page_base, int token) {
  const int64_t at = int64_t{page_base} + page_size.quotient(static_cast<uint32_t>(token));
  const bool in_table = pt.indices != nullptr && at >= 0 && at < pt.num_indices;
  return load_if(pt.indices + (in_table ? at : 0), in_table, -1);
}
__device__ __forceinline__ int entry_page(const PageTable& pt, int entry) {
  if (!pt.indices) return 0;
  return entry < pt.num_pages ? entry : -1;
}
// The page of the request's token `token` (page_entry, then entry_page), and (slot_of) its
// slot in that page.
__device__ __forceinline__ int page_of(const PageTable& pt, const FastDiv& page_size, int page_base,
                                       int token) {
  return entry_page(pt, page_entry(pt, page_size, page_base, token));
}
__device__ __forceinline__ int slot_of(const PageTable& pt, const FastDiv& page_size, int token) {
  if (!pt.indices) return token;
  return token - static_cast<int>(page_size.quotient(static_cast<uint32_t>(token)) * page_size.d);
}

}  // namespace flashinfer
