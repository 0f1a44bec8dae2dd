#pragma once
/// @file interleaved_matrix.h
/// @brief A quantised matrix laid out for the CPU's decode product (eight rows' blocks together).

#include <memory>
#include <string>

#include "common/quant/interleaved.h"
#include "common/quant/qmatrix.h"

namespace inferlab::quant {
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
class InterleavedMatrix : public PackedMatrix {
 public:
  explicit InterleavedMatrix(const QMatrix& q);  ///< throws unless interleavable(q)
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
  Interleaved8 layout_;
};

/// Whether q can be stored as an InterleavedMatrix: a CPU matrix of any format but fp8 (whose values have
/// no integer form) and the GGUF ones without an eight-row kernel (q2_k, q3_k), rows a multiple of 8
/// and n_in whole blocks (32, 256 for q4_k, q5_k, q6_k and iq4_xs, the group
/// for int4), in a build with the kernels (quant::interleaved_kernels()).
bool interleavable(const QMatrix& q);
}  // namespace inferlab::quant
