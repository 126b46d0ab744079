// Binding TU of the prefill module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention_config.h"
#include "attention_binding.h"
#include "ffi_export.h"
#include "prefill_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

// grid.y is num_kv_heads for the prefill kernel and num_qo_heads for the split-KV merge.
int64_t CheckGroup(int64_t qo_heads, int64_t kv_heads) {
  FLASHINFER_CHECK(kv_heads >= 1 && qo_heads >= 1 && qo_heads % kv_heads == 0, ValueError)
      << "num_qo_heads (" << qo_heads << ") must be a positive multiple of num_kv_heads ("
      << kv_heads << ")";
  FLASHINFER_CHECK(qo_heads <= 65535, ValueError)
      << "num_qo_heads " << qo_heads << " exceeds 65535";
  return qo_heads / kv_heads;
}

// The bit-packed custom mask: 1-D contiguous uint8 of at least `bytes` bytes on q's device.
const uint8_t* MaskOf(const Optional<TensorView>& mask, int64_t bytes, const TensorView& q) {
  if (!mask.has_value()) return nullptr;
  const TensorView& t = mask.value();
  CheckDType(t, "custom_mask", kDLUInt, 8);
  FLASHINFER_CHECK(t.ndim() == 1 && (t.size(0) <= 1 || t.stride(0) == 1), ValueError)
      << "custom_mask must be 1-D and contiguous (bit-packed uint8)";
  FLASHINFER_CHECK(t.size(0) >= bytes, ValueError)
      << "custom_mask has " << t.size(0) << " bytes, needs " << bytes;
  CheckSameDevice(q, t, "q", "custom_mask");
  return static_cast<const uint8_t*>(DataPtr(t));
}

// The fields batch and single prefill share.
PrefillLaunch LaunchOf(const TensorView& q, const TensorView& k, const TensorView& v,
                       const Strides& ks, const Strides& vs, const TensorView& out, float* lse,
                       const TensorView& tmp_v, const TensorView& tmp_lse, int64_t kv_heads,
                       bool causal, int64_t window_left, double score_scale, double score_cap,
                       double rope_rcp_scale, double rope_rcp_theta, bool enable_pdl) {
  PrefillLaunch l{};
  l.q = DataPtr(q);
  l.q_row_stride = q.stride(0);
  l.q_head_stride = q.stride(1);
  l.k = DataPtr(k);
  l.v = DataPtr(v);
  l.k_page_stride = ks.page;
  l.k_slot_stride = ks.slot;
  l.k_head_stride = ks.head;
  l.v_page_stride = vs.page;
  l.v_slot_stride = vs.slot;
  l.v_head_stride = vs.head;
  l.out = DataPtr(out);
  l.out_row_stride = out.stride(0);
  l.out_head_stride = out.stride(1);
  l.lse = lse;
  l.tmp_v = static_cast<float*>(DataPtr(tmp_v));
  l.tmp_lse = static_cast<float*>(DataPtr(tmp_lse));
  l.num_qo_heads = q.size(1);
  l.num_kv_heads = kv_heads;
  l.score_scale = static_cast<float>(score_scale);
  l.score_cap = static_cast<float>(score_cap);
  l.rope_rcp_scale = static_cast<float>(rope_rcp_scale);
  l.rope_rcp_theta = static_cast<float>(rope_rcp_theta);
  l.causal = causal;
  // A window of 2^31 keys or more hides none (lengths are < 2^31): passed as no window, so
  // the kernel's 64-bit position arithmetic (position - window_left) cannot overflow.
  l.window_left = window_left >= (int64_t{1} << 31) ? -1 : window_left;
  l.pdl = enable_pdl;
  return l;
}

