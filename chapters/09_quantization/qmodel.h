#pragma once
/// @file qmodel.h
/// @brief Chapter 09: a Llama whose projections are quantised matrices.
///
/// Only the seven projections per layer and the output head are quantised (the bytes a decode
/// step reads); embeddings and norms stay as they were. The model is chapter 01's Llama and the
/// forward pass chapter 02's, unchanged: each projection is a Linear, and linear() multiplies a
/// packed (quantised) one with qmatmul().

#include "chapters/01_naive_decode/llama.h"
#include "chapters/09_quantization/quant.h"

namespace inferlab::ch09 {

/// `m` with every projection (and the head) quantised with `spec`.
ch01::Llama quantize_model(const ch01::Llama& m, const QuantSpec& spec);

/// The number of weights in the projections and the head (a tied head counted too: quantising
/// gives it its own copy).
std::int64_t matrix_weights(const ch01::Llama& m);

/// The packed matrix of a quantised Linear; throws naming `what` if it is not one of chapter
/// 09's formats.
const QMatrix& qmatrix(const Linear& l, const std::string& what);

}  // namespace inferlab::ch09
