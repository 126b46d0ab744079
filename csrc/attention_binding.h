// Argument checks shared by the attention modules' binding TUs (decode.cc, prefill.cc):
// q/out, KV caches, float32 buffers, LSE, index arrays, RoPE and ALiBi parameters. Include after
// attention_config.h (kDTypeCode, kDTypeBits, kKVDTypeCode, kKVDTypeBits, kHeadDim). Host
// compiler, tvm-ffi.
#pragma once

#include <tvm/ffi/optional.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "tvm_ffi_utils.h"

namespace flashinfer_binding {

using tvm::ffi::Optional;

constexpr int64_t kVec = 8;  // 16-byte vectors of 16-bit elements

inline bool Aligned(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(DataPtr(t)) % 16 == 0;
}

// A q or out tensor: [rows, heads, head_dim] (rank 3) or [heads, head_dim] (rank 2), head_dim
// the module's (prefill's out: its kHeadDimVO).
inline void CheckHeads(const TensorView& t, const char* name, int rank, int64_t rows, int64_t heads,
                       int64_t head_dim = kHeadDim) {
  FLASHINFER_CHECK(t.ndim() == rank, ValueError)
      << name << " must be " << rank << "-D, got " << t.ndim() << "-D";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(t.size(rank - 1) == head_dim, ValueError)
      << name << " has head_dim " << t.size(rank - 1) << ", this module is for " << head_dim;
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

// A cache tensor of the module's KV dtype: paged [pages, page_size, Hk, D] / [pages, Hk,
// page_size, D] (rank 4) or contiguous [len, Hk, D] / [Hk, len, D] (rank 3, one page); D is
// head_dim (prefill's v: its kHeadDimVO).
inline Strides CacheOf(const TensorView& t, const char* name, int rank, bool hnd, int64_t kv_heads,
                       int64_t* page_size, int64_t head_dim = kHeadDim) {
  FLASHINFER_CHECK(t.ndim() == rank, ValueError)
      << name << " must be " << rank << "-D, got " << t.ndim() << "-D";
  CheckDType(t, name, kKVDTypeCode, kKVDTypeBits);
  constexpr int64_t kCopyElems = 128 / kKVDTypeBits;  // elements of 16 bytes
  FLASHINFER_CHECK(t.size(rank - 1) == head_dim && t.stride(rank - 1) == 1, ValueError)
      << name << " must end in a contiguous head_dim of " << head_dim;
  const int base = rank - 3;  // 1 for paged caches
  const int slot_dim = base + (hnd ? 1 : 0), head_dim_index = base + (hnd ? 0 : 1);
  FLASHINFER_CHECK(t.size(head_dim_index) == kv_heads, ValueError)
      << name << " has " << t.size(head_dim_index) << " kv heads, expected " << kv_heads;
  for (int i = 0; i < rank - 1; ++i) {
    FLASHINFER_CHECK(t.size(i) <= 1 || t.stride(i) % kCopyElems == 0, ValueError)
        << name << "'s strides must be multiples of " << kCopyElems << " elements (16 bytes)";
  }
  FLASHINFER_CHECK(Aligned(t), ValueError) << name << " must be 16-byte aligned";
  *page_size = t.size(slot_dim);
  return {rank == 4 ? t.stride(0) : 0, t.stride(slot_dim), t.stride(head_dim_index)};
}

inline void CheckFloatBuffer(const TensorView& t, const char* name, int64_t elements) {
  CheckDType(t, name, kDLFloat, 32);
  FLASHINFER_CHECK(t.ndim() >= 1, ValueError) << name << " must not be a scalar";
  int64_t numel = 1;
  for (int i = 0; i < t.ndim(); ++i) numel *= t.size(i);
  FLASHINFER_CHECK(numel >= elements, ValueError)
      << name << " has " << numel << " elements, needs " << elements;
  FLASHINFER_CHECK(t.ndim() == 1 ? t.stride(0) == 1 || numel <= 1 : true, ValueError)
      << name << " must be contiguous";
}

inline float* LseOf(const Optional<TensorView>& lse, int64_t rows, int64_t heads,
                    const TensorView& q) {
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

// A 1-D contiguous int32 tensor of at least `elements` entries on q's device.
inline const int32_t* IndexArray(const TensorView& t, const char* name, int64_t elements,
                                 const TensorView& q) {
  CheckDType(t, name, kDLInt, 32);
  FLASHINFER_CHECK(t.ndim() == 1 && (t.size(0) <= 1 || t.stride(0) == 1), ValueError)
      << name << " must be 1-D and contiguous";
  FLASHINFER_CHECK(t.size(0) >= elements, ValueError)
      << name << " has " << t.size(0) << " elements, needs " << elements;
  CheckSameDevice(q, t, "q", name);
  return static_cast<const int32_t*>(DataPtr(t));
}

// A paged cache's page ids (IndexArray's checks), never null: the kernels read a null table
// as a contiguous cache, and an empty tensor's data pointer may be null. An empty table
// points at `stand_in` instead, which its length (0 entries) keeps from ever being read.
inline const int32_t* PageIndices(const TensorView& t, const int32_t* stand_in,
                                  const TensorView& q) {
  const int32_t* indices = IndexArray(t, "kv_indices", 0, q);
  return indices != nullptr ? indices : stand_in;
}

// RoPE's 1 / rope_scale and 1 / rope_theta (read by the RoPE builds, checked by all).
inline void CheckRope(double rope_rcp_scale, double rope_rcp_theta) {
  FLASHINFER_CHECK(rope_rcp_scale > 0 && rope_rcp_theta > 0 && std::isfinite(rope_rcp_scale) &&
                       std::isfinite(rope_rcp_theta),
                   ValueError)
      << "rope_rcp_scale and rope_rcp_theta must be positive and finite, got " << rope_rcp_scale
      << " and " << rope_rcp_theta;
}

// ALiBi's slopes (log2 units): the ALiBi builds need float32 [>= num_qo_heads] on q's device,
// and no soft cap (the reference's cap after ALiBi scales the scores twice); the other builds
// take none.
inline const float* AlibiSlopesOf(const Optional<TensorView>& slopes, int64_t qo_heads,
                                  double score_cap, const TensorView& q) {
  if (!kAlibi) {
    FLASHINFER_CHECK(!slopes.has_value(), ValueError)
        << "alibi_slopes given to a module built for pos_encoding_mode " << kPosEncodingName;
    return nullptr;
  }
  FLASHINFER_CHECK(slopes.has_value(), ValueError) << "this ALiBi module needs alibi_slopes";
  FLASHINFER_CHECK(score_cap <= 0, ValueError) << "ALiBi does not combine with a logits soft cap";
  const TensorView& t = slopes.value();
  CheckDType(t, "alibi_slopes", kDLFloat, 32);
  FLASHINFER_CHECK(t.ndim() == 1 && t.size(0) >= qo_heads && (t.size(0) <= 1 || t.stride(0) == 1),
                   ValueError)
      << "alibi_slopes must be 1-D and contiguous with at least " << qo_heads << " elements";
  CheckSameDevice(q, t, "q", "alibi_slopes");
  return static_cast<const float*>(DataPtr(t));
}

// Every tensor on q's device.
inline void CheckDevices(const TensorView& q,
                         std::initializer_list<std::pair<const TensorView*, const char*>> tensors) {
  for (const auto& [t, name] : tensors) CheckSameDevice(q, *t, "q", name);
}

}  // namespace flashinfer_binding
