// The CPU emulator's include/flashinfer/ptx.cuh: the page-table load checked against the
// buffers the test registered, cp.async queued per thread and commit group, and the
// emulator's shared window as the dynamic shared memory (simt.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashinfer {

inline int load_if(const int32_t* ptr, bool pred, int fallback) {
  return ::simt::load_if(ptr, pred, fallback);
}

inline void cp_async_16(void* smem, const void* gmem, bool fill) {
  ::simt::cp_async_16(smem, gmem, fill);
}
inline void cp_async_commit() { ::simt::cp_async_commit(); }
template <int kPending>
inline void cp_async_wait() {
  ::simt::cp_async_wait(kPending);
}

inline uint8_t* dynamic_shared() { return ::simt::shared_window(); }

inline unsigned thread_index() { return threadIdx.x; }

}  // namespace flashinfer
