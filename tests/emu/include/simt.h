// The CPU emulator of the kernels (tests/emu/simt.cc): a CTA's threads run as fibers on one
// host thread, switching only where CUDA threads meet (__syncthreads and the warp
// collectives: shuffles, ballots, ldmatrix, mma.sync), so a kernel compiled from its own
// source by the host compiler runs as the GPU would run it, one CTA after another. What it
// checks as it goes (each a launch failure naming block, thread and cause): a warp's lanes
// agreeing on which collective they are in, a full lane mask, ldmatrix and cp.async
// addresses aligned and inside the launch's dynamic shared memory, cp.async and page-table
// reads inside the buffers the test registered, dynamic shared memory past 48 KiB only with
// the kernel's attribute raised, and barriers that complete (no deadlock). Shared memory
// starts as 0xff bytes (NaN in 16-bit floats) in every CTA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace simt {

enum class Element { kHalf, kBFloat16 };

uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();

void sync_threads();

uint32_t shuffle_bits(uint32_t mask, uint32_t value, int lane, bool is_xor, int width);
template <typename T>
T shuffle(uint32_t mask, T value, int lane, bool is_xor, int width) {
  static_assert(sizeof(T) == 4, "32-bit shuffles");
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits = shuffle_bits(mask, bits, lane, is_xor, width);
  T out;
  std::memcpy(&out, &bits, 4);
  return out;
}
uint32_t ballot(uint32_t mask, bool pred);
// ldmatrix .m8n8.x4(.trans).b16: `address` a shared-window offset (shared_offset)
void ldmatrix_x4(uint32_t* r, uint32_t address, bool trans);
// mma.sync.m16n8k16.row.col.f32 with 16-bit inputs: c += a * b
void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, Element element);

// __cvta_generic_to_shared: the offset of `p` in the CTA's shared window
size_t shared_offset(const void* p);
int load_if(const int32_t* ptr, bool pred, int fallback);
void cp_async_16(void* smem, const void* gmem, bool fill);
void cp_async_commit();
void cp_async_wait(int pending);

// The kernel's `extern __shared__` array: the emulated CTA's dynamic shared memory. The
// translation unit that defines it (it is named by the kernel) registers it here.
void set_shared_window(void* base, size_t bytes);
cudaError_t set_max_dynamic_shared(const void* kernel, int attribute, int bytes);
// Runs `body` (the kernel with its arguments) on every thread of every CTA of the grid.
cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
                   const std::function<void()>& body);
const char* last_error();

}  // namespace simt
