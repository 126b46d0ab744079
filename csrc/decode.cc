// Binding TU of the decode module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <limits>

#include "decode_config.h"
#include "decode_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;
using tvm::ffi::Optional;

namespace {

constexpr int64_t kVec = 8;  // 16-byte vectors of 16-bit elements

bool Aligned(const TensorView& t) { return reinterpret_cast<uintptr_t>(DataPtr(t)) % 16 == 0; }

// A q or out tensor: [rows, heads, head_dim] (rank 3) or [heads, head_dim] (rank 2).
void CheckHeads(const TensorView& t, const char* name, int rank, int64_t rows, int64_t heads) {
  FLASHINFER_CHECK(t.ndim() == rank, ValueError)
      << name << " must be " << rank << "-D, got " << t.ndim() << "-D";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(t.size(rank - 1) == kHeadDim, ValueError)
      << name << " has head_dim " << t.size(rank - 1) << ", this module is for " << kHeadDim;
  FLASHINFER_CHECK(heads < 0 || t.size(rank - 2) == heads, ValueError)
      << name << " has " << t.size(rank - 2) << " heads, expected " << heads;
  FLASHINFER_CHECK(rank == 2 || rows < 0 || t.size(0) == rows, ValueError)
      << name << " has " << t.size(0) << " rows, expected " << rows;
  FLASHINFER_CHECK(t.stride(rank - 1) == 1, ValueError) << name << "'s last dim must be contiguous";
  for (int i = 0; i < rank - 1; ++i) {
    FLASHINFER_CHECK(t.size(i) <= 1 || t.stride(i) % kVec == 0, ValueError)
        << name << "'s strides must be multiples of 8 elements (16 bytes)";
  }
  FLASHINFER_CHECK(Aligned(t), ValueError) << name << " must be 16-byte aligned";
}

struct Strides {
  int64_t page, slot, head;
};

// A cache tensor: paged [pages, page_size, Hk, D] / [pages, Hk, page_size, D] (rank 4) or
// contiguous [len, Hk, D] / [Hk, len, D] (rank 3, one page).
Strides CacheOf(const TensorView& t, const char* name, int rank, bool hnd, int64_t kv_heads,
                int64_t* page_size) {
  FLASHINFER_CHECK(t.ndim() == rank, ValueError)
      << name << " must be " << rank << "-D, got " << t.ndim() << "-D";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(t.size(rank - 1) == kHeadDim && t.stride(rank - 1) == 1, ValueError)
      << name << " must end in a contiguous head_dim of " << kHeadDim;
  const int base = rank - 3;  // 1 for paged caches
  const int slot_dim = base + (hnd ? 1 : 0), head_dim_index = base + (hnd ? 0 : 1);
  FLASHINFER_CHECK(t.size(head_dim_index) == kv_heads, ValueError)
      << name << " has " << t.size(head_dim_index) << " kv heads, expected " << kv_heads;
  for (int i = 0; i < rank - 1; ++i) {
    FLASHINFER_CHECK(t.size(i) <= 1 || t.stride(i) % kVec == 0, ValueError)
        << name << "'s strides must be multiples of 8 elements (16 bytes)";
  }
  FLASHINFER_CHECK(Aligned(t), ValueError) << name << " must be 16-byte aligned";
  *page_size = t.size(slot_dim);
  return {rank == 4 ? t.stride(0) : 0, t.stride(slot_dim), t.stride(head_dim_index)};
}

void CheckFloatBuffer(const TensorView& t, const char* name, int64_t elements) {
  CheckDType(t, name, kDLFloat, 32);
  FLASHINFER_CHECK(t.ndim() >= 1, ValueError) << name << " must not be a scalar";
  int64_t numel = 1;
  for (int i = 0; i < t.ndim(); ++i) numel *= t.size(i);
  FLASHINFER_CHECK(numel >= elements, ValueError)
      << name << " has " << numel << " elements, needs " << elements;
  FLASHINFER_CHECK(t.ndim() == 1 ? t.stride(0) == 1 || numel <= 1 : true, ValueError)
      << name << " must be contiguous";
}

float* LseOf(const Optional<TensorView>& lse, int64_t rows, int64_t heads, const TensorView& q) {
  if (!lse.has_value()) return nullptr;
  const TensorView& t = lse.value();
  CheckDType(t, "lse", kDLFloat, 32);
  const bool shape_ok = rows < 0 ? (t.ndim() == 1 && t.size(0) == heads)
                                 : (t.ndim() == 2 && t.size(0) == rows && t.size(1) == heads);
  FLASHINFER_CHECK(shape_ok, ValueError) << "lse has the wrong shape";
  FLASHINFER_CHECK(t.stride(t.ndim() - 1) == 1 || heads <= 1, ValueError)
      << "lse must be contiguous";
  FLASHINFER_CHECK(t.ndim() == 1 || t.size(0) <= 1 || t.stride(0) == heads, ValueError)
      << "lse must be contiguous";
  CheckSameDevice(q, t, "q", "lse");
  return static_cast<float*>(DataPtr(t));
}

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
                      double score_scale, double score_cap) {
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
  return launch;
}

