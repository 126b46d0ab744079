// The decode module's kernel TU (csrc/decode_kernel.cu), compiled by the host compiler
// against the emulator's headers, gets its C entry points here.
#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"
#include "decode_launcher.h"

extern "C" int emu_decode_launch(const DecodeKV* kv, const DecodeLaunch* launch) {
  return decode_launch(*kv, *launch, nullptr);
}

// The sizes of DecodeKV and DecodeLaunch, then every field's offset in declaration order,
// for the Python mirrors of the structs to compare
extern "C" void emu_decode_layout(int64_t* out) {
  const size_t layout[] = {sizeof(DecodeKV),
                           offsetof(DecodeKV, k),
                           offsetof(DecodeKV, v),
                           offsetof(DecodeKV, k_page_stride),
                           offsetof(DecodeKV, k_slot_stride),
                           offsetof(DecodeKV, k_head_stride),
                           offsetof(DecodeKV, v_page_stride),
                           offsetof(DecodeKV, v_slot_stride),
                           offsetof(DecodeKV, v_head_stride),
                           offsetof(DecodeKV, indices),
                           offsetof(DecodeKV, indptr),
                           offsetof(DecodeKV, last_page_len),
                           offsetof(DecodeKV, page_size),
                           offsetof(DecodeKV, num_indices),
                           offsetof(DecodeKV, num_pages),
                           sizeof(DecodeLaunch),
                           offsetof(DecodeLaunch, q),
                           offsetof(DecodeLaunch, q_batch_stride),
                           offsetof(DecodeLaunch, q_head_stride),
                           offsetof(DecodeLaunch, out),
                           offsetof(DecodeLaunch, out_batch_stride),
                           offsetof(DecodeLaunch, out_head_stride),
                           offsetof(DecodeLaunch, lse),
                           offsetof(DecodeLaunch, tmp_v),
                           offsetof(DecodeLaunch, tmp_lse),
                           offsetof(DecodeLaunch, num_qo_heads),
                           offsetof(DecodeLaunch, num_kv_heads),
                           offsetof(DecodeLaunch, score_scale),
                           offsetof(DecodeLaunch, score_cap),
                           offsetof(DecodeLaunch, plan),
                           offsetof(DecodeLaunch, work_capacity),
                           offsetof(DecodeLaunch, merge_capacity),
                           offsetof(DecodeLaunch, grid_work),
                           offsetof(DecodeLaunch, grid_merge),
                           offsetof(DecodeLaunch, chunk_tokens),
                           offsetof(DecodeLaunch, window_left),
                           offsetof(DecodeLaunch, single_len),
                           offsetof(DecodeLaunch, pdl)};
  for (size_t i = 0; i < sizeof layout / sizeof layout[0]; ++i)
    out[i] = static_cast<int64_t>(layout[i]);
}
