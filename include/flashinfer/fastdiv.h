// Division by a divisor fixed at run time (a page size, a GQA group) as a multiply-high, an
// add and a shift instead of the ~20 instructions of a 32-bit division (Granlund and
// Montgomery, PLDI 1994). Plain C++ when not compiled by nvcc, so a CPU test checks it.
#pragma once

#include <cstdint>

#include "flashinfer/host_device.h"

namespace flashinfer {

// For 1 <= d < 2^31 and 0 <= n < 2^31: n / d == (umulhi(n, m) + n) >> s, with
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (< 2^32; umulhi(n, m) <= n, so the
// sum fits 32 bits).
struct FastDiv {
  uint32_t d, m, s;

  FLASHINFER_HOST_DEVICE explicit FastDiv(uint32_t divisor = 1) : d(divisor), m(0), s(0) {
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1);
  }

  FLASHINFER_HOST_DEVICE uint32_t quotient(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
};

}  // namespace flashinfer
