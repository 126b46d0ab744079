// Binding TU of the sampling module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <limits>

#include "sampling_config.h"
#include "sampling_launcher.h"
#include "tvm_ffi_utils.h"

using namespace flashinfer_binding;
using tvm::ffi::Optional;

namespace {

constexpr int64_t kUseTopK = 1, kUseTopP = 2, kUseMinP = 4;  // filter bits, as in sampling.py

struct Rows {
  int64_t rows, vocab, stride;
  bool aligned;  // every row starts on a 4-element boundary
};

Rows RowsOf(const TensorView& t, const char* name, uint8_t code, uint8_t bits) {
  FLASHINFER_CHECK(t.ndim() == 2, ValueError)
      << name << " must be 2-D [batch, vocab_size], got " << t.ndim() << "-D";
  CheckDType(t, name, code, bits);
  FLASHINFER_CHECK(t.size(1) <= 1 || t.stride(1) == 1, ValueError)
      << name << " must be contiguous in its last dim";
  FLASHINFER_CHECK(t.size(1) >= 1 && t.size(1) <= std::numeric_limits<int32_t>::max(), ValueError)
      << name << " has vocab_size " << t.size(1) << ", expected 1 .. 2^31 - 1";
  FLASHINFER_CHECK(t.size(0) <= std::numeric_limits<int32_t>::max(), ValueError)
      << name << " has too many rows";
  const int64_t stride = t.size(0) <= 1 ? t.size(1) : t.stride(0);
  const bool aligned = reinterpret_cast<uintptr_t>(DataPtr(t)) % (4 * bits / 8) == 0 &&
                       stride % 4 == 0;
  return {t.size(0), t.size(1), stride, aligned};
}

// An optional per-row tensor: 1-D, `rows` elements of the given dtype, on `like`'s device.
template <typename V>
const V* PerRow(const Optional<TensorView>& t, const char* name, int64_t rows, uint8_t code,
                uint8_t bits, const TensorView& like) {
  if (!t.has_value()) return nullptr;
  const TensorView& v = t.value();
  FLASHINFER_CHECK(v.ndim() == 1 && v.size(0) == rows, ValueError)
      << name << " must be 1-D with " << rows << " elements";
  CheckDType(v, name, code, bits);
  FLASHINFER_CHECK(rows <= 1 || v.stride(0) == 1, ValueError) << name << " must be contiguous";
  CheckSameDevice(like, v, "the input", name);
  return static_cast<const V*>(DataPtr(v));
}

void CheckOut(const TensorView& out, const char* name, int64_t rows, int64_t cols, uint8_t code,
              uint8_t bits, const TensorView& like) {
  FLASHINFER_CHECK(out.ndim() == (cols < 0 ? 1 : 2) && out.size(0) == rows &&
                       (cols < 0 || out.size(1) == cols), ValueError)
      << name << " has the wrong shape";
  CheckDType(out, name, code, bits);
  FLASHINFER_CHECK(out.size(out.ndim() - 1) <= 1 || out.stride(out.ndim() - 1) == 1, ValueError)
      << name << " must be contiguous in its last dim";
  CheckSameDevice(like, out, "the input", name);
}

int64_t OutStride(const TensorView& out) { return out.size(0) <= 1 ? out.size(1) : out.stride(0); }

SamplingFilters FiltersOf(const Optional<TensorView>& top_k_values,
                          const Optional<TensorView>& top_p_values,
                          const Optional<TensorView>& min_p_values, int64_t top_k, double top_p,
                          double min_p, int64_t which, bool top_k_first, int64_t rows,
                          const TensorView& like) {
  FLASHINFER_CHECK(which >= 0 && which <= 7, ValueError) << "bad filter set " << which;
  FLASHINFER_CHECK(top_k >= 1 && top_k <= std::numeric_limits<int32_t>::max(), ValueError)
      << "top_k must be in [1, 2^31 - 1], got " << top_k;
  return {PerRow<int32_t>(top_k_values, "top_k", rows, kDLInt, 32, like),
          PerRow<float>(top_p_values, "top_p", rows, kDLFloat, 32, like),
          PerRow<float>(min_p_values, "min_p", rows, kDLFloat, 32, like),
          static_cast<int32_t>(top_k),
          static_cast<float>(top_p),
          static_cast<float>(min_p),
          (which & kUseTopK) != 0,
          (which & kUseTopP) != 0,
          (which & kUseMinP) != 0,
          top_k_first};
}

void Softmax(TensorView out, TensorView logits, Optional<TensorView> temperatures,
             double temperature, bool pdl) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  CheckOut(out, "out", in.rows, in.vocab, kDLFloat, 32, logits);
  CheckCuda(logits, "logits");
  const float* temps = PerRow<float>(temperatures, "temperature", in.rows, kDLFloat, 32, logits);
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(softmax_launch(static_cast<float*>(DataPtr(out)), DataPtr(logits), in.rows,
                                in.vocab, in.stride, OutStride(out), temps,
                                static_cast<float>(temperature), in.aligned, pdl,
                                CurrentStream(logits.device())),
                 "softmax kernel launch");
}

