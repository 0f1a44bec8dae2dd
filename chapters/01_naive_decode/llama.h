#pragma once
/// @file llama.h
/// @brief Chapter 01: the forward pass of a Llama-family decoder over a whole sequence.
///
/// The model itself (its weights, loaders and blocks) is the core's, common/models/llama.h. The
/// forward pass here is a short skeleton (embed -> layers -> norm -> head) over its named blocks;
/// chapter 02 adds a KV cache to exactly this code (common/models/kv_cache.h).

#include <cstdint>
#include <vector>

#include "common/models/llama.h"

namespace inferlab::ch01 {

using models::Llama;
using models::LlamaLayer;

/// Chapter 01's attention block over a whole sequence: q, k, v projections, RoPE at
/// `positions`, causal attention, output projection. h [T, D] -> [T, D].
Tensor attention_block(const Llama& m, const LlamaLayer& l, const Tensor& h, const Tensor& positions);

/// The forward pass over a whole sequence, from the first token: returns logits for every
/// position [T, V], or only for the last one [1, V] when `all_positions` is false.
Tensor forward(const Llama& m, const std::vector<std::int32_t>& tokens, bool all_positions = false);

}  // namespace inferlab::ch01
