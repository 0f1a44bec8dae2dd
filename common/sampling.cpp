#include "common/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/ops.h"

namespace inferlab {

void validate(const SamplingParams& p) {
  IL_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "sampling: temperature must be >= 0, got ",
           p.temperature);
  IL_CHECK(p.top_k >= 0, "sampling: top-k must be >= 0 (0 keeps every token), got ", p.top_k);
  IL_CHECK(p.top_p > 0 && p.top_p <= 1, "sampling: top-p must be in (0, 1], got ", p.top_p);
  IL_CHECK(p.vocab >= 0, "sampling: vocabulary size must be >= 0 (0: every id), got ", p.vocab);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

std::int32_t Sampler::sample(const Tensor& logits) {
  IL_CHECK(logits.dtype() == DType::F32, "sample: logits must be f32, got ", logits.describe());
  IL_CHECK(logits.ndim() == 1 || (logits.ndim() == 2 && logits.size(0) == 1), "sample: logits must be one row, got ",
           logits.describe());
  Tensor host = logits.is_cuda() ? logits.to(Device::CPU) : logits.contiguous();
  return sample(host.data<float>(), host.numel());
}

std::int32_t Sampler::sample(const float* logits, std::int64_t V) {
  IL_CHECK(V > 0, "sample: empty logits");
  if (p_.vocab > 0) {
    IL_CHECK(p_.vocab <= V, "sample: ", V, " logits for a vocabulary of ", p_.vocab);
    V = p_.vocab;
  }
  // -inf is a masked token; NaN or +inf means the forward pass overflowed.
  for (std::int64_t i = 0; i < V; ++i)
    IL_CHECK(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(), "sample: logit ", i, " is ",
             std::isnan(logits[i]) ? "NaN" : "+inf", " (the model's output is broken)");
  IL_CHECK(*std::max_element(logits, logits + V) > -std::numeric_limits<float>::infinity(),
           "sample: every logit is -inf, there is no token to choose");
  if (p_.temperature == 0.0f) {
    // Greedy: the first index of the maximum, exactly as ops::argmax.
    return static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
  }
  // p_i ∝ exp((l_i - max) / T), in double.
  const double mx = *std::max_element(logits, logits + V);
  probs_.resize(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < V; ++i) probs_[i] = std::exp((static_cast<double>(logits[i]) - mx) / p_.temperature);

  std::int64_t keep = V;
  const bool truncate = (p_.top_k > 0 && p_.top_k < V) || p_.top_p < 1.0f;
  order_.resize(static_cast<std::size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  if (truncate) {
    // Most likely first; equal probabilities by index, so the order is fully determined.
    auto by_prob = [&](std::int32_t a, std::int32_t b) { return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b); };
    if (p_.top_k > 0 && p_.top_k < V) {
      keep = p_.top_k;
      std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_prob);
    } else {
      std::sort(order_.begin(), order_.end(), by_prob);
    }
    if (p_.top_p < 1.0f) {
      double total = 0;
      for (std::int64_t i = 0; i < keep; ++i) total += probs_[order_[i]];
      // The smallest prefix whose mass reaches top_p of the (top-k) total.
      double cum = 0;
      std::int64_t n = 0;
      while (n < keep) {
        cum += probs_[order_[n++]];
        if (cum >= p_.top_p * total) break;
      }
      keep = n;
    }
  }
  double total = 0;
  for (std::int64_t i = 0; i < keep; ++i) total += probs_[order_[i]];
  const double r = uniform() * total;
  double cum = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    cum += probs_[order_[i]];
    if (r < cum) return order_[i];
  }
  return order_[keep - 1];  // r within rounding of the total
}

}  // namespace inferlab
