#include "common/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/ops.h"

namespace inferlab {

void validate(const SamplingParams& p) {
  IL_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "sampling: temperature must be >= 0, got ", p.temperature);
  IL_CHECK(p.top_k >= 0, "sampling: top-k must be >= 0 (0 keeps every token), got ", p.top_k);
  IL_CHECK(p.top_p > 0 && p.top_p <= 1, "sampling: top-p must be in (0, 1], got ", p.top_p);
  IL_CHECK(p.vocab >= 0, "sampling: vocabulary size must be >= 0 (0: every id), got ", p.vocab);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

std::int32_t Sampler::sample(const Tensor& logits) {
  const Tensor host = one_row(logits, "sample");
  return sample(host.data<float>(), host.numel());
}

std::int32_t Sampler::sample(const float* logits, std::int64_t V) {
  if (p_.temperature == 0.0f) return greedy(logits, V);
  const std::int64_t keep = kept(logits, V);
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

std::vector<double> Sampler::probabilities(const Tensor& logits) {
  const Tensor host = one_row(logits, "probabilities");
  const float* l = host.data<float>();
  const std::int64_t V = host.numel();
  std::vector<double> p(static_cast<std::size_t>(V), 0.0);
  if (p_.temperature == 0.0f) {
    p[static_cast<std::size_t>(greedy(l, V))] = 1.0;
    return p;
  }
  const std::int64_t keep = kept(l, V);
  double total = 0;
  for (std::int64_t i = 0; i < keep; ++i) total += probs_[order_[i]];
  for (std::int64_t i = 0; i < keep; ++i) p[static_cast<std::size_t>(order_[i])] = probs_[order_[i]] / total;
  return p;
}

std::int32_t Sampler::draw(const std::vector<double>& p) {
  IL_CHECK(!p.empty(), "draw: an empty distribution");
  double total = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    IL_CHECK(std::isfinite(p[i]) && p[i] >= 0, "draw: probability ", i, " is ", p[i]);
    total += p[i];
  }
  IL_CHECK(total > 0, "draw: the probabilities sum to 0, there is no token to choose");
  const double r = uniform() * total;
  double cum = 0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    cum += p[i], last = i;
    if (r < cum) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(last);  // r within rounding of the total
}

Tensor Sampler::one_row(const Tensor& logits, const char* what) const {
  IL_CHECK(logits.dtype() == DType::F32, what, ": logits must be f32, got ", logits.describe());
  IL_CHECK(logits.ndim() == 1 || (logits.ndim() == 2 && logits.size(0) == 1), what, ": logits must be one row, got ",
           logits.describe());
  return logits.is_cuda() ? logits.to(Device::CPU) : logits.contiguous();
}

std::int64_t Sampler::usable(const float* logits, std::int64_t V) const {
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
  return V;
}

std::int32_t Sampler::greedy(const float* logits, std::int64_t V) const {
  V = usable(logits, V);
  // The first index of the maximum, exactly as ops::argmax.
  return static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
}

std::int64_t Sampler::kept(const float* logits, std::int64_t V) {
  V = usable(logits, V);
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
    auto by_prob = [&](std::int32_t a, std::int32_t b) {
      return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
    };
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
  return keep;
}

}  // namespace inferlab
