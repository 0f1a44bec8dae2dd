#pragma once
/// @file ops_cpu.h
/// @brief The CPU implementations behind ops:: (inputs already checked by check::).
///
/// matmul and attention have real fast paths here (ops_cpu.cpp); the elementwise ops forward
/// to the reference loops, which are already limited by memory, not arithmetic.

#include "common/ops.h"

namespace inferlab::cpu {

void matmul(const Tensor& x, const Tensor& w, Tensor& out);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing);
void softmax(const Tensor& x, Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void argmax(const Tensor& x, Tensor& out);

/// The single-threaded loops that ref:: runs after its checks (shared with the fast paths).
namespace loops {
void matmul(const Tensor& x, const Tensor& w, Tensor& out);
void attention_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p,
                    std::int64_t t, std::int64_t h, float* scratch);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing);
void softmax(const Tensor& x, Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void argmax(const Tensor& x, Tensor& out);
}  // namespace loops

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
