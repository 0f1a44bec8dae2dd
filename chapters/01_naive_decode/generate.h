#pragma once
/// @file generate.h
/// @brief Chapter 01's use of the generate loop (common/models/generate.h): naive decoding, which
/// re-runs the whole sequence for every new token.

#include <vector>

#include "chapters/01_naive_decode/llama.h"
#include "common/models/generate.h"

namespace inferlab::ch01 {

using models::Generation;
using models::OnToken;

/// Naive decoding: every step runs the forward pass over the whole sequence so far and keeps
/// only its last row of logits. Throws when the prompt plus max_new would not fit the context.
Generation generate_naive(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                          const std::vector<std::int64_t>& eos_ids, const OnToken& on_token = nullptr);

}  // namespace inferlab::ch01
