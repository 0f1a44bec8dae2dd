#pragma once
/// @file interleaved.h
/// @brief Quantised matrices with eight rows' blocks interleaved, for the CPU's decode product: llama.cpp's q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q4_k, q5_k, q6_k and iq4_xs, and int8 rows and int4 groups.
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
/// byte each, 138 bytes read for every 136. q4_1 and q5_1 add the eight f16 minimums m after the
/// scales, their m·Σx taken from x's block sums; q5_0 and q5_1 add 32 bytes of fifth bits laid out
/// as a piece: byte 4·i + t holds in bit 4·h + j the fifth bit of nibble h of byte t of piece j of
/// row i, so one load serves a block and a shift and an AND move a piece's bits to bit 4 of each
/// byte, ORed onto the nibbles: each reads exactly its format's bytes.) q4_k's 256-value
/// super-blocks interleave the same way, their 6-bit scales and minimums unpacked to a byte each
/// (16 bytes a row and super-block instead of 12, so such a matrix reads 148/144 of its bytes),
/// applied per 32-value sub-block as 8-lane vectors; q5_k's are q4_k's with 32 bytes of fifth bits
/// a row laid out as q5_0's (two sub-blocks' pieces 0-3, then 4-7, as a block's: 180/176 of its
/// bytes); q6_k's 6-bit values are split into q4_k's nibble layout and a byte of top bits per four values
/// (the same 210 bytes a row and super-block). llama.cpp repacks tensors in the same spirit at load
/// (its log names the layout, e.g. "repack tensor blk.0.attn_q.weight with q4_0_8x8").
///
/// Two plain layouts ride on the same kernels. Int8 rows (one f32 scale a row: chapter 09's
/// int8_row, int8_tensor and llm_int8) are q8_0's units without the f16 scales, the row's scale
/// applied once to the eight sums at the end. Int4 groups of G = 32, 64 or 128 along a row (an f32
/// scale each and, asymmetric, a zero point z: w = s·(q − z); chapter 09's int4_gG_sym and _asym)
/// are one unit a group: the eight scales, the eight zero points, then the eight rows' G/2 bytes
/// of nibbles in pieces of 4 (byte j of a group holds value j low, value j + G/2 high, as q4_0's);
/// Σ (q − z)·xq over each x block is exact in int32, then scaled by dx and, once a group, by s.
/// Either reads exactly the bytes its format stores.
///
/// The values are the matrix's; only their order (and q8_0's offset) changes. Prefill (more than
/// four rows of x) decodes each row back to f32 (a block type through ggml's bytes and its ref::
/// decoder) and multiplies it with x rounded through its q8_0 blocks, as the row-order path does.

#include <cstdint>
#include <string>

#include "common/gguf.h"
#include "common/quant/blocks.h"
#include "common/tensor.h"

namespace inferlab::quant {

/// What an Interleaved8 holds.
struct Layout {
  enum class Kind { Blocks, Int8Rows, Int4Groups };
  Kind kind = Kind::Blocks;
  gguf::Type type = gguf::Type::Q4_0;  ///< Blocks: the block type
  int group = 0;                       ///< Int4Groups: values a group (32, 64 or 128)
  bool zero_points = false;            ///< Int4Groups: asymmetric (a zero point a group) rather than centred at 8
  static constexpr Layout blocks(gguf::Type t) { return {Kind::Blocks, t, 0, false}; }
  static constexpr Layout int8_rows() { return {Kind::Int8Rows, gguf::Type::Q4_0, 0, false}; }
  static constexpr Layout int4_groups(int group, bool zero_points) {
    return {Kind::Int4Groups, gguf::Type::Q4_0, group, zero_points};
  }
  constexpr bool operator==(const Layout& o) const {
    return kind == o.kind && (kind != Kind::Blocks || type == o.type) && group == o.group && zero_points == o.zero_points;
  }
  /// "q4_k", "int8 rows", "int4 groups of 32 (zero points)".
  std::string name() const;
  /// Bytes of one row's blocks in row order, as the constructor reads them: a block type's bytes;
  /// Int8Rows: the `cols` int8 values; Int4Groups: per group its f32 scale, its zero point (a byte,
  /// with zero points only) and its G/2 bytes of nibbles.
  std::int64_t row_bytes(std::int64_t cols) const;
};

/// A matrix in one of those layouts (CPU, rows a multiple of 8) in the interleaved order. Its
/// products take x as q8_0 blocks, as the row-order block products do.
class Interleaved8 {
 public:
  /// `rows` × `cols` from their row-order blocks (layout.row_bytes(cols) a row) and, for Int8Rows,
  /// the rows' scales; throws unless interleavable(layout, rows, cols).
  Interleaved8(const Layout& layout, std::int64_t rows, std::int64_t cols, const std::uint8_t* row_blocks,
               const float* row_scales = nullptr);
  /// The row-order blocks back, U8 [rows · layout.row_bytes(cols)].
  Tensor rows_in_order() const;
  /// Int8Rows: the rows' scales, F32 [rows].
  const Tensor& row_scales() const { return row_scales_; }
  /// out [M, rows] = x̂ · Wᵀ for x (CPU, contiguous f32 [M, cols], finite) as q8_0 blocks.
  void matmul(const Tensor& x, Tensor& out) const;
  /// Y [M, rows] = a's values times Wᵀ (a's blocks may be any int8 values with their scales: LLM.int8()
  /// passes x quantised by row).
  void matmul(const BlockedActivations& a, float* Y) const;
  /// Weight (n, k), as the product multiplies it (the value the row-order format gives it).
  float value(std::int64_t n, std::int64_t k) const;
  /// Throws, naming `what`, unless x is contiguous f32 [M, cols] and out contiguous f32 [M, rows], on the CPU.
  void check_operands(const Tensor& x, const Tensor& out, const std::string& what) const;

  const Layout& layout() const { return layout_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  /// The bytes a product reads: the units, and the row scales of Int8Rows.
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(data_.nbytes() + (row_scales_.defined() ? row_scales_.nbytes() : 0));
  }

 private:
  Layout layout_;
  std::int64_t rows_, cols_;
  Tensor data_;  ///< rows/8 groups of units: 8 · 18 (q4_0, iq4_nl), 8 · 20 (q4_1), 8 · 22 (q5_0), 8 · 24 (q5_1),
                 ///< 8 · 34 (q8_0), 8 · 148 (q4_k), 8 · 180 (q5_k), 8 · 210 (q6_k),
                 ///< 8 · 138 (iq4_xs), 8 · 32 (int8 rows) or 8 · (4 + G/2), + 8 with zero points (int4 groups) bytes
  Tensor row_scales_;
};

/// Whether this build has the eight-row kernels (they need AVX2, FMA and F16C; without them no
/// matrix is interleaved and every product keeps the row order).
bool interleaved_kernels();
/// Whether a `rows` × `cols` matrix in `layout` can be Interleaved8: a q4_0, q4_1, q5_0, q5_1, q8_0,
/// iq4_nl, q4_k, q5_k, q6_k or iq4_xs matrix, int8 rows, or int4 groups of 32, 64 or 128, with rows a multiple of 8 and
/// whole blocks (32 values; 256 for the super-blocks; a group), in a build with the kernels.
bool interleavable(const Layout& layout, std::int64_t rows, std::int64_t cols);

}  // namespace inferlab::quant
