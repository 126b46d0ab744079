// Binding TU of the norm module (host compiler): checks arguments, finds the stream,
// calls the launchers from norm_kernel.cu, and exports functions through tvm-ffi.
#include <tvm/ffi/function.h>

#include <limits>

#include "norm_config.h"
#include "norm_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

// [tokens, hidden] or [tokens, heads, head_dim] with a contiguous last dim.
NormLayout RowsOf(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.ndim() == 2 || t.ndim() == 3, ValueError)
      << name << " must be 2-D [tokens, hidden] or 3-D [tokens, heads, head_dim], got "
      << t.ndim() << "-D";
  const int64_t last = t.ndim() - 1;
  FLASHINFER_CHECK(t.size(last) <= 1 || t.stride(last) == 1, ValueError)
      << name << "'s last dim must be contiguous (stride " << t.stride(last) << ")";
  // Strides of size-1 dims are never used; zero keeps them out of the alignment test.
  const int64_t token_stride = t.size(0) > 1 ? t.stride(0) : 0;
  if (t.ndim() == 2) return {1, token_stride, 0};
  return {t.size(1), token_stride, t.size(1) > 1 ? t.stride(1) : 0};
}

int64_t RowCount(const TensorView& t) {
  const int64_t rows = t.ndim() == 2 ? t.size(0) : t.size(0) * t.size(1);
  FLASHINFER_CHECK(rows <= std::numeric_limits<int32_t>::max(), ValueError)
      << "at most 2^31 - 1 rows are supported, got " << rows;
  return rows;
}

void CheckSameShape(const TensorView& a, const TensorView& b, const char* a_name,
                    const char* b_name) {
  bool same = a.ndim() == b.ndim();
  for (int i = 0; same && i < a.ndim(); ++i) same = a.size(i) == b.size(i);
  FLASHINFER_CHECK(same, ValueError) << a_name << " and " << b_name << " differ in shape";
}

void CheckVector(const TensorView& v, const char* name, int64_t hidden) {
  FLASHINFER_CHECK(v.ndim() == 1, ValueError)
      << name << " must be 1-D [hidden], got " << v.ndim() << "-D";
  FLASHINFER_CHECK(v.size(0) == hidden, ValueError)
      << name << " has " << v.size(0) << " elements, the input's last dim is " << hidden;
  FLASHINFER_CHECK(hidden <= 1 || v.stride(0) == 1, ValueError)
      << name << " must be contiguous (stride " << v.stride(0) << ")";
}

// Shapes, dtypes and strides are checked before the device, so each mistake gets its own
// message; the kernels rely on every check here.
void RMSNormImpl(TensorView out, TensorView input, TensorView weight, double eps,
                 float weight_offset) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout out_layout = RowsOf(out, "out");
  CheckSameShape(out, input, "out", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(weight, "weight", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  CheckDType(out, "out", kDTypeCode, kDTypeBits);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, weight, "input", "weight");
  CheckSameDevice(input, out, "input", "out");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(rmsnorm_launch(DataPtr(out), DataPtr(input), DataPtr(weight), rows, hidden,
                                in_layout, out_layout, static_cast<float>(eps), weight_offset,
                                CurrentStream(device)),
                 "rmsnorm kernel launch");
}

void FusedAddRMSNormImpl(TensorView input, TensorView residual, TensorView weight, double eps,
                         float weight_offset) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout res_layout = RowsOf(residual, "residual");
  CheckSameShape(residual, input, "residual", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(weight, "weight", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(residual, "residual", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(DataPtr(input) != DataPtr(residual) || input.numel() == 0, ValueError)
      << "input and residual must be different tensors";
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, residual, "input", "residual");
  CheckSameDevice(input, weight, "input", "weight");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(fused_add_rmsnorm_launch(DataPtr(input), DataPtr(residual), DataPtr(weight),
                                          rows, hidden, in_layout, res_layout,
                                          static_cast<float>(eps), weight_offset,
                                          CurrentStream(device)),
                 "fused_add_rmsnorm kernel launch");
}

void RMSNorm(TensorView out, TensorView input, TensorView weight, double eps) {
  RMSNormImpl(out, input, weight, eps, 0.f);
}

void GemmaRMSNorm(TensorView out, TensorView input, TensorView weight, double eps) {
  RMSNormImpl(out, input, weight, eps, 1.f);
}

void FusedAddRMSNorm(TensorView input, TensorView residual, TensorView weight, double eps) {
  FusedAddRMSNormImpl(input, residual, weight, eps, 0.f);
}

void GemmaFusedAddRMSNorm(TensorView input, TensorView residual, TensorView weight, double eps) {
  FusedAddRMSNormImpl(input, residual, weight, eps, 1.f);
}

void LayerNorm(TensorView out, TensorView input, TensorView gamma, TensorView beta, double eps) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout out_layout = RowsOf(out, "out");
  CheckSameShape(out, input, "out", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(gamma, "gamma", hidden);
  CheckVector(beta, "beta", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(out, "out", kDTypeCode, kDTypeBits);
  CheckDType(gamma, "gamma", kDLFloat, 32);
  CheckDType(beta, "beta", kDLFloat, 32);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, out, "input", "out");
  CheckSameDevice(input, gamma, "input", "gamma");
  CheckSameDevice(input, beta, "input", "beta");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(layernorm_launch(DataPtr(out), DataPtr(input),
                                  static_cast<const float*>(DataPtr(gamma)),
                                  static_cast<const float*>(DataPtr(beta)), rows, hidden,
                                  in_layout, out_layout, static_cast<float>(eps),
                                  CurrentStream(device)),
                 "layernorm kernel launch");
}

// Host-only: names the dtype this module was built for (used by tests and tools).
tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, RMSNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_rmsnorm, GemmaRMSNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_add_rmsnorm, FusedAddRMSNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemma_fused_add_rmsnorm, GemmaFusedAddRMSNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(layernorm, LayerNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dtype, DTypeOfModule);
