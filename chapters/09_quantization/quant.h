#pragma once
/// @file quant.h
/// @brief Chapter 09: weight formats with fewer bits: how each one quantises, and the reference
/// loops of the products that read them.
///
/// The formats, the quantised matrix (QMatrix) and its fast products are the core's vocabulary
/// (common/quant/qmatrix.h, whose note has the table of formats); this chapter makes them:
/// quantize() turns an f32 matrix into any format that is not read from GGUF files only, and
/// qmatmul_ref() is every product written as a plain loop.

#include <cstdint>
#include <string>
#include <vector>

#include "common/quant/qmatrix.h"

namespace inferlab::ch09 {

using quant::all_specs;
using quant::blocks_activations;
using quant::check_block_scales;
using quant::default_qgemv_version;
using quant::dequantize;
using quant::e4m3_to_f32;
using quant::Format;
using quant::has_qgemv_v2;
using quant::qmatmul;
using quant::QMatrix;
using quant::QuantSpec;

/// `w` quantised with `spec`, as a Linear (keeping w's bias). `what` names the matrix in errors.
Linear quantize(const Linear& w, const QuantSpec& spec, const std::string& what = "quantize");

/// Quantises an F32/F16/BF16 CPU matrix [n_out, n_in] (n_in must be a multiple of 32 for the block formats
/// and of the group size for int4). Throws, naming `what` and the weight or block, for a weight
/// that is not finite and for a scale beyond its type's range (q8_0/q4_0 store theirs as f16,
/// largest 65504: a q8_0 block with |w| above about 8.3e6 cannot be stored).
QMatrix quantize(const Tensor& w, const QuantSpec& spec, const std::string& what = "quantize");

/// x [M, n_in] (CPU, F32, n_in a multiple of 32) rounded through q8_0 blocks: each value
/// d·round(x/d), d = max |x| / 127 per block of 32 stored as f16. It is the x that the products of
/// blocks_activations() formats multiply, and the error they add: at most d/2 per value.
Tensor q8_0_activations(const Tensor& x);

/// The reference versions: plain loops, CPU only, same results as qmatmul up to float
/// summation order (the integer parts are exact).
void qmatmul_ref(const Tensor& x, const QMatrix& w, Tensor& out);

/// fp8 E4M3FN: the byte of a value. Rounds to nearest even, saturates to ±448 (e4m3_to_f32 reads it back).
std::uint8_t f32_to_e4m3(float f);

}  // namespace inferlab::ch09
