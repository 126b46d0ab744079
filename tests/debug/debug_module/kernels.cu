// Test-only kernels: one that uses the device printf helpers, one that writes out of
// bounds, one that runs for a known time.
#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/debug.cuh"

__global__ void FillKernel(float* data, int64_t n, float value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  FLASHINFER_PRINTF_ONCE("fill: n=%lld value=%f\n", static_cast<long long>(n), value);
  FLASHINFER_PRINTF_WARP("fill: warp starting at %lld\n", static_cast<long long>(i));
  if (i < n) data[i] = value;
}

// Writes 2^40 bytes past the buffer: an illegal address on any GPU.
__global__ void OutOfBoundsKernel(float* data) { data[int64_t{1} << 38] = 1.f; }

// Busy-waits `ns` nanoseconds of the GPU's global timer: a kernel of known duration.
__global__ void SpinKernel(int64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<uint64_t>(ns));
}

cudaError_t LaunchSpin(int64_t ns, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* data, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(data, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchOutOfBounds(float* data, cudaStream_t stream) {
  OutOfBoundsKernel<<<1, 1, 0, stream>>>(data);
  return cudaGetLastError();
}
