// The prefill module's kernel TU (csrc/prefill_kernel.cu), compiled by the host compiler
// against the emulator's headers, gets its shared memory and a C entry point here.
#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"
#include "prefill_launcher.h"

namespace flashinfer {
namespace prefill {
// PrefillKernel's `extern __shared__` array: an H100's 227 KiB of dynamic shared memory
alignas(128) uint8_t shared_bytes[227 * 1024];
}  // namespace prefill
}  // namespace flashinfer

namespace {
const bool registered = (simt::set_shared_window(flashinfer::prefill::shared_bytes,
                                                 sizeof flashinfer::prefill::shared_bytes),
                         true);
}  // namespace

extern "C" int emu_prefill_launch(const PrefillLaunch* launch) {
  return prefill_launch(*launch, nullptr);
}
extern "C" int emu_prefill_tile_rows() { return prefill_tile_rows(); }
// PrefillLaunch's size and two offsets, for the Python mirror of the struct to compare
extern "C" void emu_prefill_launch_layout(int64_t* out) {
  out[0] = sizeof(PrefillLaunch);
  out[1] = offsetof(PrefillLaunch, window_left);
  out[2] = offsetof(PrefillLaunch, pdl);
}
