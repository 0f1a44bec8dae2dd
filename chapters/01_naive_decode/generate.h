#pragma once
/// @file generate.h
/// @brief Chapter 01: generation that re-runs the whole sequence for every new token.

#include <functional>
#include <vector>

#include "chapters/01_naive_decode/llama.h"
#include "common/metrics.h"
#include "common/sampling.h"

namespace inferlab::ch01 {

/// One generation step: the forward pass that produced one token.
struct Step {
  std::int64_t tokens_in = 0;  ///< sequence length fed to the forward pass
  double seconds = 0;
  metrics::Work work;          ///< FLOPs and bytes the step's ops counted
  double attention_flops = 0;  ///< the part of work.flops spent in attention
  std::int32_t token = 0;      ///< the token it chose
};

struct Generation {
  std::vector<std::int32_t> tokens;     ///< prompt followed by the generated tokens
  std::vector<std::int32_t> generated;
  std::vector<Step> steps;
  bool stopped_at_eos = false;
};

/// Called after each new token (to stream text).
using OnToken = std::function<void(const Generation&)>;

/// Tokens after `prompt` until max_new tokens or an end-of-sequence id: each step runs the
/// forward pass over the whole sequence so far and keeps only its last row of logits.
/// Throws when the prompt plus max_new would not fit the model's context.
Generation generate_naive(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                          const std::vector<std::int64_t>& eos_ids, const OnToken& on_token = nullptr);

/// Checks that `prompt` can be extended by `max_new` tokens within the model's context.
void check_context(const Llama& m, std::size_t prompt_tokens, int max_new);

}  // namespace inferlab::ch01
