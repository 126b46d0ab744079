// Argument checks shared by the binding TUs of the norm and norm_quant modules (host
// compiler, tvm-ffi). Never included by kernel TUs.
#pragma once

#include <cstdint>
#include <limits>

#include "norm_launcher.h"
#include "tvm_ffi_utils.h"

namespace flashinfer_binding {

// [tokens, hidden] or [tokens, heads, head_dim] with a contiguous last dim.
inline NormLayout RowsOf(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.ndim() == 2 || t.ndim() == 3, ValueError)
      << name << " must be 2-D [tokens, hidden] or 3-D [tokens, heads, head_dim], got " << t.ndim()
      << "-D";
  const int64_t last = t.ndim() - 1;
  FLASHINFER_CHECK(t.size(last) <= 1 || t.stride(last) == 1, ValueError)
      << name << "'s last dim must be contiguous (stride " << t.stride(last) << ")";
  // Strides of size-1 dims are never used; zero keeps them out of the alignment test.
  const int64_t token_stride = t.size(0) > 1 ? t.stride(0) : 0;
  if (t.ndim() == 2) return {1, token_stride, 0};
  return {t.size(1), token_stride, t.size(1) > 1 ? t.stride(1) : 0};
}

inline int64_t RowCount(const TensorView& t) {
  const int64_t rows = t.ndim() == 2 ? t.size(0) : t.size(0) * t.size(1);
  FLASHINFER_CHECK(rows <= std::numeric_limits<int32_t>::max(), ValueError)
      << "at most 2^31 - 1 rows are supported, got " << rows;
  return rows;
}

inline void CheckSameShape(const TensorView& a, const TensorView& b, const char* a_name,
                           const char* b_name) {
  bool same = a.ndim() == b.ndim();
  for (int i = 0; same && i < a.ndim(); ++i) same = a.size(i) == b.size(i);
  FLASHINFER_CHECK(same, ValueError) << a_name << " and " << b_name << " differ in shape";
}

inline void CheckVector(const TensorView& v, const char* name, int64_t hidden) {
  FLASHINFER_CHECK(v.ndim() == 1, ValueError)
      << name << " must be 1-D [hidden], got " << v.ndim() << "-D";
  FLASHINFER_CHECK(v.size(0) == hidden, ValueError)
      << name << " has " << v.size(0) << " elements, the input's last dim is " << hidden;
  FLASHINFER_CHECK(hidden <= 1 || v.stride(0) == 1, ValueError)
      << name << " must be contiguous (stride " << v.stride(0) << ")";
}

// input and residual of a fused add: distinct tensors of the same shape.
inline void CheckResidual(const TensorView& residual, const TensorView& input) {
  CheckSameShape(residual, input, "residual", "input");
  FLASHINFER_CHECK(DataPtr(input) != DataPtr(residual) || input.numel() == 0, ValueError)
      << "input and residual must be different tensors";
}

}  // namespace flashinfer_binding
