// Programmatic dependent launch (PDL, sm90+). A kernel launched with PDL may start while
// the previous kernel on its stream is still running, so it must call pdl_wait() before
// its first access to memory that kernel may write; pdl_launch_dependents() lets the next
// PDL kernel start its prologue early (it still waits for this grid's completion and
// memory flush in its own pdl_wait()). Both are no-ops below sm90 and without PDL.
// Framework-agnostic: raw launch configuration and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

namespace flashinfer {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` with the programmatic-stream-serialization attribute set to `pdl` and
// returns this launch's own status (an earlier, unrelated error is not picked up). Every
// kernel launched here with pdl = true must call pdl_wait() before reading or writing
// shared global data.
template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t smem_bytes, cudaStream_t stream, bool pdl, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace flashinfer