void SamplingFromProbs(TensorView out, TensorView probs, Optional<TensorView> indices,
                       Optional<TensorView> top_k_values, Optional<TensorView> top_p_values,
                       Optional<TensorView> min_p_values, int64_t top_k, double top_p,
                       double min_p, int64_t which, bool top_k_first, int64_t seed,
                       int64_t offset) {
  const Rows in = RowsOf(probs, "probs", kDLFloat, 32);
  const int64_t rows = out.ndim() == 1 ? out.size(0) : -1;
  CheckOut(out, "out", rows, -1, kDLInt, 32, probs);
  FLASHINFER_CHECK(indices.has_value() || rows == in.rows, ValueError)
      << "out has " << rows << " rows, probs " << in.rows << " (and no indices)";
  CheckCuda(probs, "probs");
  const int32_t* index = PerRow<int32_t>(indices, "indices", rows, kDLInt, 32, probs);
  const SamplingFilters filters = FiltersOf(top_k_values, top_p_values, min_p_values, top_k,
                                            top_p, min_p, which, top_k_first, rows, probs);
  CudaDeviceGuard guard(probs.device().device_id);
  CheckCudaError(
      sampling_from_probs_launch(static_cast<int32_t*>(DataPtr(out)),
                                 static_cast<const float*>(DataPtr(probs)), rows, in.vocab, index,
                                 in.rows, in.stride, filters, static_cast<uint64_t>(seed),
                                 static_cast<uint64_t>(offset), in.aligned,
                                 CurrentStream(probs.device())),
      "sampling kernel launch");
}

void SamplingFromLogits(TensorView out, TensorView logits, Optional<TensorView> indices,
                        int64_t seed, int64_t offset) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  const int64_t rows = out.ndim() == 1 ? out.size(0) : -1;
  CheckOut(out, "out", rows, -1, kDLInt, 32, logits);
  FLASHINFER_CHECK(indices.has_value() || rows == in.rows, ValueError)
      << "out has " << rows << " rows, logits " << in.rows << " (and no indices)";
  CheckCuda(logits, "logits");
  const int32_t* index = PerRow<int32_t>(indices, "indices", rows, kDLInt, 32, logits);
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(sampling_from_logits_launch(static_cast<int32_t*>(DataPtr(out)), DataPtr(logits),
                                             rows, in.vocab, index, in.rows, in.stride,
                                             static_cast<uint64_t>(seed),
                                             static_cast<uint64_t>(offset), in.aligned,
                                             CurrentStream(logits.device())),
                 "sampling kernel launch");
}

void RenormProbs(TensorView out, TensorView probs, Optional<TensorView> top_k_values,
                 Optional<TensorView> top_p_values, int64_t top_k, double top_p, int64_t which) {
  const Rows in = RowsOf(probs, "probs", kDLFloat, 32);
  CheckOut(out, "out", in.rows, in.vocab, kDLFloat, 32, probs);
  FLASHINFER_CHECK(which == kUseTopK || which == kUseTopP, ValueError)
      << "renorm takes top_k or top_p";
  CheckCuda(probs, "probs");
  const SamplingFilters filters = FiltersOf(top_k_values, top_p_values, Optional<TensorView>(),
                                            top_k, top_p, 0.0, which, false, in.rows, probs);
  CudaDeviceGuard guard(probs.device().device_id);
  CheckCudaError(renorm_probs_launch(static_cast<float*>(DataPtr(out)),
                                     static_cast<const float*>(DataPtr(probs)), in.rows, in.vocab,
                                     in.stride, OutStride(out), filters, in.aligned,
                                     CurrentStream(probs.device())),
                 "renorm kernel launch");
}

void TopKMaskLogits(TensorView out, TensorView logits, Optional<TensorView> top_k_values,
                    int64_t top_k) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  CheckOut(out, "out", in.rows, in.vocab, kDTypeCode, kDTypeBits, logits);
  CheckCuda(logits, "logits");
  FLASHINFER_CHECK(top_k >= 1 && top_k <= std::numeric_limits<int32_t>::max(), ValueError)
      << "top_k must be in [1, 2^31 - 1], got " << top_k;
  const int32_t* ks = PerRow<int32_t>(top_k_values, "top_k", in.rows, kDLInt, 32, logits);
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(mask_logits_launch(DataPtr(out), DataPtr(logits), in.rows, in.vocab, in.stride,
                                    OutStride(out), ks, static_cast<int32_t>(top_k), in.aligned,
                                    CurrentStream(logits.device())),
                 "top_k_mask_logits kernel launch");
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(softmax, Softmax);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(sampling_from_probs, SamplingFromProbs);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(sampling_from_logits, SamplingFromLogits);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(renorm_probs, RenormProbs);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_k_mask_logits, TopKMaskLogits);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(dtype, DTypeOfModule);
