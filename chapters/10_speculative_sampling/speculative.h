#pragma once
/// @file speculative.h
/// @brief Chapter 10: speculative sampling. A cheap draft guesses, the target checks all guesses
/// in one forward pass, and what comes out is an exact sample from the target.
///
/// Decoding is memory-bound: a target forward pass over γ + 1 tokens reads the weights once,
/// so it costs about what a pass over one token costs (the lecture's "verifying is faster than
/// generating"). A draft model p (small, cheap) proposes d₁ … d_γ one at a time; the target q
/// scores all of them at once, giving q(· | prefix, d₁ … d_{i−1}) for i = 1 … γ + 1; then, in order,
///
///     accept dᵢ with probability min(1, q(dᵢ) / p(dᵢ));
///     at the first rejection, emit a token drawn from norm(max(q − p, 0)) and stop;
///     if all γ are accepted, emit a bonus token drawn from q_{γ+1}.
///
/// Every emitted token is distributed exactly as the target alone would sample it (the
/// lecture's two-token proof; tests/ch10 checks it by chi-square), and each round emits at least
/// one. With a per-position acceptance probability α = Σ_x min(p(x), q(x)) = 1 − TV(p, q), a
/// round emits (1 − α^(γ+1)) / (1 − α) tokens on average for one target pass and γ draft passes;
/// with c the cost of a draft pass over a target pass, the speed-up over the target alone is
///
///     (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
///
/// Greedy decoding is the case where both distributions are one-hot (temperature 0): a draft
/// token is kept iff it is the target's argmax, and the output equals the target's greedy
/// output token for token.
///
/// Both models keep their caches (chapter 02's); after each round they roll back to the accepted
/// prefix through the cache interface's truncate(). A model is a `Model`: anything that can be fed
/// tokens, give each fed position's next-token distribution, and forget positions.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/models/kv_cache.h"
#include "common/sampling.h"

namespace inferlab::ch10 {

using Distribution = std::vector<double>;

/// A language model as speculative sampling uses it.
class Model {
 public:
  virtual ~Model() = default;
  /// Tokens it holds (has been fed and not forgotten).
  virtual std::int64_t length() const = 0;
  /// Feeds `tokens` after what it holds; returns, for each of them, the distribution of the token
  /// that follows it (the sampling distribution: temperature, top-k, top-p applied).
  virtual std::vector<Distribution> feed(const std::vector<std::int32_t>& tokens) = 0;
  /// Forgets every token from position n on.
  virtual void truncate(std::int64_t n) = 0;
  /// Forward passes run so far.
  virtual std::int64_t forwards() const = 0;
  /// Where the model runs. When both models are on CUDA, the round keeps every distribution there.
  virtual Device device() const { return Device::CPU; }
  /// As feed(), with the distributions of the last `last` fed positions left on the device: a
  /// CUDA F64 tensor [last, V] (CUDA models).
  virtual Tensor feed_on_device(const std::vector<std::int32_t>& tokens, std::int64_t last);
};

/// Chapter 02's model with its own KV cache of `capacity` positions; distributions are
/// Sampler::probabilities of each fed position's logits under `params`.
class CachedModel : public Model {
 public:
  CachedModel(const models::Llama& m, std::int64_t capacity, const SamplingParams& params);
  std::int64_t length() const override { return cache_.length(); }
  std::vector<Distribution> feed(const std::vector<std::int32_t>& tokens) override;
  void truncate(std::int64_t n) override { cache_.truncate(n); }
  std::int64_t forwards() const override { return forwards_; }
  Device device() const override { return m_.device(); }
  Tensor feed_on_device(const std::vector<std::int32_t>& tokens, std::int64_t last) override;

 private:
  const models::Llama& m_;
  models::ContiguousKVCache cache_;
  Sampler probs_;
  std::int64_t forwards_ = 0;
};

/// The distribution to draw from after a rejection: norm(max(q − p, 0)).
Distribution residual(const Distribution& q, const Distribution& p);
using Residual = std::function<Distribution(const Distribution& q, const Distribution& p)>;

/// Whether a draft is kept, given the target's probability q_d of it, the draft's p_d (> 0) and u,
/// a uniform number in [0, 1): with probability min(1, q_d/p_d), so a draft the target likes at
/// least as much as the draft did is always kept.
bool accepts(double q_d, double p_d, double u);

/// One round's verdict over drafts d₁ … d_γ with draft distributions p₁ … p_γ and target
/// distributions q₁ … q_{γ+1}: how many drafts were accepted and the token emitted after them
/// (drawn from residual(q_{k+1}, p_{k+1}) at a rejection, from q_{γ+1} when all were accepted).
struct Verdict {
  std::int64_t accepted = 0;
  std::int32_t next = 0;
  bool bonus = false;  ///< `next` came from q_{γ+1}
};
/// The walk: one uniform number per draft considered, in order (accepts), then one draw, from the
/// residual at the first rejection or from q_{γ+1}; the GPU round consumes the same numbers.
Verdict verify(const std::vector<std::int32_t>& drafts, const std::vector<Distribution>& p,
               const std::vector<Distribution>& q, Sampler& rng, const Residual& residual_of = residual);

/// α of one position: Σ_x min(p(x), q(x)), the probability that a draft from p is accepted.
double acceptance(const Distribution& p, const Distribution& q);

/// Who produced each emitted token.
enum class Origin { Draft, Resampled, Bonus, Target };

struct SpeculativeRun {
  std::vector<std::int32_t> tokens;  ///< prompt + generated
  std::vector<std::int32_t> generated;
  std::vector<Origin> origin;  ///< per generated token
  std::int64_t rounds = 0;     ///< target passes (verification rounds)
  std::int64_t drafted = 0, accepted = 0;
  double alpha_sum = 0;  ///< Σ over examined positions of acceptance(p, q)
  std::int64_t alpha_positions = 0;
  std::int64_t draft_forwards = 0, target_forwards = 0;
  double seconds = 0;
  double draft_seconds = 0, target_seconds = 0;  ///< of `seconds`: in each model's passes (host rounds; 0 on CUDA)
  bool stopped_at_eos = false;
  double alpha() const { return alpha_positions ? alpha_sum / static_cast<double>(alpha_positions) : 0; }
  double tokens_per_round() const {
    return rounds ? static_cast<double>(generated.size()) / static_cast<double>(rounds) : 0;
  }
};

/// Speculative sampling: `max_new` tokens after `prompt` (or to an EOS id), drafting `gamma`
/// per round. Both models start empty. `rng` draws the drafts, the acceptances and the
/// emitted tokens. When both models are on CUDA the round runs there (cuda_speculative.h) with
/// the same random numbers in the same order, unless `residual_of` is not `residual` (a
/// custom residual is a host function: that round runs on the host).
SpeculativeRun speculative_generate(Model& target, Model& draft, const std::vector<std::int32_t>& prompt, int max_new,
                                    std::int64_t gamma, Sampler& rng, const std::vector<std::int64_t>& eos_ids,
                                    const Residual& residual_of = residual);

/// The expected tokens per round, (1 − α^(γ+1)) / (1 − α) (γ + 1 at α = 1).
double expected_tokens_per_round(double alpha, std::int64_t gamma);
/// The speed-up over the target alone, (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
double expected_speedup(double alpha, std::int64_t gamma, double c);

}  // namespace inferlab::ch10
