#pragma once
// The quantised formats' internals shared by the reference loops, the fast CPU path and the CUDA kernels.
#include <optional>
#include <vector>

#include "common/gguf.h"
#include "common/quant/blocks.h"
#include "common/quant/gemv_q.h"
#include "common/quant/qmatrix.h"

namespace inferlab::quant {

class Interleaved8;

/// The fast CPU products' threading and decode policy (quant_rows.cpp): below kParallel
/// multiply-adds one thread is faster; up to kDirectRows rows of x are multiplied straight from the
/// packed bytes, more share one decoded copy of each weight row (common/quant/blocks.h). int4 goes
/// straight up to kInt4DirectRows (four rows of x per widening of its bytes): measured against the
/// unpacked rows, it is faster at every count from 9 to 32 (2.2x at 9, 1.35x at 32;
/// docs/performance.md), so it covers what the f32 GEMV covers (a verification pass, a small
/// decode batch).
inline constexpr std::int64_t kInt4DirectRows = 32;

/// The value the format gives weight (n, k) (CPU).
float weight_value(const QMatrix& q, std::int64_t n, std::int64_t k);
/// The GGUF block formats (the blocks_activations() ones); gguf_type() is the tensor type of one
/// (the same value: one list of formats), and throws for the other formats.
const std::vector<Format>& gguf_block_formats();
gguf::Type gguf_type(Format f);
/// Values and bytes of one block of a GGUF block format.
std::int64_t block_values(Format f);
std::int64_t block_bytes(Format f);
/// Where a GGUF block format's block keeps its f16 scales: d, and the minimum's scale (m or dmin)
/// where there is one.
std::vector<int> half_offsets(Format f);
/// An f16 stored at p (little-endian), as float.
float from_half(const std::uint8_t* p);
/// x [M, n_in] as q8_0 blocks (common/quant/blocks.h): the int8 values, each block's scale and
/// the sums of its values. value() is q8_0_activations().
/// The scale for values of magnitude up to `range` on a grid of `steps`: range / steps, or 1 where
/// that is 0 (all values 0, or so small that the division underflows).
float scale_for(float range, float steps);
/// Throws naming the mismatch unless x [M, n_in] f32, w and out [M, n_out] f32 fit one product
/// on one device; for the formats that quantise x, also unless x is finite (CPU).
void check_product(const Tensor& x, const QMatrix& w, const Tensor& out);
/// Throws naming `format` and the place of the first NaN or Inf in the CPU tensor x [M, K]: the
/// formats that quantise x would cast it to an integer, which is undefined.
void check_finite_activations(const Tensor& x, const std::string& format);
/// LLM.int8(): columns of x with any |x| ≥ threshold.
std::vector<char> outlier_columns(const Tensor& x, float threshold);
/// LLM.int8(): each row of x quantised to int8 by its absmax over the non-skipped columns.
void quantize_rows_int8(const Tensor& x, const std::vector<char>& skip, std::vector<std::int8_t>& q, std::vector<float>& s);

/// The fast CPU product (OpenMP over output rows; with AVX2 a few rows of x are multiplied straight
/// from the packed bytes, more rows share one unpacked copy of each weight row; the GGUF block
/// formats through quant::blocks_matmul).
void qmatmul_fast(const Tensor& x, const QMatrix& w, Tensor& out);
/// LLM.int8() on int8 rows laid out eight rows at a time (interleaved_matrix.h's InterleavedMatrix): x quantised per
/// row outside the outlier columns, as qmatmul_fast does, its int8 products summed by the
/// interleaved kernel, the outlier columns' 16-bit part added.
void llm_int8_interleaved(const Tensor& x, const quant::Interleaved8& w, float threshold, Tensor& out);
/// The layout and kernel of the CUDA product's version 2 for `f`, where it has one.
std::optional<qgemv::Kind> qgemv_kind(Format f);
/// The CUDA product (common/cuda/qmatmul.cu; a stub without CUDA).
void cuda_qmatmul(const Tensor& x, const QMatrix& w, Tensor& out);

}  // namespace inferlab::quant
