// Binding TU of the norm module (host compiler): checks arguments, finds the stream,
// calls the launchers from norm_kernel.cu, and exports functions through tvm-ffi.
#include <tvm/ffi/function.h>

#include "ffi_export.h"
#include "norm_binding.h"
#include "norm_config.h"
#include "norm_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

// Shapes, dtypes and strides are checked before the device, so each mistake gets its own
// message; the kernels rely on every check here.
void RMSNormImpl(TensorView out, TensorView input, TensorView weight, double eps, bool enable_pdl,
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
                                enable_pdl, CurrentStream(device)),
                 "rmsnorm kernel launch");
}

void FusedAddRMSNormImpl(TensorView input, TensorView residual, TensorView weight, double eps,
                         bool enable_pdl, float weight_offset) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout res_layout = RowsOf(residual, "residual");
  CheckResidual(residual, input);
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(weight, "weight", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(residual, "residual", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, residual, "input", "residual");
  CheckSameDevice(input, weight, "input", "weight");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(fused_add_rmsnorm_launch(DataPtr(input), DataPtr(residual), DataPtr(weight), rows,
                                          hidden, in_layout, res_layout, static_cast<float>(eps),
                                          weight_offset, enable_pdl, CurrentStream(device)),
                 "fused_add_rmsnorm kernel launch");
}

void RMSNorm(TensorView out, TensorView input, TensorView weight, double eps, bool enable_pdl) {
  RMSNormImpl(out, input, weight, eps, enable_pdl, 0.f);
}

void GemmaRMSNorm(TensorView out, TensorView input, TensorView weight, double eps,
                  bool enable_pdl) {
  RMSNormImpl(out, input, weight, eps, enable_pdl, 1.f);
}

void FusedAddRMSNorm(TensorView input, TensorView residual, TensorView weight, double eps,
                     bool enable_pdl) {
  FusedAddRMSNormImpl(input, residual, weight, eps, enable_pdl, 0.f);
}

void GemmaFusedAddRMSNorm(TensorView input, TensorView residual, TensorView weight, double eps,
                          bool enable_pdl) {
  FusedAddRMSNormImpl(input, residual, weight, eps, enable_pdl, 1.f);
}

// `gemma` and `beta` (float32) are named as the reference library's layernorm names them.
void LayerNorm(TensorView out, TensorView input, TensorView gemma, TensorView beta, double eps,
               bool enable_pdl) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout out_layout = RowsOf(out, "out");
  CheckSameShape(out, input, "out", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(gemma, "gemma", hidden);
  CheckVector(beta, "beta", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(out, "out", kDTypeCode, kDTypeBits);
  CheckDType(gemma, "gemma", kDLFloat, 32);
  CheckDType(beta, "beta", kDLFloat, 32);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, out, "input", "out");
  CheckSameDevice(input, gemma, "input", "gemma");
  CheckSameDevice(input, beta, "input", "beta");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(
      layernorm_launch(DataPtr(out), DataPtr(input), static_cast<const float*>(DataPtr(gemma)),
                       static_cast<const float*>(DataPtr(beta)), rows, hidden, in_layout,
                       out_layout, static_cast<float>(eps), enable_pdl, CurrentStream(device)),
      "layernorm kernel launch");
}

// Host-only: names the dtype this module was built for (used by tests and tools).
tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(rmsnorm, RMSNorm);
FLASHINFER_EXPORT_FUNC(gemma_rmsnorm, GemmaRMSNorm);
FLASHINFER_EXPORT_FUNC(fused_add_rmsnorm, FusedAddRMSNorm);
FLASHINFER_EXPORT_FUNC(gemma_fused_add_rmsnorm, GemmaFusedAddRMSNorm);
FLASHINFER_EXPORT_FUNC(layernorm, LayerNorm);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
