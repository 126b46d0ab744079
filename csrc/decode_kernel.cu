// Kernel TU of the decode module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include <cmath>

#include "attention_config.h"
#include "decode_launcher.h"
#include "flashinfer/decode.cuh"

namespace fd = flashinfer::decode;
namespace fc = flashinfer::cascade;

cudaError_t decode_launch(const DecodeKV& kv, const DecodeLaunch& l, cudaStream_t stream) {
  fd::DecodeParams<DType, DTypeKV> p;
  p.q = static_cast<const DType*>(l.q);
  p.q_batch_stride = l.q_batch_stride;
  p.q_head_stride = l.q_head_stride;
  p.k = {static_cast<const DTypeKV*>(kv.k), kv.k_page_stride, kv.k_slot_stride, kv.k_head_stride};
  p.v = {static_cast<const DTypeKV*>(kv.v), kv.v_page_stride, kv.v_slot_stride, kv.v_head_stride};
  p.pages = {kv.indices, kv.indptr, kv.last_page_len, kv.page_size, kv.num_indices, kv.num_pages};
  p.out = static_cast<DType*>(l.out);
  p.out_batch_stride = l.out_batch_stride;
  p.out_head_stride = l.out_head_stride;
  p.lse = l.lse;
  p.tmp_v = l.tmp_v;
  p.tmp_lse = l.tmp_lse;
  p.num_qo_heads = l.num_qo_heads;
  p.scores = {l.score_scale, l.score_cap};
  p.rope = {l.rope_rcp_scale, std::log2(l.rope_rcp_theta)};
  p.alibi_slopes = l.alibi_slopes;
  const fd::WorkList work{l.plan,        l.work_capacity, l.chunk_tokens,
                          l.window_left, l.single_len,    l.grid_work > 1};
  fc::MergeSchedule merge{};
  if (l.plan) {
    // [num_merge, merge_row[M], merge_indptr[M + 1]] (schedule.cuh)
    const int32_t* m = fd::Schedule::merge_section(l.plan, l.work_capacity);
    merge = {m, m + 1 + l.merge_capacity, m + 1, 0};
  } else {
    merge = {nullptr, nullptr, nullptr, l.grid_work};
  }
  const int64_t merge_positions = l.plan ? l.grid_merge : (l.grid_work > 1 ? 1 : 0);
  return fd::Decode<DType, DTypeKV, kHeadDim, kPosEncoding>(p, work, l.grid_work, l.num_kv_heads,
                                                            merge, merge_positions, l.pdl, stream);
}

cudaError_t decode_blocks_per_sm(int group, int* blocks) {
  return fd::DecodeBlocksPerSM<DType, DTypeKV, kHeadDim, kPosEncoding>(group, blocks);
}
