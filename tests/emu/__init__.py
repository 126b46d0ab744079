"""A CPU emulator of the kernels: a module's kernel TU compiled by the host compiler against
stand-in CUDA headers (``include/``), each CUDA thread a fiber (``simt.cc``). CPU tests run
the real kernel source through the real Python wrappers with it; see docs/testing.md."""
