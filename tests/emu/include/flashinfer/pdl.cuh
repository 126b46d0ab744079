// The CPU emulator's include/flashinfer/pdl.cuh: no dependent launch to wait for (launches
// run one after another), and launch_kernel runs the grid in the emulator.
#pragma once

#include <cuda_runtime.h>

namespace flashinfer {

inline void pdl_wait() {}
inline void pdl_launch_dependents() {}

template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                                 size_t smem_bytes, cudaStream_t, bool, Args... args) {
  return ::simt::launch(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes,
                        [&] { kernel(static_cast<Params>(args)...); });
}

}  // namespace flashinfer
