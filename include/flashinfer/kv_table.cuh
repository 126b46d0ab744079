// The KV cache as attention kernels read it (paged, or contiguous as one page) and the
// cp.async copies that stage it in shared memory. Shared by decode and prefill.
// Framework-agnostic: raw pointers and strides.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/fastdiv.h"

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
__device__ __forceinline__ int64_t request_length(const PageTable& pt, int64_t request) {
  const int64_t pages = static_cast<int64_t>(pt.indptr[request + 1]) - pt.indptr[request];
  if (pages <= 0) return 0;
  const int64_t last =
      min(max(static_cast<int64_t>(pt.last_page_len[request]), int64_t{0}), pt.page_size);
  return (pages - 1) * pt.page_size + last;
}

// *ptr when `pred`, else `fallback`: a predicated load, not a branch, so that several of
// them issue back to back. For tables that do not change while the kernel runs (.nc).
// Volatile: it stays after pdl_wait() (griddepcontrol.wait) whatever its operands are.
__device__ __forceinline__ int load_if(const int32_t* ptr, bool pred, int fallback) {
  int value = fallback;
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.global.nc.b32 %0, [%1];\n}\n"
               : "+r"(value)
               : "l"(ptr), "r"(static_cast<int>(pred)));
  return value;
}

// The page of the request's token `token` (-1 when its page id or its position in the page
// table is out of range; 0 for a contiguous cache), and its slot in that page. `page_size`
// divides by pt.page_size. Token positions and page sizes are < 2^31 (checked on the host).
// Branch-free, so that the page-table loads of several tokens issue back to back.
__device__ __forceinline__ int page_of(const PageTable& pt, const FastDiv& page_size, int page_base,
                                       int token) {
  const int64_t at = int64_t{page_base} + page_size.quotient(static_cast<uint32_t>(token));
  const bool in_table = pt.indices != nullptr && at >= 0 && at < pt.num_indices;
  const int id = load_if(pt.indices + (in_table ? at : 0), in_table, -1);
  if (!pt.indices) return 0;
  return id < pt.num_pages ? id : -1;
}
__device__ __forceinline__ int slot_of(const PageTable& pt, const FastDiv& page_size, int token) {
  if (!pt.indices) return token;
  return token - static_cast<int>(page_size.quotient(static_cast<uint32_t>(token)) * page_size.d);
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;  // 0: write zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace flashinfer
