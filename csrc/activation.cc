// Binding TU of the activation module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>

#include "activation_config.h"
#include "activation_launcher.h"
#include "ffi_export.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

void ActAndMul(int act, const char* what, TensorView out, TensorView input, bool enable_pdl) {
  FLASHINFER_CHECK(input.ndim() == 2, ValueError)
      << "input must be 2-D [rows, 2 * d], got " << input.ndim() << "-D";
  FLASHINFER_CHECK(out.ndim() == 2, ValueError)
      << "out must be 2-D [rows, d], got " << out.ndim() << "-D";
  const int64_t rows = input.size(0);
  FLASHINFER_CHECK(input.size(1) % 2 == 0, ValueError)
      << "input's last dim must be even (gate and up halves), got " << input.size(1);
  const int64_t d = input.size(1) / 2;
  FLASHINFER_CHECK(out.size(0) == rows && out.size(1) == d, ValueError)
      << "out has shape [" << out.size(0) << ", " << out.size(1) << "], expected [" << rows << ", "
      << d << "]";
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(out, "out", kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(d == 0 || input.stride(1) == 1, ValueError)
      << "input's last dim must be contiguous (stride " << input.stride(1) << ")";
  FLASHINFER_CHECK(d <= 1 || out.stride(1) == 1, ValueError)
      << "out's last dim must be contiguous (stride " << out.stride(1) << ")";
  CheckCuda(input, "input");
  CheckSameDevice(input, out, "input", "out");
  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(act_and_mul_launch(
                     act, DataPtr(out), DataPtr(input), rows, d, rows > 1 ? input.stride(0) : 2 * d,
                     rows > 1 ? out.stride(0) : d, enable_pdl, CurrentStream(device)),
                 what);
}

void SiluAndMul(TensorView out, TensorView input, bool enable_pdl) {
  ActAndMul(0, "silu_and_mul launch", out, input, enable_pdl);
}
void GeluAndMul(TensorView out, TensorView input, bool enable_pdl) {
  ActAndMul(1, "gelu_and_mul launch", out, input, enable_pdl);
}
void GeluTanhAndMul(TensorView out, TensorView input, bool enable_pdl) {
  ActAndMul(2, "gelu_tanh_and_mul launch", out, input, enable_pdl);
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(silu_and_mul, SiluAndMul);
FLASHINFER_EXPORT_FUNC(gelu_and_mul, GeluAndMul);
FLASHINFER_EXPORT_FUNC(gelu_tanh_and_mul, GeluTanhAndMul);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
