// The CPU emulator of the kernels (tests/emu/simt.cc): a CTA's threads run as fibers on one
// host thread, switching only where CUDA threads meet (__syncthreads and the warp
// collectives: shuffles, ballots, matches, reductions, ldmatrix, mma.sync), so a kernel
// compiled from its own source by the host compiler runs as the GPU would run it, one CTA
// after another (a read-modify-write of one thread is therefore atomic). What it
// checks as it goes (each a launch failure naming block, thread and cause): two lanes whose
// collectives' masks name each other being in the same collective, none of them exited and
// none left out that a shuffle reads, ldmatrix and cp.async addresses aligned and inside the
// launch's dynamic shared memory, cp.async and page-table reads inside the buffers the test
// registered, dynamic shared memory past 48 KiB only with the kernel's attribute raised,
// barriers that complete (no deadlock), and no two threads racing on a byte of shared memory
// or of a registered buffer (the race check in simt.cc). Shared memory, dynamic and static, starts as 0xff
// bytes (NaN in 16-bit floats) in every CTA.
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

// shfl.sync's modes: the source lane is lane ^ operand, the operand, lane - operand or
// lane + operand, within the lane's segment of `width` lanes
enum class Shuffle { kXor, kIndex, kUp, kDown };
uint32_t shuffle_bits(uint32_t mask, uint32_t value, int operand, Shuffle mode, int width);
// a 64-bit value moves as two 32-bit shuffles, as CUDA's 64-bit overloads do
template <typename T>
T shuffle(uint32_t mask, T value, int operand, Shuffle mode, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- and 64-bit shuffles");
  uint32_t bits[sizeof(T) / 4];
  std::memcpy(bits, &value, sizeof(T));
  for (uint32_t& b : bits) b = shuffle_bits(mask, b, operand, mode, width);
  T out;
  std::memcpy(&out, bits, sizeof(T));
  return out;
}
uint32_t ballot(uint32_t mask, bool pred);
// match.any.sync: the lanes of `mask` whose `value` equals the calling lane's
uint32_t match_any(uint32_t mask, uint32_t value);
// redux.sync.add.u32: the sum, modulo 2^32, of `value` over the lanes of `mask`
uint32_t reduce_add(uint32_t mask, uint32_t value);
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

// The CTA's dynamic shared memory (an H100's 227 KiB; a launch uses its first smem bytes).
uint8_t* shared_window();
// An atomic read-modify-write of `bytes` at `p` by the code at `pc` (for the race check:
// atomics of several threads on one address do not race; and the memory profile).
void atomic_access(void* p, size_t bytes, const void* pc);
// A static __shared__ variable, declared (tests/emu/engine.py adds the call after each
// declaration): poisoned now if new, and at the start of every later CTA.
void shared_declared(void* p, size_t bytes);
cudaError_t set_max_dynamic_shared(const void* kernel, int attribute, int bytes);
// Runs `body` (the kernel with its arguments) on every thread of every CTA of the grid.
cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
                   const std::function<void()>& body);
const char* last_error();

}  // namespace simt
