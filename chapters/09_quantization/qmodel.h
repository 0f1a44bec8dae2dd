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
#include "common/quant/interleaved_matrix.h"

namespace inferlab::ch09 {

using quant::interleavable;
using quant::qmatrix;
using Interleaved8 = quant::InterleavedMatrix;

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

}  // namespace inferlab::ch09
