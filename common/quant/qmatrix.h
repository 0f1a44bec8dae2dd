#pragma once
/// @file qmatrix.h
/// @brief The stored formats of weight matrices, the quantised matrix type, and the products that
/// read it: the one vocabulary every loader, kernel and chapter uses.
///
/// Chapter 09 teaches the formats (how each quantises, what it costs, what error it adds: its
/// quantize() and reference loops); what a model runs is here.
///
/// Decoding is memory-bound, so the bytes per weight are the speed. Every format here stores a
/// weight matrix W [n_out, n_in] (one row per output, as torch.nn.Linear) in fewer bits, and
/// every product y = x·Wᵀ reads those bits, never a dequantised copy. n_in is the width of the
/// input, the length each dot product runs over (D for q/k/v and gate/up, F for down); it is not
/// the lecture's K, the number of KV heads.
///
/// | format         | stores                                               | bits/weight      |
/// |----------------|------------------------------------------------------|------------------|
/// | int8_tensor    | q = round(w/s), s = max|W|/127 for the whole matrix   | 8 + 32/(n_out·n_in) |
/// | int8_row       | the same per output row ("vector-wise")              | 8 + 32/n_in      |
/// | llm_int8       | int8_row weights; activations int8 per row except the | 8 + 32/n_in      |
/// |                | outlier feature columns (|x| ≥ threshold), kept 16-bit |                  |
/// | int4_gG_sym    | groups of G along n_in: q ∈ [−8, 7], s = max|w|/7     | 4 + 32/G         |
/// | int4_gG_asym   | groups of G: q ∈ [0, 15], s = (max−min)/15, zero z    | 4 + 40/G         |
/// | q8_0           | llama.cpp blocks of 32: f16 d = max|w|/127, 32 × int8  | 8.5              |
/// | q4_0           | llama.cpp blocks of 32: f16 d = m/−8, 32 × 4-bit       | 4.5              |
/// |                | (x quantised to q8_0 blocks for the product)         |                  |
/// | fp8_e4m3       | OCP E4M3FN bytes of w/s, s = max|W|/448               | 8 + 32/(n_out·n_in) |
/// | q4_k           | llama.cpp super-blocks of 256: f16 d, dmin; 8 × 6-bit | 4.5              |
/// |                | scale and min; (d·sc)·q − dmin·m, q 4-bit             |                  |
/// | q6_k           | llama.cpp super-blocks of 256: 16 int8 scales, f16 d; | 6.5625           |
/// |                | (d·sc)·(q − 32), q 4 + 2 bits                         |                  |
/// | q4_1           | blocks of 32: f16 d, f16 m; d·q + m, q 4-bit           | 5                |
/// | q5_0           | blocks of 32: f16 d; d·(q − 16), q 4 + 1 bits          | 5.5              |
/// | q5_1           | blocks of 32: f16 d, f16 m; d·q + m, q 4 + 1 bits      | 6                |
/// | q5_k           | super-blocks of 256 as q4_k, q 4 + 1 bits              | 5.5              |
/// | q2_k           | super-blocks of 256: f16 d, dmin; 16 × 4-bit scale and | 2.625            |
/// |                | min; (d·sc)·q − dmin·m, q 2-bit                        |                  |
/// | q3_k           | super-blocks of 256: f16 d; 16 × 6-bit scales;         | 3.4375           |
/// |                | (d·(sc − 32))·(q − 4), q 2 + 1 bits                    |                  |
/// | iq4_nl         | blocks of 32: f16 d; d·T[q], q 4-bit, T a fixed table  | 4.5              |
/// |                | of 16 int8 levels denser near 0 (non-linear)          |                  |
/// | iq4_xs         | super-blocks of 256: f16 d; 8 × 6-bit scales;          | 4.25             |
/// |                | (d·(sc − 32))·T[q], T as iq4_nl                       |                  |
///
/// The GGUF formats (q8_0 and every one below it in the table) multiply x quantised to q8_0
/// blocks, so their products sum bytes times bytes in int32 and scale once per block of 32; the
/// other formats keep x in f32 (weight-only quantisation). llama.cpp's CPU products do the same,
/// with an extra sum per block (its Q8_1) for the formats with a minimum, and blocks of 256 with an
/// f32 scale (its Q8_K) for the k-quants.
///
/// q2_k … q6_k, q4_1, q5_0, q5_1, iq4_nl and iq4_xs are read from GGUF files, not made here: a downloaded
/// Q4_K_M file is mostly q4_k and q6_k, with q5_0 (llama.cpp's stand-in for q4_k) where a row is
/// not a whole number of 256-value super-blocks; q4_1, q5_0 and q5_1 are also file types of their
/// own. Their quantisers (searching scales and mins per sub-block) are llama.cpp's own lesson.
/// iq4_nl and iq4_xs are 4-bit files (IQ4_NL, IQ4_XS) whose nibble indexes a table of levels
/// rather than standing for q − 8: the product looks each nibble up (one vpshufb for 32 of them)
/// and then multiplies bytes as q8_0 does.

#include <cstdint>
#include <string>
#include <vector>

#include "common/linear.h"
#include "common/quant/format.h"
#include "common/tensor.h"

