// Kernel TU of the rope module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/rope.cuh"
#include "rope_config.h"
#include "rope_launcher.h"

namespace fr = flashinfer::rope;

namespace {
fr::HeadsLayout ToLayout(RopeHeads h) { return {h.heads, h.token_stride, h.head_stride}; }
}  // namespace

cudaError_t rope_launch(void* q_out, void* k_out, const void* q, const void* k, const void* pos_ids,
                        bool pos_ids_64, RopeHeads q_in, RopeHeads k_in, RopeHeads q_o,
                        RopeHeads k_o, RopeOptions o, cudaStream_t stream) {
  fr::RopeParams p{};
  p.nnz = o.nnz;
  p.head_dim = o.head_dim;
  p.rotary_dim = o.rotary_dim;
  p.interleave = o.interleave;
  p.rope_rcp_scale = o.llama31 ? 1.f : 1.f / o.rope_scale;
  p.rope_rcp_theta = 1.f / o.rope_theta;
  p.llama31 = o.llama31;
  p.llama_factor = o.rope_scale;
  p.low_freq_factor = o.low_freq_factor;
  p.high_freq_factor = o.high_freq_factor;
  p.old_context_len = o.old_context_len;
  p.cos_sin_cache = o.cos_sin_cache;
  p.cache_stride = o.cache_stride;
  p.cache_rows = o.cache_rows;
  auto* qo = static_cast<DType*>(q_out);
  auto* ko = static_cast<DType*>(k_out);
  const auto* qi = static_cast<const DType*>(q);
  const auto* ki = static_cast<const DType*>(k);
  if (pos_ids_64) {
    return fr::ApplyRope<DType, int64_t>(qo, ko, qi, ki, static_cast<const int64_t*>(pos_ids),
                                         ToLayout(q_in), ToLayout(k_in), ToLayout(q_o),
                                         ToLayout(k_o), p, stream);
  }
  return fr::ApplyRope<DType, int32_t>(qo, ko, qi, ki, static_cast<const int32_t*>(pos_ids),
                                       ToLayout(q_in), ToLayout(k_in), ToLayout(q_o), ToLayout(k_o),
                                       p, stream);
}
