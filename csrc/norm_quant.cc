// Binding TU of the norm_quant module (host compiler): RMSNorm with an fp8 e4m3 output.
// Checks arguments, finds the stream, calls norm_quant_kernel.cu's launchers, exports.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cmath>

#include "ffi_export.h"
#include "norm_binding.h"
#include "norm_quant_config.h"
#include "norm_quant_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;
using tvm::ffi::Optional;

namespace {

void CheckFp8Out(const TensorView& out) {
  const DLDataType dt = out.dtype();
  FLASHINFER_CHECK(dt.code == kDLFloat8_e4m3fn && dt.bits == 8 && dt.lanes == 1, TypeError)
      << "out has dtype " << DTypeName(dt) << ", expected float8_e4m3fn";
}

// The scale: a float32 scalar tensor ([] or [1]) or, when there is none, `value`, a finite
// positive number. Returns the tensor's data (null for `value`); its device is checked by
// CheckScaleDevice, after the input's.
const float* CheckScale(const Optional<TensorView>& scale, double value) {
  if (!scale.has_value()) {
    FLASHINFER_CHECK(std::isfinite(value) && value > 0, ValueError)
        << "scale must be finite and > 0, got " << value;
    return nullptr;
  }
  const TensorView& s = scale.value();
  FLASHINFER_CHECK(s.ndim() == 0 || (s.ndim() == 1 && s.size(0) == 1), ValueError)
      << "scale must be a scalar tensor or have shape (1,)";
  CheckDType(s, "scale", kDLFloat, 32);
  return static_cast<const float*>(DataPtr(s));
}

void CheckScaleDevice(const Optional<TensorView>& scale, const TensorView& input) {
  if (scale.has_value()) CheckSameDevice(input, scale.value(), "input", "scale");
}

void RMSNormQuant(TensorView out, TensorView input, TensorView weight, Optional<TensorView> scale,
                  double scale_value, double eps, bool enable_pdl) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout out_layout = RowsOf(out, "out");
  CheckSameShape(out, input, "out", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(weight, "weight", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  CheckFp8Out(out);
  const float* scale_ptr = CheckScale(scale, scale_value);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, weight, "input", "weight");
  CheckSameDevice(input, out, "input", "out");
  CheckScaleDevice(scale, input);
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(
      rmsnorm_quant_launch(DataPtr(out), DataPtr(input), DataPtr(weight), rows, hidden, in_layout,
                           out_layout, scale_ptr, static_cast<float>(scale_value),
                           static_cast<float>(eps), enable_pdl, CurrentStream(device)),
      "rmsnorm_quant kernel launch");
}

void FusedAddRMSNormQuant(TensorView out, TensorView input, TensorView residual, TensorView weight,
                          Optional<TensorView> scale, double scale_value, double eps,
                          bool enable_pdl) {
  const NormLayout in_layout = RowsOf(input, "input");
  const NormLayout res_layout = RowsOf(residual, "residual");
  const NormLayout out_layout = RowsOf(out, "out");
  CheckResidual(residual, input);
  CheckSameShape(out, input, "out", "input");
  const int64_t hidden = input.size(input.ndim() - 1);
  CheckVector(weight, "weight", hidden);
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(residual, "residual", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  CheckFp8Out(out);
  const float* scale_ptr = CheckScale(scale, scale_value);
  const int64_t rows = RowCount(input);
  CheckCuda(input, "input");
  CheckSameDevice(input, residual, "input", "residual");
  CheckSameDevice(input, weight, "input", "weight");
  CheckSameDevice(input, out, "input", "out");
  CheckScaleDevice(scale, input);
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(fused_add_rmsnorm_quant_launch(
                     DataPtr(out), DataPtr(input), DataPtr(residual), DataPtr(weight), rows, hidden,
                     in_layout, res_layout, out_layout, scale_ptr, static_cast<float>(scale_value),
                     static_cast<float>(eps), enable_pdl, CurrentStream(device)),
                 "fused_add_rmsnorm_quant kernel launch");
}

// Host-only: names the input dtype this module was built for (used by tests and tools).
tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(rmsnorm_quant, RMSNormQuant);
FLASHINFER_EXPORT_FUNC(fused_add_rmsnorm_quant, FusedAddRMSNormQuant);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
