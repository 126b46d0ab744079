// Stand-in for CUDA's vector_types.h under the CPU emulator: the vector structs the kernels
// use, with CUDA's alignments, and their make_ functions.
#pragma once

struct uint3 {
  unsigned x, y, z;
};

struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct alignas(8) uint2 {
  unsigned x, y;
};

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
