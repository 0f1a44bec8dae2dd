#pragma once
/// @file ops_cpu.h
/// @brief The fast CPU paths behind ops:: (inputs already checked by check::).
///
/// Only matmul and attention have one: the elementwise ops are limited by memory, not
/// arithmetic, so on CPU tensors ops:: runs their ref:: loops as they are.

#include "common/ops.h"

namespace inferlab::cpu {

void matmul(const Tensor& x, const Tensor& w, Tensor& out);
/// Attention over a checked, resolved batch (a single sequence is a batch of one).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
               const AttentionParams& p);

/// y[m·y_stride] = x[m, :] · w for m < M: M dot products of length K against one f32 row,
/// reading the row once (the fast GEMV's inner kernel, for other chapters' formats).
void dot_rows(const float* x, std::int64_t M, std::int64_t K, const float* w, float* y, std::int64_t y_stride);

/// Reads element i of a weight tensor (F32, F16 or BF16) as float.
inline float weight_at(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace inferlab::cpu
