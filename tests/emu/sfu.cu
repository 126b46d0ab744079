// The emulator's special-function stand-ins (include/flashinfer/fast_math.cuh) over an array,
// for tests/emu/test_sfu.py to hold against the error bounds they model.
#include <cstddef>

#include "flashinfer/fast_math.cuh"

// kind 0: ex2.approx, 1: tanh.approx, 2: sin.approx, 3: cos.approx
extern "C" void emu_sfu(int kind, const float* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float s, c;
    if (kind == 0) out[i] = flashinfer::exp2_approx(in[i]);
    if (kind == 1) out[i] = flashinfer::tanh_approx(in[i]);
    if (kind >= 2) {
      flashinfer::sincos_approx(in[i], &s, &c);
      out[i] = kind == 2 ? s : c;
    }
  }
}
