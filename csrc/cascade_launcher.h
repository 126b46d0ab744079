// Plain C++ launchers exported by cascade_kernel.cu and called by the binding (cascade.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// States: v [positions, (states,) heads, head_dim] of the module's DType, s float32
// [positions, (states,) heads], both contiguous; strides in elements.
struct StateTensors {
  const void* v;
  const float* s;
  int64_t v_state_stride, v_head_stride, s_state_stride, s_head_stride;
};

struct StateOutput {
  void* v;
  float* s;
  int64_t v_row_stride, v_head_stride, s_row_stride, s_head_stride;
};

cudaError_t merge_state_launch(StateOutput out, StateTensors a, StateTensors b, const uint8_t* mask,
                               bool in_place, int64_t positions, int64_t heads, int64_t head_dim,
                               cudaStream_t stream);
cudaError_t merge_states_launch(StateOutput out, StateTensors in, int64_t positions,
                                int64_t num_states, int64_t heads, int64_t head_dim,
                                cudaStream_t stream);
