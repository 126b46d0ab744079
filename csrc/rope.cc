// Binding TU of the rope module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>

#include <limits>

#include "ffi_export.h"
#include "rope_config.h"
#include "rope_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;

namespace {

RopeHeads HeadsOf(const TensorView& t, const char* name) {
  FLASHINFER_CHECK(t.ndim() == 3, ValueError)
      << name << " must be 3-D [nnz, heads, head_dim], got " << t.ndim() << "-D";
  FLASHINFER_CHECK(t.size(2) <= 1 || t.stride(2) == 1, ValueError)
      << name << "'s last dim must be contiguous (stride " << t.stride(2) << ")";
  CheckDType(t, name, kDTypeCode, kDTypeBits);
  return {t.size(1), t.stride(0), t.stride(1)};
}

void CheckSame3D(const TensorView& a, const TensorView& b, const char* a_name, const char* b_name) {
  FLASHINFER_CHECK(a.size(0) == b.size(0) && a.size(1) == b.size(1) && a.size(2) == b.size(2),
                   ValueError)
      << a_name << " and " << b_name << " differ in shape";
}

// The checks every variant shares; returns the options with sizes filled in.
RopeOptions Prepare(TensorView q_out, TensorView k_out, TensorView q, TensorView k,
                    TensorView pos_ids, int64_t rotary_dim, RopeHeads* layouts) {
  layouts[0] = HeadsOf(q, "q");
  layouts[1] = HeadsOf(k, "k");
  layouts[2] = HeadsOf(q_out, "q_out");
  layouts[3] = HeadsOf(k_out, "k_out");
  CheckSame3D(q, q_out, "q", "q_out");
  CheckSame3D(k, k_out, "k", "k_out");
  const int64_t nnz = q.size(0);
  const int64_t head_dim = q.size(2);
  FLASHINFER_CHECK(k.size(0) == nnz, ValueError)
      << "q has " << nnz << " tokens, k has " << k.size(0);
  FLASHINFER_CHECK(k.size(2) == head_dim, ValueError)
      << "q's head_dim is " << head_dim << ", k's is " << k.size(2);
  FLASHINFER_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, ValueError)
      << "rotary_dim must be even and in (0, head_dim=" << head_dim << "], got " << rotary_dim;
  FLASHINFER_CHECK(pos_ids.ndim() == 1 && pos_ids.size(0) == nnz, ValueError)
      << "pos_ids must be 1-D with " << nnz << " elements";
  const DLDataType id = pos_ids.dtype();
  FLASHINFER_CHECK(id.code == kDLInt && (id.bits == 32 || id.bits == 64) && id.lanes == 1,
                   TypeError)
      << "pos_ids has dtype " << DTypeName(id) << ", expected int32 or int64";
  FLASHINFER_CHECK(nnz <= 1 || pos_ids.stride(0) == 1, ValueError) << "pos_ids must be contiguous";
  FLASHINFER_CHECK(q.size(1) + k.size(1) <= 65535, ValueError) << "too many heads";
  FLASHINFER_CHECK(nnz <= std::numeric_limits<int32_t>::max(), ValueError) << "too many tokens";
  CheckCuda(q, "q");
  CheckSameDevice(q, k, "q", "k");
  CheckSameDevice(q, q_out, "q", "q_out");
  CheckSameDevice(q, k_out, "q", "k_out");
  CheckSameDevice(q, pos_ids, "q", "pos_ids");
  RopeOptions options{};
  options.nnz = nnz;
  options.head_dim = head_dim;
  options.rotary_dim = rotary_dim;
  return options;
}

void Launch(TensorView q_out, TensorView k_out, TensorView q, TensorView k, TensorView pos_ids,
            const RopeHeads* layouts, const RopeOptions& options) {
  const DLDevice device = q.device();
  CudaDeviceGuard guard(device.device_id);
  CheckCudaError(rope_launch(DataPtr(q_out), DataPtr(k_out), DataPtr(q), DataPtr(k),
                             DataPtr(pos_ids), pos_ids.dtype().bits == 64, layouts[0], layouts[1],
                             layouts[2], layouts[3], options, CurrentStream(device)),
                 "rope kernel launch");
}

