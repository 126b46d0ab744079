// Kernel TU of the cascade module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "cascade_config.h"
#include "cascade_launcher.h"
#include "flashinfer/cascade.cuh"

namespace fc = flashinfer::cascade;

namespace {
fc::StateArray<DType> In(StateTensors t) {
  return {static_cast<const DType*>(t.v),
          t.s,
          t.v_state_stride,
          t.v_head_stride,
          t.s_state_stride,
          t.s_head_stride};
}
fc::OutputArray<DType> Out(StateOutput t) {
  return {static_cast<DType*>(t.v), t.s, t.v_row_stride, t.v_head_stride, t.s_row_stride,
          t.s_head_stride};
}
}  // namespace

cudaError_t merge_state_launch(StateOutput out, StateTensors a, StateTensors b, const uint8_t* mask,
                               bool in_place, int64_t positions, int64_t heads, int64_t head_dim,
                               cudaStream_t stream) {
  return fc::MergeTwoStates<DType>(Out(out), In(a), In(b), mask, in_place, positions, heads,
                                   head_dim, stream);
}

cudaError_t merge_states_launch(StateOutput out, StateTensors in, int64_t positions,
                                int64_t num_states, int64_t heads, int64_t head_dim,
                                cudaStream_t stream) {
  const fc::MergeSchedule schedule{nullptr, nullptr, nullptr, num_states};
  return fc::MergeStates<DType, DType>(Out(out), In(in), schedule, positions, heads, head_dim,
                                       stream);
}
