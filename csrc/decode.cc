// Binding TU of the decode module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <limits>

#include "attention_config.h"
#include "attention_binding.h"
#include "decode_launcher.h"
#include "ffi_export.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;
using tvm::ffi::Optional;

namespace {

int64_t GroupOf(int64_t qo_heads, int64_t kv_heads) {
  FLASHINFER_CHECK(kv_heads >= 1 && qo_heads % kv_heads == 0, ValueError)
      << "num_qo_heads (" << qo_heads << ") must be a multiple of num_kv_heads (" << kv_heads
      << ")";
  const int64_t group = qo_heads / kv_heads;
  FLASHINFER_CHECK(group * (kHeadDim / kVec) <= 1024, ValueError)
      << "group size " << group << " is too large for head_dim " << kHeadDim;
  // grid.y is kv_heads for decode and qo_heads for the split-KV merge
  FLASHINFER_CHECK(qo_heads <= 65535, ValueError)
      << "num_qo_heads " << qo_heads << " exceeds 65535";
  return group;
}

// The fields batch and single decode share. q and out are [batch, heads, dim] or, for a
// single request, [heads, dim] (batch stride 0).
DecodeLaunch LaunchOf(const TensorView& q, const TensorView& out, float* lse,
                      const TensorView& tmp_v, const TensorView& tmp_lse, int64_t kv_heads,
                      double score_scale, double score_cap, double rope_rcp_scale,
                      double rope_rcp_theta) {
  const bool batched = q.ndim() == 3;
  DecodeLaunch launch{};
  launch.q = DataPtr(q);
  launch.q_batch_stride = batched ? q.stride(0) : 0;
  launch.q_head_stride = q.stride(q.ndim() - 2);
  launch.out = DataPtr(out);
  launch.out_batch_stride = batched ? out.stride(0) : 0;
  launch.out_head_stride = out.stride(out.ndim() - 2);
  launch.lse = lse;
  launch.tmp_v = static_cast<float*>(DataPtr(tmp_v));
  launch.tmp_lse = static_cast<float*>(DataPtr(tmp_lse));
  launch.num_qo_heads = q.size(q.ndim() - 2);
  launch.num_kv_heads = kv_heads;
  launch.score_scale = static_cast<float>(score_scale);
  launch.score_cap = static_cast<float>(score_cap);
  launch.rope_rcp_scale = static_cast<float>(rope_rcp_scale);
  launch.rope_rcp_theta = static_cast<float>(rope_rcp_theta);
  return launch;
}

void BatchDecode(TensorView q, TensorView k_cache, TensorView v_cache, TensorView kv_indptr,
                 TensorView kv_indices, TensorView kv_last_page_len, TensorView plan,
                 TensorView tmp_v, TensorView tmp_lse, TensorView out, Optional<TensorView> lse,
                 bool hnd, int64_t work_capacity, int64_t merge_capacity, int64_t tmp_capacity,
                 int64_t grid_work, int64_t grid_merge, int64_t window_left, double score_scale,
                 double score_cap, double rope_rcp_scale, double rope_rcp_theta,
                 Optional<TensorView> alibi_slopes, bool enable_pdl) {
  CheckRope(rope_rcp_scale, rope_rcp_theta);
  CheckHeads(q, "q", 3, -1, -1);
  const int64_t batch = q.size(0), qo_heads = q.size(1);
  CheckHeads(out, "out", 3, batch, qo_heads);
  const float* slopes = AlibiSlopesOf(alibi_slopes, qo_heads, score_cap, q);
  int64_t page_size = 0, v_page_size = 0;
  FLASHINFER_CHECK(k_cache.ndim() == 4, ValueError)
      << "k_cache must be 4-D, got " << k_cache.ndim() << "-D";
  const int64_t kv_heads = hnd ? k_cache.size(1) : k_cache.size(2);
  GroupOf(qo_heads, kv_heads);
  const Strides ks = CacheOf(k_cache, "k_cache", 4, hnd, kv_heads, &page_size);
  const Strides vs = CacheOf(v_cache, "v_cache", 4, hnd, kv_heads, &v_page_size);
  FLASHINFER_CHECK(page_size == v_page_size && k_cache.size(0) == v_cache.size(0), ValueError)
      << "k_cache and v_cache differ in pages or page_size";
  FLASHINFER_CHECK(page_size >= 1, ValueError) << "page_size must be >= 1";
  CheckCuda(q, "q");
  const int32_t* indptr = IndexArray(kv_indptr, "kv_indptr", batch + 1, q);
  const int32_t* indices = PageIndices(kv_indices, indptr, q);
  const int32_t* last_page_len = IndexArray(kv_last_page_len, "kv_last_page_len", batch, q);
  FLASHINFER_CHECK(work_capacity >= grid_work && merge_capacity >= grid_merge && grid_work >= 0 &&
                       grid_merge >= 0 && window_left >= -1,
                   ValueError)
      << "the launch does not match the schedule";
  const int32_t* plan_ptr = IndexArray(plan, "plan", 4 + 4 * work_capacity + 2 * merge_capacity, q);
  // the plan's tmp rows are < tmp_capacity
  CheckFloatBuffer(tmp_v, "tmp_v", tmp_capacity * qo_heads * kHeadDim);
  CheckFloatBuffer(tmp_lse, "tmp_lse", tmp_capacity * qo_heads);
  float* lse_ptr = LseOf(lse, batch, qo_heads, q);
  CheckDevices(q, {{&k_cache, "k_cache"},
                   {&v_cache, "v_cache"},
                   {&tmp_v, "tmp_v"},
                   {&tmp_lse, "tmp_lse"},
                   {&out, "out"}});
  const DecodeKV kv{DataPtr(k_cache),
                    DataPtr(v_cache),
                    ks.page,
                    ks.slot,
                    ks.head,
                    vs.page,
                    vs.slot,
                    vs.head,
                    indices,
                    indptr,
                    last_page_len,
                    page_size,
                    kv_indices.size(0),
                    k_cache.size(0)};
  DecodeLaunch launch = LaunchOf(q, out, lse_ptr, tmp_v, tmp_lse, kv_heads, score_scale, score_cap,
                                 rope_rcp_scale, rope_rcp_theta);
  launch.alibi_slopes = slopes;
  launch.plan = plan_ptr;
  launch.work_capacity = work_capacity;
  launch.merge_capacity = merge_capacity;
  launch.grid_work = grid_work;
  launch.grid_merge = grid_merge;
  launch.window_left = window_left;
  launch.pdl = enable_pdl;
  CudaDeviceGuard guard(q.device().device_id);
  CheckCudaError(decode_launch(kv, launch, CurrentStream(q.device())), "batch decode launch");
}

void SingleDecode(TensorView q, TensorView k, TensorView v, TensorView tmp_v, TensorView tmp_lse,
                  TensorView out, Optional<TensorView> lse, bool hnd, int64_t window_left,
                  int64_t chunk_tokens, int64_t num_chunks, double score_scale, double score_cap,
                  double rope_rcp_scale, double rope_rcp_theta, Optional<TensorView> alibi_slopes,
                  bool enable_pdl) {
  CheckRope(rope_rcp_scale, rope_rcp_theta);
  CheckHeads(q, "q", 2, -1, -1);
  const int64_t qo_heads = q.size(0);
  CheckHeads(out, "out", 2, -1, qo_heads);
  const float* slopes = AlibiSlopesOf(alibi_slopes, qo_heads, score_cap, q);
  FLASHINFER_CHECK(k.ndim() == 3, ValueError) << "k must be 3-D, got " << k.ndim() << "-D";
  const int64_t kv_heads = hnd ? k.size(0) : k.size(1);
  GroupOf(qo_heads, kv_heads);
  int64_t kv_len = 0, v_len = 0;
  const Strides ks = CacheOf(k, "k", 3, hnd, kv_heads, &kv_len);
  const Strides vs = CacheOf(v, "v", 3, hnd, kv_heads, &v_len);
  FLASHINFER_CHECK(kv_len == v_len, ValueError) << "k has " << kv_len << " tokens, v " << v_len;
  FLASHINFER_CHECK(window_left >= -1 && chunk_tokens >= 1 && num_chunks >= 1, ValueError)
      << "window_left, chunk_tokens and num_chunks are out of range";
  CheckFloatBuffer(tmp_v, "tmp_v", num_chunks > 1 ? num_chunks * qo_heads * kHeadDim : 0);
  CheckFloatBuffer(tmp_lse, "tmp_lse", num_chunks > 1 ? num_chunks * qo_heads : 0);
  float* lse_ptr = LseOf(lse, -1, qo_heads, q);
  CheckCuda(q, "q");
  CheckDevices(q, {{&k, "k"}, {&v, "v"}, {&tmp_v, "tmp_v"}, {&tmp_lse, "tmp_lse"}, {&out, "out"}});
  const DecodeKV kv{DataPtr(k), DataPtr(v), 0,       ks.slot, ks.head, 0,
                    vs.slot,    vs.head,    nullptr, nullptr, nullptr, std::max<int64_t>(kv_len, 1),
                    0,          1};
  DecodeLaunch launch = LaunchOf(q, out, lse_ptr, tmp_v, tmp_lse, kv_heads, score_scale, score_cap,
                                 rope_rcp_scale, rope_rcp_theta);
  launch.alibi_slopes = slopes;
  launch.grid_work = num_chunks;
  launch.chunk_tokens = chunk_tokens;
  launch.window_left = window_left;
  launch.single_len = kv_len;
  launch.pdl = enable_pdl;
  CudaDeviceGuard guard(q.device().device_id);
  CheckCudaError(decode_launch(kv, launch, CurrentStream(q.device())), "single decode launch");
}

int64_t BlocksPerSM(int64_t group) {
  FLASHINFER_CHECK(group >= 1 && group * (kHeadDim / kVec) <= 1024, ValueError)
      << "group size " << group << " is out of range";
  int blocks = 0;
  CheckCudaError(decode_blocks_per_sm(static_cast<int>(group), &blocks), "occupancy query");
  return blocks;
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }
tvm::ffi::String KVDTypeOfModule() { return kKVDTypeName; }
int64_t HeadDimOfModule() { return kHeadDim; }
tvm::ffi::String PosEncodingOfModule() { return kPosEncodingName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(batch_decode, BatchDecode);
FLASHINFER_EXPORT_FUNC(single_decode, SingleDecode);
FLASHINFER_EXPORT_FUNC(blocks_per_sm, BlocksPerSM);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
FLASHINFER_EXPORT_FUNC(kv_dtype, KVDTypeOfModule);
FLASHINFER_EXPORT_FUNC(head_dim, HeadDimOfModule);
FLASHINFER_EXPORT_FUNC(pos_encoding, PosEncodingOfModule);
