#pragma once
/// @file blocks.h
/// @brief x as q8_0 blocks, and the CPU products of llama.cpp's block types with it, row by row.
///
/// llama.cpp multiplies its block types (Q8_0, Q4_0 … Q6_K, IQ4_NL, IQ4_XS) with the input x
/// quantised to q8_0 blocks of 32: an f16 scale d = max |x| / 127 and 32 int8 values. Weights and
/// activations are then small integers times a scale per block, so a block's 32 products are bytes
/// times bytes, summed exactly in int32, and the scales multiply once per block (or per sub-block of
/// a super-block of 256). These are those products for matrices stored as their files store them,
/// one row's blocks after another (interleaved.h keeps eight rows' blocks together instead).
/// Chapter 09 (`quant.h`) teaches the formats and what the rounding of x costs; this is the
/// machinery that runs them.

#include <cstdint>
#include <functional>
#include <vector>

#include "common/gguf.h"
#include "common/ops_cpu.h"
#include "common/tensor.h"

namespace inferlab::quant {

/// The fast CPU products' threading and decode policy: below kParallel multiply-adds one thread is
/// faster; up to kDirectRows rows of x are multiplied straight from the packed bytes, more share one
/// decoded copy of each weight row.
inline constexpr std::int64_t kParallel = 1 << 18;
inline constexpr std::int64_t kDirectRows = 4;
/// The decode products read their weights as one stream and ask for them this far ahead, into L2
/// (locality hint 2, as cpu::simd::dots asks for f32 weights): on the development machine's Xeon
/// the hardware prefetcher alone left them waiting on memory, at a third to a half of the read
/// ceiling.
inline constexpr std::int64_t kAheadBytes = 16384;
/// Asks for the `bytes` bytes kAheadBytes past p, a cache line at a time.
inline void ask_ahead(const std::uint8_t* p, std::int64_t bytes) { cpu::simd::ask_for(p + kAheadBytes, bytes); }

/// x [M, n_in] as q8_0 blocks, side by side: the int8 values, each block's scale (its f16, as a
/// float) and Σ q over the block (the minimum's term of q4_1, q5_1, q4_k and q5_k).
struct BlockedActivations {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int8_t> q;       ///< [M, n_in]
  std::vector<float> d;             ///< [M, n_in / 32]
  std::vector<std::int32_t> sum;    ///< [M, n_in / 32]
  std::vector<std::int16_t> sum16;  ///< [M, n_in / 16]: Σ q over each half block (the k-quants' 16-value groups)
  /// Sized for M × n_in (a multiple of 32), unfilled.
  BlockedActivations(std::int64_t m, std::int64_t n_in);
  float value(std::int64_t m, std::int64_t k) const {
    return d[static_cast<std::size_t>(m * (cols / 32) + k / 32)] *
           static_cast<float>(q[static_cast<std::size_t>(m * cols + k)]);
  }
  /// Sets sum and sum16 of block b (of all rows × blocks, in order) from its 32 values in q.
  void sum_block(std::int64_t b);
  /// Every value() [M, n_in], row-major: x as the blocks round it (the prefill products' input).
  std::vector<float> rounded() const;
};

/// 1 / d, or 0 where d is 0 or 1 / d overflows (the q8_0 quantiser's inverse scale: such a block
/// is stored as zeros, where inf would be cast to an integer).
float inverse_scale(float d);

/// x (CPU, F32, contiguous [M, n_in], n_in a multiple of 32) as q8_0 blocks, as llama.cpp's
/// reference quantiser makes them (d = max |x| / 127 rounded to f16, q = round(x / d) with halves
/// away from zero, x multiplied by inverse_scale(d)), eight lanes at a time where the CPU has AVX2:
/// the products quantise x once each, so this runs for every matrix of a decode step.
BlockedActivations blocked_activations_fast(const Tensor& x);

/// Σ w_k · x_k over int8 vectors, in int32 (exact).
std::int32_t dot_i8(const std::int8_t* w, const std::int8_t* x, std::int64_t n);

/// Y [M, rows] (row stride `rows`) = x̂ · Wᵀ, x̂ = a's values, for a matrix of block type t stored
/// row by row (`rows` × `cols`, gguf::row_bytes(t, cols) bytes a row) at w. Up to kDirectRows rows
/// of x (with AVX2) each block's byte products are summed in int32 and scaled once; more rows (and
/// builds without AVX2) decode each weight row once (gguf::dequantize_block) and multiply it with
/// every row of x̂ in f32: the same function, up to float summation order. Q8_0 multiplies bytes at
/// any M. Every block type gguf.h decodes but F32, F16 and BF16.
void blocks_matmul(gguf::Type t, const std::uint8_t* w, std::int64_t rows, std::int64_t cols, const BlockedActivations& a,
                   float* Y);

/// Y [M, rows] = X [M, cols] · Wᵀ with each weight row decoded once into f32 by decode_row(n, out)
/// and multiplied with every row of X (OpenMP over weight rows): how a packed matrix meets many
/// rows of x (prefill), where decoding once costs less than multiplying the bytes M times.
void decoded_matmul(const float* X, std::int64_t M, std::int64_t rows, std::int64_t cols,
                    const std::function<void(std::int64_t n, float* out)>& decode_row, float* Y);

}  // namespace inferlab::quant
