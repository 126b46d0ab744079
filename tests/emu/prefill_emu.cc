// The prefill module's kernel TU (csrc/prefill_kernel.cu), compiled by the host compiler
// against the emulator's headers, gets its C entry points here.
#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"
#include "prefill_launcher.h"

extern "C" int emu_prefill_launch(const PrefillLaunch* launch) {
  return prefill_launch(*launch, nullptr);
}
extern "C" int emu_prefill_tile_rows() { return prefill_tile_rows(); }
// PrefillLaunch's size, then every field's offset in declaration order, for the Python mirror
// of the struct to compare
extern "C" void emu_prefill_launch_layout(int64_t* out) {
  const size_t layout[] = {sizeof(PrefillLaunch),
                           offsetof(PrefillLaunch, q),
                           offsetof(PrefillLaunch, q_row_stride),
                           offsetof(PrefillLaunch, q_head_stride),
                           offsetof(PrefillLaunch, qo_indptr),
                           offsetof(PrefillLaunch, k),
                           offsetof(PrefillLaunch, v),
                           offsetof(PrefillLaunch, k_page_stride),
                           offsetof(PrefillLaunch, k_slot_stride),
                           offsetof(PrefillLaunch, k_head_stride),
                           offsetof(PrefillLaunch, v_page_stride),
                           offsetof(PrefillLaunch, v_slot_stride),
                           offsetof(PrefillLaunch, v_head_stride),
                           offsetof(PrefillLaunch, kv_indices),
                           offsetof(PrefillLaunch, kv_indptr),
                           offsetof(PrefillLaunch, kv_last_page_len),
                           offsetof(PrefillLaunch, page_size),
                           offsetof(PrefillLaunch, num_indices),
                           offsetof(PrefillLaunch, num_pages),
                           offsetof(PrefillLaunch, mask),
                           offsetof(PrefillLaunch, mask_indptr),
                           offsetof(PrefillLaunch, out),
                           offsetof(PrefillLaunch, out_row_stride),
                           offsetof(PrefillLaunch, out_head_stride),
                           offsetof(PrefillLaunch, lse),
                           offsetof(PrefillLaunch, tmp_v),
                           offsetof(PrefillLaunch, tmp_lse),
                           offsetof(PrefillLaunch, num_qo_heads),
                           offsetof(PrefillLaunch, num_kv_heads),
                           offsetof(PrefillLaunch, score_scale),
                           offsetof(PrefillLaunch, score_cap),
                           offsetof(PrefillLaunch, causal),
                           offsetof(PrefillLaunch, window_left),
                           offsetof(PrefillLaunch, single_qo_len),
                           offsetof(PrefillLaunch, single_kv_len),
                           offsetof(PrefillLaunch, plan),
                           offsetof(PrefillLaunch, work_capacity),
                           offsetof(PrefillLaunch, merge_capacity),
                           offsetof(PrefillLaunch, grid_work),
                           offsetof(PrefillLaunch, grid_merge),
                           offsetof(PrefillLaunch, chunk_tokens),
                           offsetof(PrefillLaunch, single_chunks),
                           offsetof(PrefillLaunch, pdl)};
  for (size_t i = 0; i < sizeof layout / sizeof layout[0]; ++i)
    out[i] = static_cast<int64_t>(layout[i]);
}