namespace inferlab::quant {

struct QuantSpec {
  Format format = Format::Int8Row;
  int group = 32;          ///< int4 group size along the input width n_in (32, 64, 128)
  float threshold = 6.0f;  ///< LLM.int8(): activation magnitude that makes a column an outlier
  /// "int8_row", "int4_g64_asym", "q4_0", ... (and parse() reads the same names).
  std::string name() const;
  static QuantSpec parse(const std::string& name);
};

/// The formats ch09_quantization compares, in table order.
std::vector<QuantSpec> all_specs();

/// A quantised weight matrix [n_out, n_in]: a Linear's packed weight (linear() calls qmatmul for it).
struct QMatrix : PackedMatrix {
  QuantSpec spec;
  std::int64_t rows = 0, cols = 0;  ///< n_out, n_in
  /// The packed values, row-major: int8 (int8_*, llm_int8), 4-bit pairs (int4: byte j of a group
  /// holds element j in its low nibble and element j + G/2 in its high one, as Q4_0 does), GGUF
  /// blocks (q8_0: 34 bytes, q4_0 and iq4_nl: 18, q4_1: 20, q5_0: 22, q5_1: 24 bytes per 32
  /// weights; q2_k: 84, q3_k: 110, iq4_xs: 136, q4_k: 144, q5_k: 176, q6_k: 210 bytes per 256),
  /// fp8 bytes.
  Tensor data;
  Tensor scales;  ///< F32: one (int8_tensor, fp8), per row (int8_row, llm_int8), per group (int4)
  Tensor zeros;   ///< U8 per group (int4 asym)
  /// On CUDA, the quants in the layout of the product's version 2 (common/quant/gemv_q.h: a row's
  /// quants contiguous for 16-byte loads, the f16 scales of q8_0, q4_0 and q4_k in `gpu_scales`,
  /// q4_k's sub-block scales and mins in `gpu_sub`), made by to(Device::CUDA) for the formats whose
  /// data is not already in it (q8_0, q4_0, q4_k, int4 with groups of 64 or 128); undefined
  /// otherwise. Version 1 reads `data`.
  Tensor gpu_quants, gpu_scales, gpu_sub;
  /// The CUDA product's version this matrix runs (1 or 2; 0: default_qgemv_version()).
  int gemv_version = 0;

  QMatrix() = default;
  QMatrix(QuantSpec spec_, std::int64_t rows_, std::int64_t cols_, Tensor data_, Tensor scales_ = {}, Tensor zeros_ = {})
      : spec(spec_),
        rows(rows_),
        cols(cols_),
        data(std::move(data_)),
        scales(std::move(scales_)),
        zeros(std::move(zeros_)) {}
  Device device() const override { return data.device(); }
  /// Bytes read by a product: the packed data plus scales and zero points.
  std::int64_t bytes() const override;
  double bits_per_weight() const { return 8.0 * static_cast<double>(bytes()) / static_cast<double>(rows * cols); }
  /// On device d; on CUDA with the product's version `gemv_version` (0: the default).
  QMatrix to(Device d, int gemv_version = 0) const;

  // As a Linear's packed weight.
  void matmul(const Tensor& x, Tensor& out) const override;
  std::int64_t out_features() const override { return rows; }
  std::int64_t in_features() const override { return cols; }
  std::shared_ptr<const PackedMatrix> to_device(Device d) const override { return std::make_shared<QMatrix>(to(d)); }
  std::string format() const override { return spec.name(); }
};

/// Throws "<what>: row n, block b has scale nan" unless every q8_0/q4_0 block of `blocks`
/// ([rows, row bytes] U8, as a GGUF stores them) has a finite f16 scale.
void check_block_scales(const Tensor& blocks, Format format, const std::string& what);
/// Back to F32 (CPU): what the stored bits mean.
Tensor dequantize(const QMatrix& q);

/// Whether products with `f` quantise x into q8_0 blocks first (the GGUF block formats).
bool blocks_activations(Format f);
/// out [M, n_out] = x [M, n_in] · Wᵀ, reading the quantised weights. Weight-only formats keep x in
/// f32. llm_int8 quantises x per row (outside the outlier columns) and accumulates int8·int8
/// products in int32; the blocks_activations() formats quantise x into q8_0 blocks and sum each
/// block's byte products in int32 (as llama.cpp does), so they compute q8_0_activations(x) · Wᵀ.
/// On CUDA tensors this runs the CUDA kernels.
void qmatmul(const Tensor& x, const QMatrix& w, Tensor& out);
Tensor qmatmul(const Tensor& x, const QMatrix& w);

/// The CUDA products by number, as the bf16 GEMV's versions (cuda::GemvVersion):
///   1  one warp per output row reading the packed data with 8-byte loads, unpacking to f32 (the
///      simple version; llm_int8 and q8_0 multiply int8 by dp4a on the blocks as stored)
///   2  int8_row, q8_0, q4_0, int4 and q4_k: the quants repacked for 16-byte loads, x quantised per block
///      of 32 to int8 (as q8_0_activations()), int8 products by dp4a, several rows a warp
///      (common/quant/gemv_q.cuh); the other formats run version 1
/// Version 2 changes the function of int8_row and int4, which keep x in f32 on the CPU and in
/// version 1: they compute q8_0_activations(x) · Wᵀ. A matrix runs the version it was moved to
/// the GPU with (QMatrix::to's argument); left at 0 it runs default_qgemv_version(): the
/// environment's INFERLAB_QGEMV_VERSION (1 or 2, for the GPU check), else 2.
int default_qgemv_version();
/// Whether version 2 multiplies `spec` (else version 1 runs under it).
bool has_qgemv_v2(const QuantSpec& spec);

/// fp8 E4M3FN (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
/// NaN; largest finite 448. The value of a byte (chapter 09 quantises to it, f32_to_e4m3).
float e4m3_to_f32(std::uint8_t b);

}  // namespace inferlab::quant