void BatchPrefill(TensorView q, TensorView k, TensorView v, TensorView qo_indptr,
                  TensorView kv_indptr, Optional<TensorView> kv_indices,
                  Optional<TensorView> kv_last_page_len, Optional<TensorView> custom_mask,
                  Optional<TensorView> mask_indptr, TensorView plan, TensorView tmp_v,
                  TensorView tmp_lse, TensorView out, Optional<TensorView> lse, bool hnd,
                  int64_t work_capacity, int64_t merge_capacity, int64_t tmp_capacity,
                  int64_t grid_work, int64_t grid_merge, bool causal, int64_t window_left,
                  double score_scale, double score_cap, double rope_rcp_scale,
                  double rope_rcp_theta, Optional<TensorView> alibi_slopes, bool enable_pdl) {
  CheckRope(rope_rcp_scale, rope_rcp_theta);
  CheckHeads(q, "q", 3, -1, -1);
  const int64_t total_q = q.size(0), qo_heads = q.size(1);
  CheckHeads(out, "out", 3, total_q, qo_heads, kHeadDimVO);
  const float* slopes = AlibiSlopesOf(alibi_slopes, qo_heads, score_cap, q);
  const bool paged = k.ndim() == 4;
  FLASHINFER_CHECK(k.ndim() == 3 || paged, ValueError)
      << "k must be 4-D (paged) or 3-D (ragged), got " << k.ndim() << "-D";
  const int rank = paged ? 4 : 3, base = rank - 3;
  const int64_t kv_heads = k.size(base + (hnd ? 0 : 1));
  CheckGroup(qo_heads, kv_heads);
  int64_t page_size = 0, v_page_size = 0;
  const Strides ks = CacheOf(k, "k", rank, hnd, kv_heads, &page_size);
  const Strides vs = CacheOf(v, "v", rank, hnd, kv_heads, &v_page_size, kHeadDimVO);
  FLASHINFER_CHECK(page_size == v_page_size && k.size(0) == v.size(0), ValueError)
      << "k and v differ in " << (paged ? "pages or page_size" : "tokens");
  FLASHINFER_CHECK(custom_mask.has_value() == mask_indptr.has_value(), ValueError)
      << "custom_mask and mask_indptr go together";
  FLASHINFER_CHECK(work_capacity >= grid_work && merge_capacity >= grid_merge && grid_work >= 0 &&
                       grid_merge >= 0 && tmp_capacity >= 0 && window_left >= -1,
                   ValueError)
      << "the launch does not match the schedule";
  FLASHINFER_CHECK(grid_work <= std::numeric_limits<int32_t>::max() &&
                       grid_merge <= std::numeric_limits<int32_t>::max(),
                   ValueError)
      << "the schedule exceeds the grid limit";
  CheckCuda(q, "q");
  FLASHINFER_CHECK(qo_indptr.ndim() == 1 && qo_indptr.size(0) >= 1, ValueError)
      << "qo_indptr must be 1-D with batch_size + 1 elements";
  const int64_t batch = qo_indptr.size(0) - 1;
  PrefillLaunch l = LaunchOf(q, k, v, ks, vs, out, LseOf(lse, total_q, qo_heads, q), tmp_v, tmp_lse,
                             kv_heads, causal, window_left, score_scale, score_cap, rope_rcp_scale,
                             rope_rcp_theta, enable_pdl);
  l.alibi_slopes = slopes;
  l.qo_indptr = IndexArray(qo_indptr, "qo_indptr", batch + 1, q);
  l.kv_indptr = IndexArray(kv_indptr, "kv_indptr", batch + 1, q);
  l.num_pages = 1;
  l.page_size = 1;
  if (paged) {
    FLASHINFER_CHECK(kv_indices.has_value() && kv_last_page_len.has_value(), ValueError)
        << "a paged KV cache needs kv_indices and kv_last_page_len";
    FLASHINFER_CHECK(page_size >= 1 && page_size < (int64_t{1} << 31), ValueError)
        << "page_size must be in [1, 2^31), got " << page_size;
    l.kv_indices = PageIndices(kv_indices.value(), l.kv_indptr, q);
    l.kv_last_page_len = IndexArray(kv_last_page_len.value(), "kv_last_page_len", batch, q);
    l.num_indices = kv_indices.value().size(0);
    l.num_pages = k.size(0);
    l.page_size = page_size;
  }
  l.mask = MaskOf(custom_mask, 0, q);
  if (mask_indptr.has_value()) {
    l.mask_indptr = IndexArray(mask_indptr.value(), "mask_indptr", batch + 1, q);
  }
  l.plan = IndexArray(plan, "plan", 4 + 5 * work_capacity + 2 * merge_capacity, q);
  // the plan's tmp rows are < tmp_capacity
  CheckFloatBuffer(tmp_v, "tmp_v", tmp_capacity * qo_heads * kHeadDimVO);
  CheckFloatBuffer(tmp_lse, "tmp_lse", tmp_capacity * qo_heads);
  CheckDevices(q, {{&k, "k"}, {&v, "v"}, {&tmp_v, "tmp_v"}, {&tmp_lse, "tmp_lse"}, {&out, "out"}});
  l.work_capacity = work_capacity;
  l.merge_capacity = merge_capacity;
  l.grid_work = grid_work;
  l.grid_merge = grid_merge;
  CudaDeviceGuard guard(q.device().device_id);
  CheckCudaError(prefill_launch(l, CurrentStream(q.device())), "batch prefill launch");
}

