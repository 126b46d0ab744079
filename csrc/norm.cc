// Binding TU of the norm module (host compiler): checks arguments, finds the stream,
// calls the launcher from norm_kernel.cu, and exports functions through tvm-ffi.
#include <tvm/ffi/function.h>

#include <limits>

#include "norm_config.h"
#include "norm_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

// Shapes, dtypes and strides are checked before the device, so each mistake gets its own
// message; the kernel relies on every check here.
void RMSNorm(TensorView out, TensorView input, TensorView weight, double eps) {
  FLASHINFER_CHECK(input.ndim() == 2, ValueError)
      << "input must be 2-D [tokens, hidden], got " << input.ndim() << "-D";
  FLASHINFER_CHECK(weight.ndim() == 1, ValueError)
      << "weight must be 1-D [hidden], got " << weight.ndim() << "-D";
  FLASHINFER_CHECK(out.ndim() == 2, ValueError)
      << "out must be 2-D [tokens, hidden], got " << out.ndim() << "-D";
  const int64_t rows = input.size(0);
  const int64_t hidden = input.size(1);
  FLASHINFER_CHECK(weight.size(0) == hidden, ValueError)
      << "weight has " << weight.size(0) << " elements, input's hidden size is " << hidden;
  FLASHINFER_CHECK(out.size(0) == rows && out.size(1) == hidden, ValueError)
      << "out has shape [" << out.size(0) << ", " << out.size(1) << "], input has [" << rows
      << ", " << hidden << "]";
  CheckDType(input, "input", kDTypeCode, kDTypeBits);
  CheckDType(weight, "weight", kDTypeCode, kDTypeBits);
  CheckDType(out, "out", kDTypeCode, kDTypeBits);
  FLASHINFER_CHECK(hidden <= 1 || input.stride(1) == 1, ValueError)
      << "input's last dim must be contiguous (stride " << input.stride(1) << ")";
  FLASHINFER_CHECK(hidden <= 1 || out.stride(1) == 1, ValueError)
      << "out's last dim must be contiguous (stride " << out.stride(1) << ")";
  FLASHINFER_CHECK(hidden <= 1 || weight.stride(0) == 1, ValueError)
      << "weight must be contiguous (stride " << weight.stride(0) << ")";
  FLASHINFER_CHECK(rows <= std::numeric_limits<int32_t>::max(), ValueError)
      << "input has " << rows << " rows; at most 2^31 - 1 are supported";
  CheckCuda(input, "input");
  CheckSameDevice(input, weight, "input", "weight");
  CheckSameDevice(input, out, "input", "out");

  const DLDevice device = input.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(rmsnorm_launch(DataPtr(out), DataPtr(input), DataPtr(weight), rows, hidden,
                                rows > 1 ? input.stride(0) : hidden,
                                rows > 1 ? out.stride(0) : hidden, static_cast<float>(eps),
                                CurrentStream(device)),
                 "rmsnorm kernel launch");
}

// Host-only: names the dtype this module was built for (used by tests and tools).
tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, RMSNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dtype, DTypeOfModule);
