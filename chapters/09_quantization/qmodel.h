#pragma once
/// @file qmodel.h
/// @brief Chapter 09: a Llama whose projections are quantised matrices.
///
/// Only the seven projections per layer and the output head are quantised (the bytes a decode
/// step reads); embeddings and norms stay as they were. The model is chapter 01's Llama and the
/// forward pass chapter 02's, unchanged: each projection is a Linear, and linear() multiplies a
/// packed (quantised) one with qmatmul().

#include <memory>

#include "chapters/01_naive_decode/llama.h"
#include "chapters/09_quantization/quant.h"
#include "common/quant/interleaved.h"

namespace inferlab::ch09 {

/// `m` with every projection (and the head) quantised with `spec`. A matrix whose input width is
/// not a multiple of width_multiple(spec) is an error; with `kept`, it stays as it is instead
/// (llama.cpp, too, writes another type where a row is not whole blocks) and its name, as in
/// "mlp.down_proj", is added to `kept` once.
models::Llama quantize_model(const models::Llama& m, const QuantSpec& spec, std::vector<std::string>* kept = nullptr);

/// The multiple of which a matrix's input width n_in must be for `spec`: its group (int4), 32
/// (the block formats), else 1.
std::int64_t width_multiple(const QuantSpec& spec);

/// The number of weights in the projections and the head (a tied head counted too: quantising
/// gives it its own copy).
std::int64_t matrix_weights(const models::Llama& m);

/// The packed matrix of a quantised Linear; throws naming `what` if it is not one of chapter
/// 09's formats.
const QMatrix& qmatrix(const Linear& l, const std::string& what);

/// A QMatrix laid out for the CPU's decode product: eight rows' blocks together
/// (common/quant/interleaved.h), so that one vpdpbusd serves eight rows and no row needs a
/// horizontal sum. The values are the matrix's. Its products multiply x as integers: the GGUF
/// formats, int8 (tensor and rows) and int4 take x as q8_0 blocks (q8_0_activations(x) · Wᵀ, as the
/// GGUF formats' row-order products do), LLM.int8() takes x quantised by row as its own product
/// does. For int8 and int4 that is one more rounding than their row-order product, which keeps x
/// in f32: at most half a step of x's block, max |x| / 254, per value.
class Interleaved8 : public PackedMatrix {
 public:
  explicit Interleaved8(const QMatrix& q);  ///< throws unless interleavable(q)
  /// The matrix back, in row order.
  QMatrix rows_in_order() const;

  void matmul(const Tensor& x, Tensor& out) const override;
  std::int64_t out_features() const override { return layout_.rows(); }
  std::int64_t in_features() const override { return layout_.cols(); }
  std::int64_t bytes() const override { return layout_.bytes(); }
  Device device() const override { return Device::CPU; }
  /// On the CPU a copy of this; elsewhere the matrix in row order (the CUDA kernels read that).
  std::shared_ptr<const PackedMatrix> to_device(Device d) const override;
  std::string format() const override { return spec_.name(); }

 private:
  QuantSpec spec_;
  quant::Interleaved8 layout_;
};

/// Whether q can be stored as Interleaved8: a CPU matrix of any format but fp8 (whose values have
/// no integer form) and the GGUF ones without an eight-row kernel (q2_k, q3_k), rows a multiple of 8
/// and n_in whole blocks (32, 256 for q4_k, q5_k, q6_k and iq4_xs, the group
/// for int4), in a build with the kernels (quant::interleaved_kernels()).
bool interleavable(const QMatrix& q);
/// `m` with every matrix that can be interleaved so; the number changed in `count` when given.
/// The fast kernel: `run` does this to a GGUF model on the CPU, ch09_quantization (--kernel fast, the
/// default) to every quantised model.
void interleave_blocks(models::Llama& m, int* count = nullptr);

}  // namespace inferlab::ch09