void CheckScales(double rope_scale, double rope_theta) {
  FLASHINFER_CHECK(rope_scale > 0 && rope_theta > 0, ValueError)
      << "rope_scale and rope_theta must be > 0, got " << rope_scale << " and " << rope_theta;
}

void ApplyRopePosIds(TensorView q_out, TensorView k_out, TensorView q, TensorView k,
                     TensorView pos_ids, int64_t rotary_dim, bool interleave, double rope_scale,
                     double rope_theta) {
  RopeHeads layouts[4];
  RopeOptions o = Prepare(q_out, k_out, q, k, pos_ids, rotary_dim, layouts);
  CheckScales(rope_scale, rope_theta);
  o.interleave = interleave;
  o.rope_scale = static_cast<float>(rope_scale);
  o.rope_theta = static_cast<float>(rope_theta);
  Launch(q_out, k_out, q, k, pos_ids, layouts, o);
}

void ApplyLlama31RopePosIds(TensorView q_out, TensorView k_out, TensorView q, TensorView k,
                            TensorView pos_ids, int64_t rotary_dim, bool interleave,
                            double rope_scale, double rope_theta, double low_freq_factor,
                            double high_freq_factor, double old_context_len) {
  RopeHeads layouts[4];
  RopeOptions o = Prepare(q_out, k_out, q, k, pos_ids, rotary_dim, layouts);
  CheckScales(rope_scale, rope_theta);
  FLASHINFER_CHECK(high_freq_factor > low_freq_factor && low_freq_factor > 0 && old_context_len > 0,
                   ValueError)
      << "need high_freq_factor > low_freq_factor > 0 and old_context_len > 0";
  o.interleave = interleave;
  o.rope_scale = static_cast<float>(rope_scale);
  o.rope_theta = static_cast<float>(rope_theta);
  o.llama31 = true;
  o.low_freq_factor = static_cast<float>(low_freq_factor);
  o.high_freq_factor = static_cast<float>(high_freq_factor);
  o.old_context_len = static_cast<float>(old_context_len);
  Launch(q_out, k_out, q, k, pos_ids, layouts, o);
}

void ApplyRopeCosSinCache(TensorView q_out, TensorView k_out, TensorView q, TensorView k,
                          TensorView pos_ids, TensorView cos_sin_cache, bool interleave) {
  FLASHINFER_CHECK(cos_sin_cache.ndim() == 2, ValueError)
      << "cos_sin_cache must be 2-D [max_position, rotary_dim]";
  CheckDType(cos_sin_cache, "cos_sin_cache", kDLFloat, 32);
  FLASHINFER_CHECK(cos_sin_cache.size(1) <= 1 || cos_sin_cache.stride(1) == 1, ValueError)
      << "cos_sin_cache's last dim must be contiguous";
  RopeHeads layouts[4];
  RopeOptions o = Prepare(q_out, k_out, q, k, pos_ids, cos_sin_cache.size(1), layouts);
  CheckSameDevice(q, cos_sin_cache, "q", "cos_sin_cache");
  o.interleave = interleave;
  o.rope_scale = 1.f;
  o.rope_theta = 1.f;
  o.cos_sin_cache = static_cast<const float*>(DataPtr(cos_sin_cache));
  o.cache_stride = cos_sin_cache.size(0) > 1 ? cos_sin_cache.stride(0) : cos_sin_cache.size(1);
  o.cache_rows = cos_sin_cache.size(0);
  Launch(q_out, k_out, q, k, pos_ids, layouts, o);
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(apply_rope_pos_ids, ApplyRopePosIds);
FLASHINFER_EXPORT_FUNC(apply_llama31_rope_pos_ids, ApplyLlama31RopePosIds);
FLASHINFER_EXPORT_FUNC(apply_rope_cos_sin_cache, ApplyRopeCosSinCache);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
