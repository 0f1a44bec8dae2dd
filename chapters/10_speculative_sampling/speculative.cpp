#include "chapters/10_speculative_sampling/speculative.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/lab.h"
#include "common/metrics.h"

namespace inferlab::ch10 {

CachedModel::CachedModel(const ch01::Llama& m, std::int64_t capacity, const SamplingParams& params)
    : m_(m), cache_(m.config, capacity, m.device()), probs_(params) {}

std::vector<Distribution> CachedModel::feed(const std::vector<std::int32_t>& tokens) {
  const Tensor logits = ch02::forward_cached(m_, cache_, tokens, true);  // [T, V]: every fed position's next token
  ++forwards_;
  std::vector<Distribution> out;
  for (std::int64_t i = 0; i < logits.size(0); ++i) out.push_back(probs_.probabilities(logits.slice(0, i, i + 1)));
  return out;
}

Distribution residual(const Distribution& q, const Distribution& p) {
  IL_CHECK(q.size() == p.size(), "residual: distributions over ", q.size(), " and ", p.size(), " tokens");
  Distribution r(q.size());
  // EXERCISE 10.1 BEGIN: the residual distribution
  double sum = 0;
  for (std::size_t x = 0; x < q.size(); ++x) sum += (r[x] = std::max(q[x] - p[x], 0.0));
  if (sum <= 0) return q;  // q = p up to rounding: nothing is left over, and q itself is exact
  for (double& v : r) v /= sum;
  // EXERCISE 10.1 STUB
  // lab::not_done("10.1", "return norm(max(q − p, 0)): the target's mass the draft under-proposes, normalised "
  //                       "to sum to 1 (and q itself when nothing is left over)");
  // EXERCISE 10.1 END
  return r;
}

double acceptance(const Distribution& p, const Distribution& q) {
  IL_CHECK(q.size() == p.size(), "acceptance: distributions over ", p.size(), " and ", q.size(), " tokens");
  double a = 0;
  for (std::size_t x = 0; x < p.size(); ++x) a += std::min(p[x], q[x]);
  return a;
}

Verdict verify(const std::vector<std::int32_t>& drafts, const std::vector<Distribution>& p, const std::vector<Distribution>& q,
               Sampler& rng, const Residual& residual_of) {
  const std::size_t gamma = drafts.size();
  IL_CHECK(p.size() == gamma && q.size() == gamma + 1, "verify: ", gamma, " drafts need as many draft and one more target "
           "distributions; got ", p.size(), " and ", q.size());
  Verdict v;
  for (std::size_t i = 0; i < gamma; ++i) {
    const auto d = static_cast<std::size_t>(drafts[i]);
    IL_CHECK(d < p[i].size() && d < q[i].size(), "verify: draft token ", drafts[i], " outside the vocabulary");
    IL_CHECK(p[i][d] > 0, "verify: draft ", i, " (token ", drafts[i], ") has probability 0 under the draft that proposed it");
    bool accept = false;
    // EXERCISE 10.2 BEGIN: accept or reject a draft
    accept = rng.uniform() < std::min(1.0, q[i][d] / p[i][d]);
    // EXERCISE 10.2 STUB
    // lab::not_done("10.2", "set accept with probability min(1, q(d)/p(d)) for the draft token d (q[i][d], p[i][d]), "
    //                       "drawing the uniform number from rng.uniform()");
    // EXERCISE 10.2 END
    if (!accept) {
      v.next = rng.draw(residual_of(q[i], p[i]));
      return v;
    }
    ++v.accepted;
  }
  v.next = rng.draw(q[gamma]);
  v.bonus = true;
  return v;
}

SpeculativeRun speculative_generate(Model& target, Model& draft, const std::vector<std::int32_t>& prompt, int max_new,
                                    std::int64_t gamma, Sampler& rng, const std::vector<std::int64_t>& eos_ids,
                                    const Residual& residual_of) {
  IL_CHECK(!prompt.empty(), "speculative sampling: an empty prompt (it starts with BOS at least)");
  IL_CHECK(max_new >= 0, "speculative sampling: max_new is ", max_new);
  IL_CHECK(gamma >= 0, "speculative sampling: gamma (drafts per round) is ", gamma);
  IL_CHECK(target.length() == 0 && draft.length() == 0, "speculative sampling: the models must start empty");
  SpeculativeRun run;
  run.tokens = prompt;
  metrics::Timer clock;
  auto is_eos = [&](std::int32_t t) { return std::find(eos_ids.begin(), eos_ids.end(), t) != eos_ids.end(); };
  while (static_cast<int>(run.generated.size()) < max_new && !run.stopped_at_eos) {
    const auto n = static_cast<std::int64_t>(run.tokens.size());
    const std::int64_t left = max_new - static_cast<std::int64_t>(run.generated.size());
    const std::int64_t g = std::min(gamma, left - 1);  // the round's emitted tokens never pass max_new
    // The draft: whatever it lacks of the sequence, then g proposals, each fed back but the last.
    std::vector<std::int32_t> drafts;
    std::vector<Distribution> p;
    if (g > 0) {
      p.push_back(draft.feed({run.tokens.begin() + draft.length(), run.tokens.end()}).back());
      for (std::int64_t i = 0; i < g; ++i) {
        drafts.push_back(rng.draw(p.back()));
        if (i + 1 < g) p.push_back(draft.feed({drafts.back()}).back());
      }
    }
    // The target: one pass over what it lacks and the g drafts; its last g + 1 distributions.
    std::vector<std::int32_t> feed(run.tokens.begin() + target.length(), run.tokens.end());
    feed.insert(feed.end(), drafts.begin(), drafts.end());
    const std::vector<Distribution> all = target.feed(feed);
    const std::vector<Distribution> q(all.end() - (g + 1), all.end());
    for (std::int64_t i = 0; i < g; ++i)
      run.alpha_sum += acceptance(p[static_cast<std::size_t>(i)], q[static_cast<std::size_t>(i)]), ++run.alpha_positions;
    const Verdict v = verify(drafts, p, q, rng, residual_of);
    ++run.rounds;
    run.drafted += g, run.accepted += v.accepted;
    std::vector<std::int32_t> emitted(drafts.begin(), drafts.begin() + v.accepted);
    emitted.push_back(v.next);
    for (std::size_t i = 0; i < emitted.size() && !run.stopped_at_eos; ++i) {
      run.tokens.push_back(emitted[i]), run.generated.push_back(emitted[i]);
      run.origin.push_back(i < static_cast<std::size_t>(v.accepted) ? Origin::Draft
                           : g == 0                                 ? Origin::Target
                           : v.bonus                                ? Origin::Bonus
                                                                    : Origin::Resampled);
      run.stopped_at_eos = is_eos(emitted[i]);
    }
    // Both caches back to the accepted prefix: everything but the round's last emitted token.
    const std::int64_t keep = n + v.accepted;
    target.truncate(std::min(target.length(), keep));
    draft.truncate(std::min(draft.length(), keep));
  }
  run.draft_forwards = draft.forwards(), run.target_forwards = target.forwards();
  run.seconds = clock.seconds();
  return run;
}

double expected_tokens_per_round(double alpha, std::int64_t gamma) {
  IL_CHECK(alpha >= 0 && alpha <= 1 && gamma >= 0, "expected_tokens_per_round: alpha ", alpha, ", gamma ", gamma);
  if (alpha >= 1) return static_cast<double>(gamma + 1);
  return (1 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1 - alpha);
}

double expected_speedup(double alpha, std::int64_t gamma, double c) {
  IL_CHECK(c >= 0, "expected_speedup: the cost ratio c is ", c);
  return expected_tokens_per_round(alpha, gamma) / (static_cast<double>(gamma) * c + 1);
}

}  // namespace inferlab::ch10
