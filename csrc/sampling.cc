// Binding TU of the sampling module (host compiler): checks, stream, launch, export.
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <limits>

#include "ffi_export.h"
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
  const bool aligned =
      reinterpret_cast<uintptr_t>(DataPtr(t)) % (4 * bits / 8) == 0 && stride % 4 == 0;
  return {t.size(0), t.size(1), stride, aligned};
}

// An optional per-row tensor: 1-D, `rows` elements of the given dtype, on `like`'s device.
// Returns its data, or null when absent.
void* PerRow(const Optional<TensorView>& t, const char* name, int64_t rows, uint8_t code,
             uint8_t bits, const TensorView& like) {
  if (!t.has_value()) return nullptr;
  const TensorView& v = t.value();
  FLASHINFER_CHECK(v.ndim() == 1 && v.size(0) == rows, ValueError)
      << name << " must be 1-D with " << rows << " elements";
  CheckDType(v, name, code, bits);
  FLASHINFER_CHECK(rows <= 1 || v.stride(0) == 1, ValueError) << name << " must be contiguous";
  CheckSameDevice(like, v, "the input", name);
  return DataPtr(v);
}

// A [rows, cols] output of the given dtype, contiguous in its last dim, on `like`'s device.
void CheckOut(const TensorView& out, const char* name, int64_t rows, int64_t cols, uint8_t code,
              uint8_t bits, const TensorView& like) {
  FLASHINFER_CHECK(out.ndim() == 2 && out.size(0) == rows && out.size(1) == cols, ValueError)
      << name << " has the wrong shape";
  CheckDType(out, name, code, bits);
  FLASHINFER_CHECK(out.size(1) <= 1 || out.stride(1) == 1, ValueError)
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
  return {static_cast<const int32_t*>(PerRow(top_k_values, "top_k", rows, kDLInt, 32, like)),
          static_cast<const float*>(PerRow(top_p_values, "top_p", rows, kDLFloat, 32, like)),
          static_cast<const float*>(PerRow(min_p_values, "min_p", rows, kDLFloat, 32, like)),
          static_cast<int32_t>(top_k),
          static_cast<float>(top_p),
          static_cast<float>(min_p),
          (which & kUseTopK) != 0,
          (which & kUseTopP) != 0,
          (which & kUseMinP) != 0,
          top_k_first};
}

// A seed or offset tensor: 1-D int64 or uint64 with one entry or one per output row. Returns
// its data (null when absent) and sets *per_row.
const uint64_t* SeedValues(const Optional<TensorView>& t, const char* name, int64_t rows,
                           const TensorView& like, bool* per_row) {
  *per_row = false;
  if (!t.has_value()) return nullptr;
  const TensorView& v = t.value();
  const DLDataType dt = v.dtype();
  FLASHINFER_CHECK((dt.code == kDLInt || dt.code == kDLUInt) && dt.bits == 64 && dt.lanes == 1,
                   TypeError)
      << name << " has dtype " << DTypeName(dt) << ", expected int64 or uint64";
  FLASHINFER_CHECK(v.ndim() == 1 && (v.size(0) == 1 || v.size(0) == rows), ValueError)
      << name << " must be 1-D with 1 or " << rows << " elements";
  FLASHINFER_CHECK(v.size(0) <= 1 || v.stride(0) == 1, ValueError) << name << " must be contiguous";
  CheckSameDevice(like, v, "the input", name);
  *per_row = v.size(0) > 1;
  return static_cast<const uint64_t*>(DataPtr(v));
}

SamplingRandom RandomOf(const Optional<TensorView>& seed_values,
                        const Optional<TensorView>& offset_values, int64_t seed, int64_t offset,
                        int64_t rows, const TensorView& like) {
  FLASHINFER_CHECK(seed_values.has_value() == offset_values.has_value(), ValueError)
      << "seed and offset must both be tensors or both be ints";
  SamplingRandom r{};
  r.seed_values = SeedValues(seed_values, "seed", rows, like, &r.seed_per_row);
  r.offset_values = SeedValues(offset_values, "offset", rows, like, &r.offset_per_row);
  r.seed = static_cast<uint64_t>(seed);
  r.offset = static_cast<uint64_t>(offset);
  return r;
}

// The output rows of a sampling call: `out` 1-D of the indices' dtype (int32 without
// indices), `valid` (optional) 1-D bool, both on `input`'s device.
SamplingRows RowsOut(const TensorView& out, const Optional<TensorView>& valid,
                     const Optional<TensorView>& indices, const Rows& in, const char* name,
                     const TensorView& input) {
  FLASHINFER_CHECK(out.ndim() == 1, ValueError) << "out must be 1-D";
  const int64_t rows = out.size(0);
  const bool wide = indices.has_value() && indices.value().dtype().bits == 64;
  CheckDType(out, "out", kDLInt, wide ? 64 : 32);
  FLASHINFER_CHECK(rows <= 1 || out.stride(0) == 1, ValueError) << "out must be contiguous";
  CheckSameDevice(input, out, "the input", "out");
  FLASHINFER_CHECK(indices.has_value() || rows == in.rows, ValueError)
      << "out has " << rows << " rows, " << name << " " << in.rows << " (and no indices)";
  bool* valid_data = static_cast<bool*>(PerRow(valid, "valid", rows, kDLBool, 8, input));
  const void* index = PerRow(indices, "indices", rows, kDLInt, wide ? 64 : 32, input);
  return {DataPtr(out), valid_data, index, wide, rows, in.rows, in.stride};
}

