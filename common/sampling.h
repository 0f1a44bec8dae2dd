#pragma once
/// @file sampling.h
/// @brief Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus).
///
/// Reproducible by construction: the random numbers come from std::mt19937_64, whose output
/// sequence the C++ standard fixes, turned into doubles by taking its top 53 bits (never
/// through std::uniform_real_distribution, whose algorithm is left to each library). Sampling
/// runs on the host in double precision for both devices; a CUDA logits row is copied over
/// first (V floats, tiny next to the weights a decode step reads). So one seed gives the same
/// tokens on CPU and CUDA whenever the logits are the same.

#include <cstdint>
#include <random>
#include <vector>

#include "common/tensor.h"

namespace inferlab {

struct SamplingParams {
  float temperature = 0.0f;  ///< 0 means greedy (argmax)
  int top_k = 0;             ///< keep the k most likely tokens; 0 keeps all
  float top_p = 1.0f;        ///< keep the smallest set whose probability reaches p; 1 keeps all
  std::uint64_t seed = 0;
  /// Sample only ids below this; 0 samples every id. A model's embedding table may be padded
  /// beyond its tokenizer (tiny-mha: 1024 rows for 988 tokens), and the padding rows are ids no
  /// tokenizer can decode, so the chapters set this to the tokenizer's size.
  std::int64_t vocab = 0;
};

/// Checks the parameters; throws inferlab::Error naming a bad one.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  /// Picks a token from one row of logits (F32 [V] or [1, V], CPU or CUDA).
  std::int32_t sample(const Tensor& logits);
  /// The same on a host array of V logits.
  std::int32_t sample(const float* logits, std::int64_t V);
  /// The distribution sample() draws from, as V probabilities summing to 1: softmax(l / T)
  /// restricted to the top-k / top-p set (and to the first `vocab` ids), zero elsewhere; for
  /// greedy (T = 0), all mass on the argmax. Speculative sampling compares two of these.
  std::vector<double> probabilities(const Tensor& logits);
  /// A token drawn from the given (not necessarily normalised) non-negative weights, with this
  /// sampler's random numbers: speculative sampling's draw from its residual distribution.
  std::int32_t draw(const std::vector<double>& p);
  /// The next uniform number in [0, 1) (53 random bits).
  double uniform();
  const SamplingParams& params() const { return p_; }

 private:
  Tensor one_row(const Tensor& logits, const char* what) const;
  // The checks every path shares; returns how many ids may be sampled.
  std::int64_t usable(const float* logits, std::int64_t V) const;
  std::int32_t greedy(const float* logits, std::int64_t V) const;
  // Fills probs_ (unnormalised) and order_; returns how many of order_'s first ids are kept.
  std::int64_t kept(const float* logits, std::int64_t V);
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<double> probs_;
  std::vector<std::int32_t> order_;
};

}  // namespace inferlab
