// Host harness for include/flashinfer/philox.h, built and run by tests/ops/test_sampling.py
// with the host compiler: prints what the sampling kernels compute for chosen inputs (the
// test compares with an independent Python model) and sweeps the uniform mapping.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "flashinfer/philox.h"

using flashinfer::PhiloxBlock;

namespace {

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Every uniform in (0, 1), non-decreasing in the bits, its exponential finite and positive;
// over the low and high 2^24 bit patterns and every 251st in between, in increasing order.
bool sweep_uniforms(uint64_t* checked) {
  float previous = 0.f;
  auto check = [&](uint64_t bits) {
    const float u = flashinfer::uniform_open01(static_cast<uint32_t>(bits));
    const float e = flashinfer::exponential_from_uniform(u);
    ++*checked;
    const bool ok = u > 0.f && u < 1.f && u >= previous && std::isfinite(e) && e > 0.f;
    if (!ok) std::printf("sweep FAIL bits=%" PRIu64 " u=%a e=%a\n", bits, u, e);
    previous = u;
    return ok;
  };
  constexpr uint64_t kEdge = 1ull << 24, kAll = 1ull << 32;
  for (uint64_t b = 0; b < kEdge; ++b) {
    if (!check(b)) return false;
  }
  for (uint64_t b = kEdge; b < kAll - kEdge; b += 251) {
    if (!check(b)) return false;
  }
  for (uint64_t b = kAll - kEdge; b < kAll; ++b) {
    if (!check(b)) return false;
  }
  return true;
}

}  // namespace

int main() {
  // seed, subsequence, offset, group
  const uint64_t words[][4] = {
      {0, 0, 0, 0},        {42, 3, 0, 5},       {42, 3, 1, 5},
      {42, 3, 2, 5},       {42, 3, 7, 5},       {7, 0, 4000, 0},
      {0xDEADBEEFCAFEF00Dull, 1ull << 33, (1ull << 62) + 6, 1000},
      {~0ull, 2147483647, ~0ull - 2, 3}};
  for (const auto& w : words) {
    const PhiloxBlock r = flashinfer::philox_words(w[0], w[1], w[2], w[3]);
    std::printf("words %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %u %u\n", w[0], w[1],
                w[2], w[3], r.x, r.y, r.z, r.w);
  }
  const uint32_t uniforms[] = {0u,          1u,          2u,          0x00FFFFFFu, 0x01000000u,
                               0x01000001u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFF00u, 0xFFFFFF7Fu,
                               0xFFFFFF80u, 0xFFFFFFFEu, 0xFFFFFFFFu};
  for (const uint32_t b : uniforms) {
    std::printf("uniform %u %u\n", b, bits_of(flashinfer::uniform_open01(b)));
  }
  const float keys[] = {-INFINITY, -1.f, -1e-45f, -0.f, 0.f, 1e-45f, 1.f, INFINITY};
  for (const float x : keys) std::printf("key %a %u\n", x, flashinfer::ordered_key(x));
  uint64_t checked = 0;
  if (sweep_uniforms(&checked)) std::printf("sweep ok %" PRIu64 "\n", checked);
  return 0;
}
