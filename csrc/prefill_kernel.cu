// Kernel TU of the prefill module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "attention_config.h"
#include "flashinfer/prefill.cuh"
#include "prefill_launcher.h"

#include <cmath>

namespace fp = flashinfer::prefill;
namespace fc = flashinfer::cascade;
using Tiling = fp::Tiling<kHeadDim, kPrefillMTiles, kPrefillTileKV, kPrefillMinCTAs,
                          kPrefillOverlap, kHeadDimVO>;

cudaError_t prefill_launch(const PrefillLaunch& l, cudaStream_t stream) {
  fp::PrefillParams<DType, DTypeKV> p;
  p.q = static_cast<const DType*>(l.q);
  p.q_row_stride = l.q_row_stride;
  p.q_head_stride = l.q_head_stride;
  p.qo_indptr = l.qo_indptr;
  p.k = {static_cast<const DTypeKV*>(l.k), l.k_page_stride, l.k_slot_stride, l.k_head_stride};
  p.v = {static_cast<const DTypeKV*>(l.v), l.v_page_stride, l.v_slot_stride, l.v_head_stride};
  p.pages = {l.kv_indices, l.kv_indptr,   l.kv_last_page_len,
             l.page_size,  l.num_indices, l.num_pages};
  p.page_div = flashinfer::FastDiv(l.kv_indices ? static_cast<uint32_t>(l.page_size) : 1u);
  p.mask = l.mask;
  p.mask_indptr = l.mask_indptr;
  p.out = static_cast<DType*>(l.out);
  p.out_row_stride = l.out_row_stride;
  p.out_head_stride = l.out_head_stride;
  p.lse = l.lse;
  p.tmp_v = l.tmp_v;
  p.tmp_lse = l.tmp_lse;
  p.num_qo_heads = l.num_qo_heads;
  p.group = l.num_qo_heads / l.num_kv_heads;
  p.group_div = flashinfer::FastDiv(static_cast<uint32_t>(p.group));
  p.scale = l.score_scale;
  p.cap = l.score_cap;
  p.causal = l.causal && !l.mask;  // a custom mask overrides causal, as in the reference
  p.window_left = l.window_left;
  p.single_qo_len = l.single_qo_len;
  p.single_kv_len = l.single_kv_len;
  p.rope = {l.rope_rcp_scale, std::log2(l.rope_rcp_theta)};
  p.alibi_slopes = l.alibi_slopes;
  const fp::WorkList work{l.plan, l.work_capacity, l.chunk_tokens, l.single_chunks};
  fc::MergeSchedule merge{};
  int64_t merge_positions = 0;
  if (l.plan) {
    // [num_merge, merge_row[M], merge_indptr[M + 1]] (schedule.cuh)
    const int32_t* m = fp::Schedule::merge_section(l.plan, l.work_capacity);
    merge = {m, m + 1 + l.merge_capacity, m + 1, 0};
    merge_positions = l.grid_merge;
  } else if (l.single_chunks > 1) {
    merge = {nullptr, nullptr, nullptr, l.single_chunks};
    merge_positions = l.single_qo_len;
  }
  return fp::Prefill<DType, DTypeKV, Tiling, kPosEncoding>(p, work, l.grid_work, l.num_kv_heads,
                                                           merge, merge_positions, l.pdl, stream);
}

int64_t prefill_shared_bytes() { return static_cast<int64_t>(Tiling::kSharedBytes); }

cudaError_t prefill_blocks_per_sm(int* blocks) {
  return fp::PrefillBlocksPerSM<DType, DTypeKV, Tiling, kPosEncoding>(blocks);
}

int prefill_tile_rows() { return fp::kTileRows; }
