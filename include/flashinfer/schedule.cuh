// A split-KV schedule as the attention kernels read it: the int32 words a host planner packs
// (`pack_words` in flashinfer/decode_schedule.py), on the device so that a CUDA graph captured
// under one plan runs a later one. Only plan()'s host-to-device copies write them, never a
// kernel, so a kernel launched with PDL reads them before pdl_wait(), while the kernel before
// it still runs. Layout, W and M the work and merge capacities:
//   [num_work, chunk_tokens, column 0[W], ..., column n-1[W], num_merge, merge_row[M],
//    merge_indptr[M + 1]]
// Framework-agnostic: raw pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashinfer {

// A schedule of sizeof...(kLowest) work columns, column k's words >= kLowest[k] in every plan
// the planner writes.
template <int... kLowest>
struct PackedSchedule {
  static constexpr int kColumns = sizeof...(kLowest);

  // Work item i: its column words into `word`, the chunk size (at least 1) into `chunk_tokens`.
  // False when i is past the plan's items, or a word lies outside the planner's range.
  // i < gridDim.x <= W (checked on the host), so the item's words lie in the plan whatever
  // its count says. The test reads every word so that they all load with the count, not a
  // round trip after it: the compiler moves a load the test does not read below the test,
  // where alone it is used.
  __device__ __forceinline__ static bool item(const int32_t* plan, int64_t capacity, int64_t i,
                                              int32_t (&word)[kColumns], int* chunk_tokens) {
    const int32_t* column = plan + 2;
    const int32_t tokens = plan[1];
    bool outside = (i >= plan[0]) | (tokens < 0);
    int k = 0;
    ((word[k] = column[k * capacity + i], outside |= word[k] < kLowest, ++k), ...);
    *chunk_tokens = max(tokens, 1);
    return !outside;
  }

  // Where [num_merge, merge_row, merge_indptr] begin.
  __host__ __device__ static const int32_t* merge_section(const int32_t* plan, int64_t capacity) {
    return plan + 2 + kColumns * capacity;
  }
};

}  // namespace flashinfer
