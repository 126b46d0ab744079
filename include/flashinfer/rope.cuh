// Rotary position embedding (RoPE) on q [nnz, q_heads, head_dim] and k [nnz, k_heads, head_dim].
// Each rotary pair (a, b) of a head becomes (a cos t - b sin t, b cos t + a sin t), where
// t = pos * freq_i. Pairs are (i, i + rotary_dim/2) (NeoX style) or (2i, 2i + 1) (GPT-J,
// "interleave"); dims from rotary_dim on are copied unchanged. freq_i comes from
// rope_scale and rope_theta (optionally with Llama 3.1's wavelength-dependent smoothing),
// or cos/sin are read from a float32 cache [max_pos, rotary_dim] (cos first, then sin).
// Framework-agnostic: raw pointers, sizes, strides and a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/pdl.cuh"
#include "flashinfer/vec.cuh"

namespace flashinfer {
namespace rope {

struct HeadsLayout {
  int64_t heads;
  int64_t token_stride;  // elements
  int64_t head_stride;   // elements
};

struct RopeParams {
  int64_t nnz;
  int64_t head_dim;
  int64_t rotary_dim;
  bool interleave;
  float rope_rcp_scale;  // positions are divided by rope_scale (not with llama31)
  float rope_rcp_theta;
  bool llama31;
  float llama_factor;  // Llama 3.1 "factor" (the reference library's rope_scale there)
  float low_freq_factor;
  float high_freq_factor;
  float old_context_len;
  const float* cos_sin_cache;  // nullptr: compute cos/sin
  int64_t cache_stride;        // elements per cache row
  int64_t cache_rows;          // positions outside [0, cache_rows) give NaN, never a bad read
};

__device__ __forceinline__ float Frequency(const RopeParams& p, int64_t i) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
  float freq = powf(p.rope_rcp_theta, exponent);
  if (!p.llama31) return freq * p.rope_rcp_scale;
  const float wavelen = 6.28318530717958648f / freq;
  const float low_wavelen = p.old_context_len / p.low_freq_factor;
  const float high_wavelen = p.old_context_len / p.high_freq_factor;
  if (wavelen < high_wavelen) return freq;
  if (wavelen > low_wavelen) return freq / p.llama_factor;
  const float smooth =
      (p.old_context_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
  return (1.f - smooth) * freq / p.llama_factor + smooth * freq;
}

// grid (nnz, q_heads + k_heads); each thread rotates pairs and copies the other dims.
template <typename T, typename IdT>
__global__ void RopeKernel(T* q_out, T* k_out, const T* q, const T* k, const IdT* pos_ids,
                           HeadsLayout q_in, HeadsLayout k_in, HeadsLayout q_o, HeadsLayout k_o,
                           RopeParams p) {
  const int64_t token = blockIdx.x;
  const int64_t head = blockIdx.y;
  const bool is_q = head < q_in.heads;
  const int64_t h = is_q ? head : head - q_in.heads;
  const HeadsLayout& in_l = is_q ? q_in : k_in;
  const HeadsLayout& out_l = is_q ? q_o : k_o;
  const T* x = (is_q ? q : k) + token * in_l.token_stride + h * in_l.head_stride;
  T* y = (is_q ? q_out : k_out) + token * out_l.token_stride + h * out_l.head_stride;
  const int64_t pos = static_cast<int64_t>(pos_ids[token]);
  const int64_t half = p.rotary_dim / 2;

  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float c, s;
    if (p.cos_sin_cache != nullptr) {
      if (pos < 0 || pos >= p.cache_rows) {
        c = s = __int_as_float(0x7fc00000);  // NaN: visible in the output and to the tools
      } else {
        const float* row = p.cos_sin_cache + pos * p.cache_stride;
        c = row[i];
        s = row[half + i];
      }
    } else {
      sincosf(static_cast<float>(pos) * Frequency(p, i), &s, &c);
    }
    const int64_t ia = p.interleave ? 2 * i : i;
    const int64_t ib = p.interleave ? 2 * i + 1 : i + half;
    const float a = to_float(x[ia]);
    const float b = to_float(x[ib]);
    y[ia] = from_float<T>(a * c - b * s);
    y[ib] = from_float<T>(b * c + a * s);
  }
  if (y != x) {
    for (int64_t d = p.rotary_dim + threadIdx.x; d < p.head_dim; d += blockDim.x) y[d] = x[d];
  }
}

template <typename T, typename IdT>
cudaError_t ApplyRope(T* q_out, T* k_out, const T* q, const T* k, const IdT* pos_ids,
                      HeadsLayout q_in, HeadsLayout k_in, HeadsLayout q_o, HeadsLayout k_o,
                      const RopeParams& p, cudaStream_t stream) {
  const int64_t heads = q_in.heads + k_in.heads;
  if (p.nnz == 0 || heads == 0) return cudaSuccess;
  const int64_t work =
      p.rotary_dim / 2 > p.head_dim - p.rotary_dim ? p.rotary_dim / 2 : p.head_dim - p.rotary_dim;
  const int64_t warps = (work + 31) / 32;
  const unsigned threads = static_cast<unsigned>(32 * (warps < 1 ? 1 : (warps < 8 ? warps : 8)));
  const dim3 grid(static_cast<unsigned>(p.nnz), static_cast<unsigned>(heads));
  return launch_kernel(RopeKernel<T, IdT>, grid, dim3(threads), 0, stream, false, q_out, k_out, q,
                       k, pos_ids, q_in, k_in, q_o, k_o, p);
}

}  // namespace rope
}  // namespace flashinfer