void Softmax(TensorView out, TensorView logits, Optional<TensorView> temperatures,
             double temperature, bool pdl) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  CheckOut(out, "out", in.rows, in.vocab, kDLFloat, 32, logits);
  const auto* temps =
      static_cast<const float*>(PerRow(temperatures, "temperature", in.rows, kDLFloat, 32, logits));
  CheckCuda(logits, "logits");
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(
      softmax_launch(static_cast<float*>(DataPtr(out)), DataPtr(logits), in.rows, in.vocab,
                     in.stride, OutStride(out), temps, static_cast<float>(temperature), in.aligned,
                     pdl, CurrentStream(logits.device())),
      "softmax kernel launch");
}

void SamplingFromProbs(TensorView out, Optional<TensorView> valid, TensorView probs,
                       Optional<TensorView> indices, Optional<TensorView> top_k_values,
                       Optional<TensorView> top_p_values, Optional<TensorView> min_p_values,
                       int64_t top_k, double top_p, double min_p, int64_t which, bool top_k_first,
                       Optional<TensorView> seed_values, Optional<TensorView> offset_values,
                       int64_t seed, int64_t offset) {
  const Rows in = RowsOf(probs, "probs", kDLFloat, 32);
  const SamplingRows rows = RowsOut(out, valid, indices, in, "probs", probs);
  const SamplingFilters filters = FiltersOf(top_k_values, top_p_values, min_p_values, top_k, top_p,
                                            min_p, which, top_k_first, rows.rows, probs);
  const SamplingRandom random =
      RandomOf(seed_values, offset_values, seed, offset, rows.rows, probs);
  CheckCuda(probs, "probs");
  CudaDeviceGuard guard(probs.device().device_id);
  CheckCudaError(
      sampling_from_probs_launch(rows, static_cast<const float*>(DataPtr(probs)), in.vocab, filters,
                                 random, in.aligned, CurrentStream(probs.device())),
      "sampling kernel launch");
}

void SamplingFromLogits(TensorView out, TensorView logits, Optional<TensorView> indices,
                        Optional<TensorView> seed_values, Optional<TensorView> offset_values,
                        int64_t seed, int64_t offset) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  const SamplingRows rows = RowsOut(out, Optional<TensorView>(), indices, in, "logits", logits);
  const SamplingRandom random =
      RandomOf(seed_values, offset_values, seed, offset, rows.rows, logits);
  CheckCuda(logits, "logits");
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(sampling_from_logits_launch(rows, DataPtr(logits), in.vocab, random, in.aligned,
                                             CurrentStream(logits.device())),
                 "sampling kernel launch");
}

void RenormProbs(TensorView out, TensorView probs, Optional<TensorView> top_k_values,
                 Optional<TensorView> top_p_values, int64_t top_k, double top_p, int64_t which) {
  const Rows in = RowsOf(probs, "probs", kDTypeCode, kDTypeBits);
  CheckOut(out, "out", in.rows, in.vocab, kDTypeCode, kDTypeBits, probs);
  FLASHINFER_CHECK(which == kUseTopK || which == kUseTopP, ValueError)
      << "renorm takes top_k or top_p";
  const SamplingFilters filters = FiltersOf(top_k_values, top_p_values, Optional<TensorView>(),
                                            top_k, top_p, 0.0, which, false, in.rows, probs);
  CheckCuda(probs, "probs");
  CudaDeviceGuard guard(probs.device().device_id);
  CheckCudaError(
      renorm_probs_launch(DataPtr(out), DataPtr(probs), in.rows, in.vocab, in.stride,
                          OutStride(out), filters, in.aligned, CurrentStream(probs.device())),
      "renorm kernel launch");
}

void TopKMaskLogits(TensorView out, TensorView logits, Optional<TensorView> top_k_values,
                    int64_t top_k) {
  const Rows in = RowsOf(logits, "logits", kDTypeCode, kDTypeBits);
  CheckOut(out, "out", in.rows, in.vocab, kDTypeCode, kDTypeBits, logits);
  FLASHINFER_CHECK(top_k >= 1 && top_k <= std::numeric_limits<int32_t>::max(), ValueError)
      << "top_k must be in [1, 2^31 - 1], got " << top_k;
  const auto* ks =
      static_cast<const int32_t*>(PerRow(top_k_values, "top_k", in.rows, kDLInt, 32, logits));
  CheckCuda(logits, "logits");
  CudaDeviceGuard guard(logits.device().device_id);
  CheckCudaError(mask_logits_launch(DataPtr(out), DataPtr(logits), in.rows, in.vocab, in.stride,
                                    OutStride(out), ks, static_cast<int32_t>(top_k), in.aligned,
                                    CurrentStream(logits.device())),
                 "top_k_mask_logits kernel launch");
}

tvm::ffi::String DTypeOfModule() { return kDTypeName; }

}  // namespace

FLASHINFER_EXPORT_FUNC(softmax, Softmax);
FLASHINFER_EXPORT_FUNC(sampling_from_probs, SamplingFromProbs);
FLASHINFER_EXPORT_FUNC(sampling_from_logits, SamplingFromLogits);
FLASHINFER_EXPORT_FUNC(renorm_probs, RenormProbs);
FLASHINFER_EXPORT_FUNC(top_k_mask_logits, TopKMaskLogits);
FLASHINFER_EXPORT_FUNC(dtype, DTypeOfModule);
