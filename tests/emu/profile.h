// The emulator's memory profile (tests/emu/profile.cc): what a GPU's memory pipeline would
// make of the kernels' accesses, off unless a test turns it on. The engine (simt.cc) reports
// each access a thread makes to shared memory or to a registered buffer (global memory), with
// the code address that made it; the profile pairs the accesses of a warp's lanes into the
// warp-wide requests a GPU issues (a lane's n-th access at a code address with its warp's
// other lanes' n-th there, counting from the last barrier) and counts, per code address, the shared-memory wavefronts and
// global-memory sectors they take against the fewest their bytes could take.
#pragma once

#include <cstddef>
#include <cstdint>

namespace simt {
namespace profile {

enum class Kind : uint8_t {
  kSharedLoad,
  kSharedStore,
  kSharedAtomic,
  kLdmatrix,
  kCpAsyncToShared,
  kGlobalLoad,
  kGlobalStore,
  kGlobalAtomic,
  kCpAsyncFromGlobal,
};

bool enabled();
// An access of `bytes` at `address` by thread `tid` of the CTA, made by the code at `pc`.
void access(Kind kind, const void* pc, unsigned tid, const void* address, size_t bytes);
// An ldmatrix .x4 of warp `warp` at `pc`: `rows[i]` is the address lane i gave (matrix i / 8).
void ldmatrix(const void* pc, unsigned warp, const uint8_t* const rows[32]);
// The CTA passed a barrier or is done: its requests so far are counted (a lane's accesses
// after a barrier pair with its warp's other lanes' after it, as a GPU's warp reconverges
// there, even where a branch before it ran different lanes a different number of times).
void flush();

}  // namespace profile
}  // namespace simt
