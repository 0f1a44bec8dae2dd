#pragma once
// Chapter 09's internals shared by the reference loops, the fast CPU path and the CUDA kernels.
#include <vector>

#include "chapters/09_quantization/quant.h"
#include "common/gguf.h"

namespace inferlab::ch09 {

/// The fast CPU products' threading and decode policy (quant_fast.cpp, repack.cpp): below
/// kParallel multiply-adds one thread is faster; up to kDirectRows rows of x are multiplied straight
/// from the packed bytes, more share one unpacked copy of each weight row. int4 goes straight up
/// to kInt4DirectRows (four rows of x per widening of its bytes): measured against the unpacked
/// rows, it is faster at every count from 9 to 32 (2.2x at 9, 1.35x at 32; docs/performance.md),
/// so it covers what the f32 GEMV covers (a verification pass, a small decode batch).
inline constexpr std::int64_t kParallel = 1 << 18;
inline constexpr std::int64_t kDirectRows = 4;
inline constexpr std::int64_t kInt4DirectRows = 32;

/// The value the format gives weight (n, k) (CPU).
float weight_value(const QMatrix& q, std::int64_t n, std::int64_t k);
/// The GGUF block formats (the blocks_activations() ones), each with the tensor type whose blocks
/// it holds; gguf_type() looks one up (and throws for the other formats).
const std::vector<std::pair<Format, gguf::Type>>& gguf_formats();
gguf::Type gguf_type(Format f);
/// Where a GGUF block format's block keeps its f16 scales: d, and the minimum's scale (m or dmin)
/// where there is one.
std::vector<int> half_offsets(Format f);
/// An f16 stored at p (little-endian), as float.
float from_half(const std::uint8_t* p);
/// llama.cpp's reference Q8_0 / Q4_0 block quantisers: 32 floats -> 34 / 18 bytes.
void quantize_q8_0_block(const float* x, std::uint8_t* out);
void quantize_q4_0_block(const float* x, std::uint8_t* out);
/// x [M, n_in] as q8_0 blocks, side by side: the int8 values, each block's scale (its f16, as a
/// float) and Σ q over the block (the minimum's term of q4_1, q5_1, q4_k and q5_k). value() is
/// q8_0_activations().
struct BlockedActivations {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int8_t> q;       ///< [M, n_in]
  std::vector<float> d;             ///< [M, n_in / 32]
  std::vector<std::int32_t> sum;    ///< [M, n_in / 32]
  std::vector<std::int16_t> sum16;  ///< [M, n_in / 16]: Σ q over each half block (the k-quants' 16-value groups)
  /// x quantised block by block with quantize_q8_0_block (the reference).
  explicit BlockedActivations(const Tensor& x);
  /// Sized for M × n_in, unfilled (blocked_activations_fast fills it).
  BlockedActivations(std::int64_t m, std::int64_t n_in);
  float value(std::int64_t m, std::int64_t k) const {
    return d[static_cast<std::size_t>(m * (cols / 32) + k / 32)] *
           static_cast<float>(q[static_cast<std::size_t>(m * cols + k)]);
  }
  /// Every value() [M, n_in], row-major: x as the blocks round it (the prefill products' input).
  std::vector<float> rounded() const;
};
/// 1 / d, or 0 where d is 0 or 1 / d overflows (quantize_q8_0_block's inverse scale).
float inverse_scale(float d);
/// The same values as BlockedActivations(x), bit for bit, eight lanes at a time where the CPU has
/// AVX2 (the fast products quantise x once per product, so this runs 57 times a decode step).
BlockedActivations blocked_activations_fast(const Tensor& x);
/// Throws naming `format` and the place of the first NaN or Inf in the CPU tensor x [M, K]: the
/// formats that quantise x would cast it to an integer, which is undefined.
void check_finite_activations(const Tensor& x, const std::string& format);
/// LLM.int8(): columns of x with any |x| ≥ threshold.
std::vector<char> outlier_columns(const Tensor& x, float threshold);
/// LLM.int8(): each row of x quantised to int8 by its absmax over the non-skipped columns.
void quantize_rows_int8(const Tensor& x, const std::vector<char>& skip, std::vector<std::int8_t>& q, std::vector<float>& s);

/// The fast CPU product (OpenMP over output rows; with AVX2 a few rows of x are multiplied straight
/// from the packed bytes, more rows share one unpacked copy of each weight row).
void qmatmul_fast(const Tensor& x, const QMatrix& w, Tensor& out);
/// The CUDA product (quant_cuda.cu; a stub without CUDA).
void cuda_qmatmul(const Tensor& x, const QMatrix& w, Tensor& out);

}  // namespace inferlab::ch09
