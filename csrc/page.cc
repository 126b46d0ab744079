// Binding TU of the page module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>

#include <limits>

#include "ffi_export.h"
#include "page_config.h"
#include "page_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

void CheckIndex(const TensorView& t, const char* name, int64_t length) {
  FLASHINFER_CHECK(t.ndim() == 1, ValueError) << name << " must be 1-D, got " << t.ndim() << "-D";
  FLASHINFER_CHECK(length < 0 || t.size(0) == length, ValueError)
      << name << " has " << t.size(0) << " elements, expected " << length;
  CheckDType(t, name, kDLInt, 32);
  FLASHINFER_CHECK(t.size(0) <= 1 || t.stride(0) == 1, ValueError) << name << " must be contiguous";
}

AppendTokensLayout AppendOf(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.ndim() == 3, ValueError)
      << name << " must be 3-D [nnz, num_kv_heads, head_dim], got " << t.ndim() << "-D";
  FLASHINFER_CHECK(t.size(2) <= 1 || t.stride(2) == 1, ValueError)
      << name << "'s last dim must be contiguous";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  return {t.stride(0), t.stride(1)};
}

// NHD: [pages, page_size, heads, dim]; HND: [pages, heads, page_size, dim].
PagedCacheLayout CacheOf(const TensorView& t, const char* name, bool hnd, int64_t heads,
                         int64_t head_dim) {
  FLASHINFER_CHECK(t.ndim() == 4, ValueError) << name << " must be 4-D, got " << t.ndim() << "-D";
  FLASHINFER_CHECK(t.size(3) <= 1 || t.stride(3) == 1, ValueError)
      << name << "'s last dim must be contiguous";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  const int slot_dim = hnd ? 2 : 1;
  const int head_dim_index = hnd ? 1 : 2;
  FLASHINFER_CHECK(t.size(head_dim_index) == heads && t.size(3) == head_dim, ValueError)
      << name << " holds " << t.size(head_dim_index) << " heads of dim " << t.size(3)
      << ", the appended keys have " << heads << " of dim " << head_dim;
  FLASHINFER_CHECK(t.size(slot_dim) > 0, ValueError) << name << " has page_size 0";
  return {t.size(0), t.size(slot_dim), t.stride(0), t.stride(slot_dim), t.stride(head_dim_index)};
}

void AppendPagedKVCache(TensorView append_key, TensorView append_value, TensorView batch_indices,
                        TensorView positions, TensorView k_cache, TensorView v_cache,
                        TensorView kv_indices, TensorView kv_indptr, TensorView kv_last_page_len,
                        bool hnd) {
  const AppendTokensLayout k_in = AppendOf(append_key, "append_key");
  const AppendTokensLayout v_in = AppendOf(append_value, "append_value");
  const int64_t nnz = append_key.size(0), heads = append_key.size(1), dim = append_key.size(2);
  FLASHINFER_CHECK(
      append_value.size(0) == nnz && append_value.size(1) == heads && append_value.size(2) == dim,
      ValueError)
      << "append_key and append_value differ in shape";
  const PagedCacheLayout kc = CacheOf(k_cache, "paged_k_cache", hnd, heads, dim);
  const PagedCacheLayout vc = CacheOf(v_cache, "paged_v_cache", hnd, heads, dim);
  FLASHINFER_CHECK(kc.num_pages == vc.num_pages && kc.page_size == vc.page_size, ValueError)
      << "paged_k_cache and paged_v_cache differ in pages or page_size";
  CheckIndex(batch_indices, "batch_indices", nnz);
  CheckIndex(positions, "positions", nnz);
  CheckIndex(kv_indptr, "kv_indptr", -1);
  FLASHINFER_CHECK(kv_indptr.size(0) >= 1, ValueError) << "kv_indptr needs batch_size + 1 elements";
  const int64_t batch_size = kv_indptr.size(0) - 1;
  CheckIndex(kv_last_page_len, "kv_last_page_len", batch_size);
  CheckIndex(kv_indices, "kv_indices", -1);
  FLASHINFER_CHECK(nnz <= std::numeric_limits<int32_t>::max() && heads <= 65535, ValueError)
      << "too many tokens or heads";
  CheckCuda(append_key, "append_key");
  for (const auto& [t, name] : {std::pair{&append_value, "append_value"},
                                {&batch_indices, "batch_indices"},
                                {&positions, "positions"},
                                {&k_cache, "paged_k_cache"},
                                {&v_cache, "paged_v_cache"},
                                {&kv_indices, "kv_indices"},
                                {&kv_indptr, "kv_indptr"}}) {
    CheckSameDevice(append_key, *t, "append_key", name);
  }
  const DLDevice device = append_key.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(append_paged_kv_launch(
                     DataPtr(k_cache), DataPtr(v_cache), DataPtr(append_key), DataPtr(append_value),
                     static_cast<const int32_t*>(DataPtr(batch_indices)),
                     static_cast<const int32_t*>(DataPtr(positions)),
                     static_cast<const int32_t*>(DataPtr(kv_indices)), kv_indices.size(0),
                     static_cast<const int32_t*>(DataPtr(kv_indptr)), batch_size, nnz, heads, dim,
                     k_in, v_in, kc, vc, CurrentStream(device)),
                 "append_paged_kv_cache kernel launch");
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(append_paged_kv_cache, AppendPagedKVCache);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
