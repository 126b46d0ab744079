// Test-only binding: host functions on CPU float32 tensors (run on any machine) and
// launchers of the test kernels (GPU only).
#include <tvm/ffi/function.h>

#include <cmath>

#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

cudaError_t LaunchFill(float* data, int64_t n, float value, cudaStream_t stream);
cudaError_t LaunchOutOfBounds(float* data, cudaStream_t stream);
cudaError_t LaunchSpin(int64_t ns, cudaStream_t stream);

namespace {

void CheckCpuFloat(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.device().device_type == kDLCPU, ValueError) << name << " must be on the CPU";
  CheckDType(t, name, kDLFloat, 32);
  FLASHINFER_CHECK(t.IsContiguous(), ValueError) << name << " must be contiguous";
}

// out = x * factor, on the host.
void Scale(TensorView out, TensorView x, double factor) {
  CheckCpuFloat(out, "out");
  CheckCpuFloat(x, "x");
  FLASHINFER_CHECK(out.numel() == x.numel(), ValueError) << "out and x differ in size";
  float* o = static_cast<float*>(DataPtr(out));
  const float* in = static_cast<const float*>(DataPtr(x));
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<float>(in[i] * factor);
}

// Fills `out` with NaN, on the host.
void Poison(TensorView out) {
  CheckCpuFloat(out, "out");
  float* o = static_cast<float*>(DataPtr(out));
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = std::nanf("");
}

void Fill(TensorView x, double value) {
  CheckCuda(x, "x");
  CheckDType(x, "x", kDLFloat, 32);
  CudaDeviceGuard guard(x.device().device_id);
  CheckCudaError(LaunchFill(static_cast<float*>(DataPtr(x)), x.numel(),
                            static_cast<float>(value), CurrentStream(x.device())),
                 "fill launch");
}

void WriteOutOfBounds(TensorView x) {
  CheckCuda(x, "x");
  CudaDeviceGuard guard(x.device().device_id);
  CheckCudaError(LaunchOutOfBounds(static_cast<float*>(DataPtr(x)), CurrentStream(x.device())),
                 "out-of-bounds launch");
}

// Spins for `ns` nanoseconds on the device and stream of `x`.
void Spin(TensorView x, int64_t ns) {
  CheckCuda(x, "x");
  FLASHINFER_CHECK(ns >= 0, ValueError) << "ns must be >= 0";
  CudaDeviceGuard guard(x.device().device_id);
  CheckCudaError(LaunchSpin(ns, CurrentStream(x.device())), "spin launch");
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, Scale);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(poison, Poison);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fill, Fill);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(write_out_of_bounds, WriteOutOfBounds);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(spin, Spin);
