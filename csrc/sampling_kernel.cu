// Kernel TU of the sampling module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/sampling.cuh"
#include "sampling_config.h"
#include "sampling_launcher.h"

namespace fs = flashinfer::sampling;

namespace {
fs::Filters ToFilters(const SamplingFilters& f) {
  return {{f.top_k_values, f.top_k},
          {f.top_p_values, f.top_p},
          {f.min_p_values, f.min_p},
          f.use_top_k,
          f.use_top_p,
          f.use_min_p,
          f.top_k_first};
}

fs::RandomSource ToRandom(const SamplingRandom& r) {
  return {{r.seed_values, r.seed, r.seed_per_row ? 1 : 0},
          {r.offset_values, r.offset, r.offset_per_row ? 1 : 0}};
}

template <typename I>
fs::RowSource<I> ToSource(const SamplingRows& rows) {
  return {static_cast<const I*>(rows.indices), rows.row_stride, rows.input_rows};
}

// Calls f(I{}) with I the token and index type of `rows`.
template <typename F>
cudaError_t WithIndexType(const SamplingRows& rows, F&& f) {
  return rows.wide_index ? f(int64_t{}) : f(int32_t{});
}
}  // namespace

cudaError_t softmax_launch(float* out, const void* logits, int64_t rows, int64_t vocab,
                           int64_t in_stride, int64_t out_stride, const float* temperatures,
                           float temperature, bool aligned, bool pdl, cudaStream_t stream) {
  return fs::Softmax(out, static_cast<const DType*>(logits), rows, vocab, in_stride, out_stride,
                     fs::Param<float>{temperatures, temperature}, aligned, pdl, stream);
}

cudaError_t sampling_from_probs_launch(const SamplingRows& rows, const float* probs, int64_t vocab,
                                       SamplingFilters filters, SamplingRandom random, bool aligned,
                                       cudaStream_t stream) {
  return WithIndexType(rows, [&](auto index) {
    using I = decltype(index);
    return fs::FilteredSampling(static_cast<I*>(rows.out), rows.valid, probs, rows.rows, vocab,
                                ToSource<I>(rows), ToFilters(filters), ToRandom(random), aligned,
                                stream);
  });
}

cudaError_t sampling_from_logits_launch(const SamplingRows& rows, const void* logits, int64_t vocab,
                                        SamplingRandom random, bool aligned, cudaStream_t stream) {
  return WithIndexType(rows, [&](auto index) {
    using I = decltype(index);
    return fs::LogitsSampling(static_cast<I*>(rows.out), static_cast<const DType*>(logits),
                              rows.rows, vocab, ToSource<I>(rows), ToRandom(random), aligned,
                              stream);
  });
}

cudaError_t renorm_probs_launch(void* out, const void* probs, int64_t rows, int64_t vocab,
                                int64_t in_stride, int64_t out_stride, SamplingFilters filters,
                                bool aligned, cudaStream_t stream) {
  return fs::RenormProbs(static_cast<DType*>(out), static_cast<const DType*>(probs), rows, vocab,
                         in_stride, out_stride, ToFilters(filters), aligned, stream);
}

cudaError_t mask_logits_launch(void* out, const void* logits, int64_t rows, int64_t vocab,
                               int64_t in_stride, int64_t out_stride, const int32_t* top_k_values,
                               int32_t top_k, bool aligned, cudaStream_t stream) {
  return fs::MaskLogits(static_cast<DType*>(out), static_cast<const DType*>(logits), rows, vocab,
                        in_stride, out_stride, fs::Param<int32_t>{top_k_values, top_k}, aligned,
                        stream);
}
