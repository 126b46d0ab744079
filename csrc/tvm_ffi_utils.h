// Helpers for binding TUs (host compiler, tvm-ffi): argument checks that raise Python
// exceptions, the caller's CUDA stream, a device guard. Never included by kernel TUs.
#pragma once

#include <cuda_runtime_api.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>
#include <string>

// Like TVM_FFI_CHECK, without its "Check failed: (cond) is false" prefix: the streamed
// message is what the Python user reads. The if/else form is safe inside an unbraced if.
#define FLASHINFER_CHECK(cond, ErrorKind) \
  if (cond) {                             \
  } else                                  \
    TVM_FFI_THROW(ErrorKind)

namespace flashinfer_binding {

using tvm::ffi::TensorView;

inline std::string DTypeName(DLDataType dt) {
  std::string base;
  switch (dt.code) {
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLBool:
      return "bool";
    case kDLFloat8_e4m3fn:
      return "float8_e4m3fn";
    case kDLFloat8_e5m2:
      return "float8_e5m2";
    default:
      base = "code" + std::to_string(dt.code) + "_";
      break;
  }
  return base + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : "");
}

inline void* DataPtr(const TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

inline void CheckDType(const TensorView& t, const char* name, uint8_t code, uint8_t bits) {
  const DLDataType dt = t.dtype();
  FLASHINFER_CHECK(dt.code == code && dt.bits == bits && dt.lanes == 1, TypeError)
      << name << " has dtype " << DTypeName(dt) << ", expected "
      << DTypeName(DLDataType{code, bits, 1});
}

inline void CheckCuda(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.device().device_type == kDLCUDA, ValueError)
      << name << " must be a CUDA tensor (DLPack device type " << t.device().device_type << ")";
}

inline void CheckSameDevice(const TensorView& a, const TensorView& b, const char* a_name,
                            const char* b_name) {
  FLASHINFER_CHECK(a.device().device_type == b.device().device_type &&
                       a.device().device_id == b.device().device_id,
                   ValueError)
      << a_name << " and " << b_name << " are on different devices";
}

// The caller's current stream for `device` (torch's current stream when called from torch).
inline cudaStream_t CurrentStream(DLDevice device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

inline void CheckCudaError(cudaError_t err, const char* what) {
  // A failed call also leaves its error as the thread's last error, which torch's next
  // launch check would then report as its own: clear it (a sticky error stays).
  if (err != cudaSuccess) cudaGetLastError();
  FLASHINFER_CHECK(err == cudaSuccess, RuntimeError)
      << what << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
}

// Makes `device_id` current for the scope, restoring the previous device after.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device_id) {
    CheckCudaError(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_id) CheckCudaError(cudaSetDevice(device_id), "cudaSetDevice");
  }
  ~CudaDeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace flashinfer_binding
