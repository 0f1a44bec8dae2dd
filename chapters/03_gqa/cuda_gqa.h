#pragma once
/// @file cuda_gqa.h
/// @brief Chapter 03 on the GPU: decode attention that reads each KV head once per group.
///
/// Chapter 02's kernel gives every query head its own block, so with G = N/K query heads per KV
/// head the same keys and values are fetched G times (from L2 if lucky, from HBM if not). This
/// kernel gives one block to a KV head and its whole query group: each key row is loaded once
/// and scored against all G queries, each value row loaded once and accumulated into G outputs.
/// That is where GQA's speed comes from, not only its memory saving.

#include "common/tensor.h"

namespace inferlab::ch03 {

/// One query row q [1, N, H] against the first `len` positions of k, v [S, K, H] (CUDA, f32),
/// split into chunks of 256 positions and merged as in chapter 02; out [1, N, H].
void gqa_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out);

}  // namespace inferlab::ch03
