// Kernel TU of the sampling module (nvcc). No tvm-ffi headers here: see docs/jit.md.
#include "flashinfer/sampling.cuh"
#include "sampling_config.h"
#include "sampling_launcher.h"

namespace fs = flashinfer::sampling;

namespace {
fs::Filters ToFilters(const SamplingFilters& f) {
  return {{f.top_k_values, f.top_k}, {f.top_p_values, f.top_p}, {f.min_p_values, f.min_p},
          f.use_top_k, f.use_top_p, f.use_min_p, f.top_k_first};
}
}  // namespace

cudaError_t softmax_launch(float* out, const void* logits, int64_t rows, int64_t vocab,
                           int64_t in_stride, int64_t out_stride, const float* temperatures,
                           float temperature, bool aligned, bool pdl, cudaStream_t stream) {
  return fs::Softmax(out, static_cast<const DType*>(logits), rows, vocab, in_stride, out_stride,
                     fs::Param<float>{temperatures, temperature}, aligned, pdl, stream);
}

cudaError_t sampling_from_probs_launch(int32_t* out, const float* probs, int64_t rows,
                                       int64_t vocab, const int32_t* indices, int64_t input_rows,
                                       int64_t row_stride, SamplingFilters filters, uint64_t seed,
                                       uint64_t offset, bool aligned, cudaStream_t stream) {
  return fs::FilteredSampling(out, probs, rows, vocab, {indices, row_stride, input_rows},
                              ToFilters(filters), seed, offset, aligned, stream);
}

cudaError_t sampling_from_logits_launch(int32_t* out, const void* logits, int64_t rows,
                                        int64_t vocab, const int32_t* indices,
                                        int64_t input_rows, int64_t row_stride, uint64_t seed,
                                        uint64_t offset, bool aligned, cudaStream_t stream) {
  return fs::LogitsSampling(out, static_cast<const DType*>(logits), rows, vocab,
                            {indices, row_stride, input_rows}, seed, offset, aligned, stream);
}

cudaError_t renorm_probs_launch(float* out, const float* probs, int64_t rows, int64_t vocab,
                                int64_t in_stride, int64_t out_stride, SamplingFilters filters,
                                bool aligned, cudaStream_t stream) {
  return fs::RenormProbs(out, probs, rows, vocab, in_stride, out_stride, ToFilters(filters),
                         aligned, stream);
}

cudaError_t mask_logits_launch(void* out, const void* logits, int64_t rows, int64_t vocab,
                               int64_t in_stride, int64_t out_stride, const int32_t* top_k_values,
                               int32_t top_k, bool aligned, cudaStream_t stream) {
  return fs::MaskLogits(static_cast<DType*>(out), static_cast<const DType*>(logits), rows, vocab,
                        in_stride, out_stride, fs::Param<int32_t>{top_k_values, top_k}, aligned,
                        stream);
}
