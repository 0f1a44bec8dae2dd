#pragma once
/// @file interleaved.h
/// @brief q4_0, q8_0, iq4_nl, q4_k, q6_k and iq4_xs matrices with eight rows' blocks interleaved, for the CPU's decode product.
///
/// A q4_0 or q8_0 row stores its 32-weight blocks one after another, and the row-at-a-time product
/// (blocks.h) pays per row and block for a horizontal sum and a scalar scale. Stored eight
/// rows at a time instead, block b of rows r..r+7 is one unit: the eight f16 scales, then the eight
/// rows' quant bytes (16 for q4_0, 32 for q8_0) in pieces of 4, piece j of row i at byte
/// 16 + 32·j + 4·i. One vpdpbusd then multiplies four values of all eight rows by the same four
/// bytes of x (broadcast), each int32 lane is one row's sum, and the scales apply as one eight-lane
/// vector: no horizontal sums at all. (A q4_0 piece's low nibbles are values 4j..4j+3, its high
/// ones 16+4j..; q8_0's signed bytes are kept as w + 128, unsigned as vpdpbusd wants them, and
/// 128·Σx is taken off again. iq4_nl's blocks are q4_0's; its nibbles become their levels, + 128,
/// with one vpshufb. iq4_xs's super-blocks are eight such blocks, their 6-bit scales unpacked to a
/// byte each, 138 bytes read for every 136.) q4_k's 256-value super-blocks interleave the same way, their 6-bit
/// scales and minimums unpacked to a byte each (16 bytes a row and super-block instead of 12, so
/// such a matrix reads 148/144 of its bytes), applied per 32-value sub-block as 8-lane vectors;
/// q6_k's 6-bit values are split into q4_k's nibble layout and a byte of top bits per four values
/// (the same 210 bytes a row and super-block). llama.cpp repacks tensors in the same spirit at load
/// (its log names the layout, e.g. "repack tensor blk.0.attn_q.weight with q4_0_8x8").
///
/// The values are the matrix's; only their order (and q8_0's offset) changes. Prefill (more than
/// four rows of x) puts each block back in ggml's bytes and decodes it with the format's ref::
/// decoder, as the row-order path does.

#include <cstdint>
#include <string>

#include "common/gguf.h"
#include "common/quant/blocks.h"
#include "common/tensor.h"

namespace inferlab::quant {

/// A matrix of one of those block types (CPU, rows a multiple of 8) in the interleaved order. Its
/// products take x as q8_0 blocks, as the row-order ones do.
class Interleaved8 {
 public:
  /// `rows` × `cols` of type t from their row-order bytes (gguf::row_bytes(t, cols) a row); throws
  /// unless interleavable(t, rows, cols).
  Interleaved8(gguf::Type t, std::int64_t rows, std::int64_t cols, const std::uint8_t* row_bytes);
  /// The row-order bytes back, U8 [rows, gguf::row_bytes(t, cols)].
  Tensor rows_in_order() const;
  /// out [M, rows] = x̂ · Wᵀ for x (CPU, contiguous f32 [M, cols], finite) as q8_0 blocks.
  void matmul(const Tensor& x, Tensor& out) const;
  /// Throws, naming `what`, unless x is contiguous f32 [M, cols] and out contiguous f32 [M, rows], on the CPU.
  void check_operands(const Tensor& x, const Tensor& out, const std::string& what) const;
  /// Y [M, rows] = a's values times Wᵀ.
  void matmul(const BlockedActivations& a, float* Y) const;

  gguf::Type type() const { return type_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(data_.nbytes()); }

 private:
  gguf::Type type_;
  std::int64_t rows_, cols_;
  Tensor
      data_;  ///< rows/8 units a block: 8 · 18 (q4_0, iq4_nl), 8 · 34 (q8_0), 8 · 148 (q4_k), 8 · 210 (q6_k) or 8 · 138 (iq4_xs) bytes
};

/// Whether this build has the eight-row kernels (they need AVX2, FMA and F16C; without them no
/// matrix is interleaved and every product keeps the row order).
bool interleaved_kernels();
/// Whether a `rows` × `cols` matrix of type t can be Interleaved8: a q4_0, q8_0, iq4_nl, q4_k, q6_k
/// or iq4_xs matrix with rows a multiple of 8 and whole blocks, in a build with the kernels.
bool interleavable(gguf::Type t, std::int64_t rows, std::int64_t cols);

}  // namespace inferlab::quant
