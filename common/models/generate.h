#pragma once
/// @file generate.h
/// @brief The generate loop every chapter shares: a token at a time from a forward pass, timed.

#include <functional>
#include <vector>

#include "common/metrics.h"
#include "common/models/llama.h"
#include "common/sampling.h"

namespace inferlab::models {

/// One generation step: the forward pass that produced one token.
struct Step {
  std::int64_t tokens_in = 0;  ///< tokens fed to the forward pass
  double seconds = 0;
  metrics::Work work;          ///< FLOPs and bytes the step's ops counted
  double attention_flops = 0;  ///< the part of work.flops spent in attention
  std::int32_t token = 0;      ///< the token it chose
};

struct Generation {
  std::vector<std::int32_t> tokens;  ///< prompt followed by the generated tokens
  std::vector<std::int32_t> generated;
  std::vector<Step> steps;
  bool stopped_at_eos = false;
  double total_s = 0;  ///< wall-clock time of the whole loop

  /// The lecture's serving metrics. Time to first token: the first step (for a cached model,
  /// the prefill) with its sample.
  double ttft_s() const { return steps.empty() ? 0 : steps[0].seconds; }
  /// Time per output token after the first: the mean of the later steps.
  double tpot_s() const;
  double tokens_per_s() const { return total_s > 0 ? static_cast<double>(generated.size()) / total_s : 0; }
};

/// Called after each new token (to stream text).
using OnToken = std::function<void(const Generation&)>;

/// A model's forward pass as the generate loop sees it: the logits [1, V] of the last of the
/// tokens it is fed.
using NextLogits = std::function<Tensor(const std::vector<std::int32_t>& feed)>;

/// What each step feeds: the whole sequence so far (chapter 01: the model keeps nothing), or
/// only the tokens it has not seen (chapter 02: the prompt, then one token per step).
enum class Feed { WholeSequence, NewTokens };

/// The generate loop: tokens after `prompt` until max_new tokens or an end-of-sequence id,
/// each chosen by `sampler` from `next_logits`, with each step's time and counted work.
/// `device` is where the model runs (its queue is drained before a step's clock stops). An error
/// in a step names it: "generating token 3 (position 17): sample: logit 0 is NaN …".
Generation generate(const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                    const std::vector<std::int64_t>& eos_ids, Device device, Feed feed, const NextLogits& next_logits,
                    const OnToken& on_token = nullptr);

/// Checks that `prompt` can be extended by `max_new` tokens within a context of `context`
/// positions (the model's, usually).
void check_context(std::int64_t context, std::size_t prompt_tokens, int max_new);
inline void check_context(const Llama& m, std::size_t prompt_tokens, int max_new) {
  check_context(m.config.max_position_embeddings, prompt_tokens, max_new);
}

}  // namespace inferlab::models