void SinglePrefill(TensorView q, TensorView k, TensorView v, Optional<TensorView> custom_mask,
                   TensorView tmp_v, TensorView tmp_lse, TensorView out, Optional<TensorView> lse,
                   bool hnd, bool causal, int64_t window_left, int64_t chunk_tokens,
                   int64_t num_chunks, double score_scale, double score_cap, double rope_rcp_scale,
                   double rope_rcp_theta, Optional<TensorView> alibi_slopes, bool enable_pdl) {
  CheckRope(rope_rcp_scale, rope_rcp_theta);
  CheckHeads(q, "q", 3, -1, -1);
  const int64_t qo_len = q.size(0), qo_heads = q.size(1);
  CheckHeads(out, "out", 3, qo_len, qo_heads, kHeadDimVO);
  const float* slopes = AlibiSlopesOf(alibi_slopes, qo_heads, score_cap, q);
  FLASHINFER_CHECK(k.ndim() == 3, ValueError) << "k must be 3-D, got " << k.ndim() << "-D";
  const int64_t kv_heads = hnd ? k.size(0) : k.size(1);
  const int64_t group = CheckGroup(qo_heads, kv_heads);
  int64_t kv_len = 0, v_len = 0;
  const Strides ks = CacheOf(k, "k", 3, hnd, kv_heads, &kv_len);
  const Strides vs = CacheOf(v, "v", 3, hnd, kv_heads, &v_len, kHeadDimVO);
  FLASHINFER_CHECK(kv_len == v_len, ValueError) << "k has " << kv_len << " tokens, v " << v_len;
  FLASHINFER_CHECK(window_left >= -1 && chunk_tokens >= 1 && num_chunks >= 1, ValueError)
      << "window_left, chunk_tokens and num_chunks are out of range";
  const int64_t tiles = (qo_len * group + prefill_tile_rows() - 1) / prefill_tile_rows();
  FLASHINFER_CHECK(tiles * num_chunks <= std::numeric_limits<int32_t>::max(), ValueError)
      << "qo_len x num_chunks exceeds the grid limit";
  const int64_t tmp_rows = num_chunks > 1 ? qo_len * num_chunks : 0;
  CheckFloatBuffer(tmp_v, "tmp_v", tmp_rows * qo_heads * kHeadDimVO);
  CheckFloatBuffer(tmp_lse, "tmp_lse", tmp_rows * qo_heads);
  const uint8_t* mask = MaskOf(custom_mask, (qo_len * kv_len + 7) / 8, q);
  CheckCuda(q, "q");
  PrefillLaunch l = LaunchOf(q, k, v, ks, vs, out, LseOf(lse, qo_len, qo_heads, q), tmp_v, tmp_lse,
                             kv_heads, causal, window_left, score_scale, score_cap, rope_rcp_scale,
                             rope_rcp_theta, enable_pdl);
  l.mask = mask;
  l.alibi_slopes = slopes;
  CheckDevices(q, {{&k, "k"}, {&v, "v"}, {&tmp_v, "tmp_v"}, {&tmp_lse, "tmp_lse"}, {&out, "out"}});
  l.page_size = std::max<int64_t>(kv_len, 1);
  l.num_pages = 1;
  l.single_qo_len = qo_len;
  l.single_kv_len = kv_len;
  l.grid_work = tiles * num_chunks;
  l.chunk_tokens = chunk_tokens;
  l.single_chunks = num_chunks;
  CudaDeviceGuard guard(q.device().device_id);
  CheckCudaError(prefill_launch(l, CurrentStream(q.device())), "single prefill launch");
}

int64_t BlocksPerSM() {
  int blocks = 0;
  CheckCudaError(prefill_blocks_per_sm(&blocks), "occupancy query");
  return blocks;
}

int64_t TileRows() { return prefill_tile_rows(); }
int64_t SharedBytes() { return prefill_shared_bytes(); }
// The most shared memory a block may take on the current device (227 KiB on sm_90).
int64_t SharedBytesLimit() {
  int device = 0, limit = 0;
  CheckCudaError(cudaGetDevice(&device), "cudaGetDevice");
  CheckCudaError(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                 "cudaDeviceGetAttribute");
  return limit;
}
tvm::ffi::String DTypeOfModule() { return kDTypeName; }
tvm::ffi::String KVDTypeOfModule() { return kKVDTypeName; }
tvm::ffi::String PosEncodingOfModule() { return kPosEncodingName; }
int64_t HeadDimOfModule() { return kHeadDim; }
int64_t HeadDimVOOfModule() { return kHeadDimVO; }

}  // namespace

FLASHINFER_EXPORT_FUNC(batch_prefill, BatchPrefill);
FLASHINFER_EXPORT_FUNC(single_prefill, SinglePrefill);
FLASHINFER_EXPORT_FUNC(blocks_per_sm, BlocksPerSM);
FLASHINFER_EXPORT_FUNC(shared_bytes, SharedBytes);
FLASHINFER_EXPORT_FUNC(shared_bytes_limit, SharedBytesLimit);
FLASHINFER_EXPORT_FUNC(tile_rows, TileRows);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
FLASHINFER_EXPORT_FUNC(kv_dtype, KVDTypeOfModule);
FLASHINFER_EXPORT_FUNC(head_dim, HeadDimOfModule);
FLASHINFER_EXPORT_FUNC(head_dim_vo, HeadDimVOOfModule);
FLASHINFER_EXPORT_FUNC(pos_encoding, PosEncodingOfModule);
