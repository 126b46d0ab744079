// FLASHINFER_HOST_DEVICE: a function both the kernels and a host-compiled CPU test evaluate
// (plain inline C++ when the compiler is not nvcc).
#pragma once

#ifdef __CUDACC__
#define FLASHINFER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHINFER_HOST_DEVICE inline
#endif