// A 1-D contiguous int32 tensor of at least `elements` entries on q's device.
const int32_t* IndexArray(const TensorView& t, const char* name, int64_t elements,
                          const TensorView& q) {
  CheckDType(t, name, kDLInt, 32);
  FLASHINFER_CHECK(t.ndim() == 1 && (t.size(0) <= 1 || t.stride(0) == 1), ValueError)
      << name << " must be 1-D and contiguous";
  FLASHINFER_CHECK(t.size(0) >= elements, ValueError)
      << name << " has " << t.size(0) << " elements, needs " << elements;
  CheckSameDevice(q, t, "q", name);
  return static_cast<const int32_t*>(DataPtr(t));
}

void BatchDecode(TensorView q, TensorView k_cache, TensorView v_cache, TensorView kv_indptr,
                 TensorView kv_indices, TensorView kv_last_page_len, TensorView plan,
                 TensorView tmp_v, TensorView tmp_lse, TensorView out, Optional<TensorView> lse,
                 bool hnd, int64_t work_capacity, int64_t merge_capacity, int64_t tmp_capacity,
                 int64_t grid_work, int64_t grid_merge, int64_t window_left, double score_scale,
                 double score_cap, bool enable_pdl) {
  CheckHeads(q, "q", 3, -1, -1);
  const int64_t batch = q.size(0), qo_heads = q.size(1);
  CheckHeads(out, "out", 3, batch, qo_heads);
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
  const int32_t* indices = IndexArray(kv_indices, "kv_indices", 0, q);
  const int32_t* last_page_len = IndexArray(kv_last_page_len, "kv_last_page_len", batch, q);
  FLASHINFER_CHECK(work_capacity >= grid_work && merge_capacity >= grid_merge && grid_work >= 0 &&
                       grid_merge >= 0 && window_left >= -1,
                   ValueError) << "the launch does not match the schedule";
  const int32_t* plan_ptr =
      IndexArray(plan, "plan", 4 + 4 * work_capacity + 2 * merge_capacity, q);
  // the plan's tmp rows are < tmp_capacity
  CheckFloatBuffer(tmp_v, "tmp_v", tmp_capacity * qo_heads * kHeadDim);
  CheckFloatBuffer(tmp_lse, "tmp_lse", tmp_capacity * qo_heads);
  float* lse_ptr = LseOf(lse, batch, qo_heads, q);
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, {&v_cache, "v_cache"},
                                {&tmp_v, "tmp_v"}, {&tmp_lse, "tmp_lse"}, {&out, "out"}}) {
    CheckSameDevice(q, *t, "q", name);
  }
  const DecodeKV kv{DataPtr(k_cache), DataPtr(v_cache), ks.page, ks.slot, ks.head, vs.page,
                    vs.slot, vs.head, indices, indptr, last_page_len, page_size,
                    kv_indices.size(0), k_cache.size(0)};
  DecodeLaunch launch = LaunchOf(q, out, lse_ptr, tmp_v, tmp_lse, kv_heads, score_scale,
                                 score_cap);
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
                  bool enable_pdl) {
  CheckHeads(q, "q", 2, -1, -1);
  const int64_t qo_heads = q.size(0);
  CheckHeads(out, "out", 2, -1, qo_heads);
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
  for (const auto& [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&tmp_v, "tmp_v"},
                                {&tmp_lse, "tmp_lse"}, {&out, "out"}}) {
    CheckSameDevice(q, *t, "q", name);
  }
  const DecodeKV kv{DataPtr(k), DataPtr(v), 0, ks.slot, ks.head, 0, vs.slot, vs.head,
                    nullptr, nullptr, nullptr, std::max<int64_t>(kv_len, 1), 0, 1};
  DecodeLaunch launch = LaunchOf(q, out, lse_ptr, tmp_v, tmp_lse, kv_heads, score_scale,
                                 score_cap);
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
int64_t HeadDimOfModule() { return kHeadDim; }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(batch_decode, BatchDecode);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(single_decode, SingleDecode);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(blocks_per_sm, BlocksPerSM);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dtype, DTypeOfModule);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(head_dim, HeadDimOfModule);
