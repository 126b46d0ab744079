// Binding TU of the cascade module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>

#include "cascade_config.h"
#include "cascade_launcher.h"
#include "ffi_export.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;
using tvm::ffi::Optional;

namespace {

constexpr int64_t kMaxHeadDim = 512;

// Row-major with no gaps; a tensor without elements is, whatever strides it reports.
bool Contiguous(const TensorView& t) {
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.size(i) == 0) return true;
  }
  int64_t expected = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expected) return false;
    expected *= t.size(i);
  }
  return true;
}

// v: [positions, heads, head_dim] (3-D) or with a states dim (4-D); s: v's shape minus head_dim.
void CheckState(const TensorView& v, const TensorView& s, const char* v_name, const char* s_name,
                int rank, uint8_t code, uint8_t bits) {
  FLASHINFER_CHECK(v.ndim() == rank && s.ndim() == rank - 1, ValueError)
      << v_name << " must be " << rank << "-D and " << s_name << " " << rank - 1 << "-D";
  for (int i = 0; i < rank - 1; ++i) {
    FLASHINFER_CHECK(v.size(i) == s.size(i), ValueError)
        << s_name << " has shape mismatching " << v_name << " at dim " << i;
  }
  CheckDType(v, v_name, code, bits);
  CheckDType(s, s_name, kDLFloat, 32);
  FLASHINFER_CHECK(Contiguous(v) && Contiguous(s), ValueError)
      << v_name << " and " << s_name << " must be contiguous";
  FLASHINFER_CHECK(v.size(rank - 1) <= kMaxHeadDim, ValueError)
      << "head_dim must be <= " << kMaxHeadDim;
  FLASHINFER_CHECK(v.size(rank - 2) <= 65535, ValueError) << "too many heads";
  // the merge grid's x: a position count past int32 would wrap in its dim3
  FLASHINFER_CHECK(v.size(0) <= INT32_MAX, ValueError) << "too many positions";
}

void SameShape(const TensorView& a, const TensorView& b, const char* a_name, const char* b_name) {
  bool same = a.ndim() == b.ndim();
  for (int i = 0; same && i < a.ndim(); ++i) same = a.size(i) == b.size(i);
  FLASHINFER_CHECK(same, ValueError) << a_name << " and " << b_name << " differ in shape";
}

StateTensors In(const TensorView& v, const TensorView& s) {
  const int r = v.ndim();
  return {DataPtr(v),
          static_cast<const float*>(DataPtr(s)),
          v.size(r - 2) * v.size(r - 1),
          v.size(r - 1),
          s.size(s.ndim() - 1),
          1};
}

StateOutput Out(const TensorView& v, const TensorView& s) {
  return {DataPtr(v), static_cast<float*>(DataPtr(s)), v.size(1) * v.size(2), v.size(2), s.size(1),
          1};
}

void MergeState(TensorView v_a, TensorView s_a, TensorView v_b, TensorView s_b, TensorView v_out,
                TensorView s_out, Optional<TensorView> mask, bool in_place) {
  CheckState(v_a, s_a, "v_a", "s_a", 3, kDTypeCode, kDTypeBits);
  CheckState(v_b, s_b, "v_b", "s_b", 3, kDTypeCode, kDTypeBits);
  CheckState(v_out, s_out, "v_out", "s_out", 3, kDTypeCode, kDTypeBits);
  SameShape(v_a, v_b, "v_a", "v_b");
  SameShape(v_a, v_out, "v_a", "v_out");
  const uint8_t* mask_ptr = nullptr;
  if (mask.has_value()) {
    const TensorView& m = mask.value();
    FLASHINFER_CHECK(
        m.ndim() == 1 && m.size(0) == v_a.size(0) && (m.size(0) <= 1 || m.stride(0) == 1),
        ValueError)
        << "mask must be 1-D, contiguous, with one entry per position";
    const DLDataType dt = m.dtype();
    FLASHINFER_CHECK((dt.code == kDLBool || dt.code == kDLUInt) && dt.bits == 8, TypeError)
        << "mask has dtype " << DTypeName(dt) << ", expected bool or uint8";
    mask_ptr = static_cast<const uint8_t*>(DataPtr(m));
  }
  CheckCuda(v_a, "v_a");
  for (const auto& [t, name] : {std::pair{&s_a, "s_a"},
                                {&v_b, "v_b"},
                                {&s_b, "s_b"},
                                {&v_out, "v_out"},
                                {&s_out, "s_out"}}) {
    CheckSameDevice(v_a, *t, "v_a", name);
  }
  CudaDeviceGuard guard(v_a.device().device_id);
  CheckCudaError(
      merge_state_launch(Out(v_out, s_out), In(v_a, s_a), In(v_b, s_b), mask_ptr, in_place,
                         v_a.size(0), v_a.size(1), v_a.size(2), CurrentStream(v_a.device())),
      "merge_state kernel launch");
}

void MergeStates(TensorView v, TensorView s, TensorView v_out, TensorView s_out) {
  CheckState(v, s, "v", "s", 4, kDTypeCode, kDTypeBits);
  CheckState(v_out, s_out, "v_out", "s_out", 3, kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(
      v_out.size(0) == v.size(0) && v_out.size(1) == v.size(2) && v_out.size(2) == v.size(3),
      ValueError)
      << "v_out must be [positions, heads, head_dim] of v";
  CheckCuda(v, "v");
  for (const auto& [t, name] : {std::pair{&s, "s"}, {&v_out, "v_out"}, {&s_out, "s_out"}}) {
    CheckSameDevice(v, *t, "v", name);
  }
  CudaDeviceGuard guard(v.device().device_id);
  CheckCudaError(merge_states_launch(Out(v_out, s_out), In(v, s), v.size(0), v.size(1), v.size(2),
                                     v.size(3), CurrentStream(v.device())),
                 "merge_states kernel launch");
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(merge_state, MergeState);
FLASHINFER_EXPORT_FUNC(merge_states, MergeStates);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
