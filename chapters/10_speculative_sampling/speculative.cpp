#include "chapters/10_speculative_sampling/speculative.h"

#include <algorithm>
#include <cmath>

#include "chapters/10_speculative_sampling/cuda_speculative.h"
#include "common/error.h"
#include "common/lab.h"
#include "common/metrics.h"

namespace inferlab::ch10 {

CachedModel::CachedModel(const models::Llama& m, std::int64_t capacity, const SamplingParams& params)
    : m_(m), cache_(m.config, capacity, m.device()), probs_(params) {}

std::vector<Distribution> CachedModel::feed(const std::vector<std::int32_t>& tokens) {
  const Tensor logits = models::forward_cached(m_, cache_, tokens, true);  // [T, V]: every fed position's next token
  ++forwards_;
  std::vector<Distribution> out;
  for (std::int64_t i = 0; i < logits.size(0); ++i) out.push_back(probs_.probabilities(logits.slice(0, i, i + 1)));
  return out;
}

Tensor Model::feed_on_device(const std::vector<std::int32_t>&, std::int64_t) {
  fail("speculative sampling: this model has no device path (its distributions live on the host)");
}

Tensor CachedModel::feed_on_device(const std::vector<std::int32_t>& tokens, std::int64_t last) {
  IL_CHECK(m_.device() == Device::CUDA, "feed_on_device: the model is on the CPU");
  IL_CHECK(last >= 1 && last <= static_cast<std::int64_t>(tokens.size()), "feed_on_device: the last ", last, " of ",
           tokens.size(), " positions");
  const Tensor logits = models::forward_cached(m_, cache_, tokens, true);
  ++forwards_;
  return cuda::distributions(logits.slice(0, logits.size(0) - last, logits.size(0)).contiguous(), probs_.params());
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

bool accepts(double q_d, double p_d, double u) {
  bool accept = false;
  // EXERCISE 10.2 BEGIN: accept or reject a draft
  accept = u < std::min(1.0, q_d / p_d);
  // EXERCISE 10.2 STUB
  // lab::not_done("10.2", "set accept: whether a draft the target gives probability q_d and the draft p_d is "
  //                       "kept, given u, a uniform number in [0, 1): with probability min(1, q_d/p_d)");
  // EXERCISE 10.2 END
  return accept;
}

Verdict verify(const std::vector<std::int32_t>& drafts, const std::vector<Distribution>& p,
               const std::vector<Distribution>& q, Sampler& rng, const Residual& residual_of) {
  const std::size_t gamma = drafts.size();
  IL_CHECK(p.size() == gamma && q.size() == gamma + 1, "verify: ", gamma,
           " drafts need as many draft and one more target "
           "distributions; got ",
           p.size(), " and ", q.size());
  for (std::size_t i = 0; i < gamma; ++i) {
    const auto d = static_cast<std::size_t>(drafts[i]);
    IL_CHECK(d < p[i].size() && d < q[i].size(), "verify: draft token ", drafts[i], " outside the vocabulary");
    IL_CHECK(p[i][d] > 0, "verify: draft ", i, " (token ", drafts[i],
             ") has probability 0 under the draft that proposed it");
  }
  Verdict v;
  // EXERCISE 10.3 BEGIN: the accept/reject walk over the drafts
  // In order: draw u, keep the draft if accepts(q(d), p(d), u); at the first rejection the round
  // ends with a token from the residual; when every draft is kept, the target's last
  // distribution gives one more token for free.
  for (std::size_t i = 0; i < gamma; ++i) {
    const auto d = static_cast<std::size_t>(drafts[i]);
    if (!accepts(q[i][d], p[i][d], rng.uniform())) {
      v.next = rng.draw(residual_of(q[i], p[i]));
      return v;
    }
    ++v.accepted;
  }
  v.next = rng.draw(q[gamma]);
  v.bonus = true;
  // EXERCISE 10.3 STUB
  // lab::not_done("10.3", "walk the drafts in order: keep draft i while accepts(q[i][d], p[i][d], rng.uniform()) "
  //                       "(counting v.accepted); at the first rejection set v.next = rng.draw(residual_of(q[i], "
  //                       "p[i])) and return; after all gamma, v.next = rng.draw(q[gamma]) and v.bonus = true");
  // EXERCISE 10.3 END
  return v;
}

namespace {

// One round's drafts, the verdict on them, Σ acceptance over the drafted positions, and the time
// spent in each model's passes.
struct Round {
  std::vector<std::int32_t> drafts;
  Verdict verdict;
  double alpha_sum = 0;
  double draft_seconds = 0, target_seconds = 0;
};

// How a run is timed: the work's time on the CPU (metrics::Clock::Work), the wall clock on a GPU.
metrics::Clock work_clock(const Model& target, const Model& draft) {
  return target.device() == Device::CPU && draft.device() == Device::CPU ? metrics::Clock::Work : metrics::Clock::Wall;
}

// Runs f() and adds its duration to `total`.
template <class F>
auto timed(double& total, metrics::Clock clock, F&& f) {
  metrics::Timer t(clock);
  auto out = f();
  total += t.seconds();
  return out;
}

// What the target's verification pass is fed: whatever it lacks of `tokens`, then the drafts.
std::vector<std::int32_t> target_feed(const Model& target, const std::vector<std::int32_t>& tokens,
                                      const std::vector<std::int32_t>& drafts) {
  std::vector<std::int32_t> feed(tokens.begin() + target.length(), tokens.end());
  feed.insert(feed.end(), drafts.begin(), drafts.end());
  return feed;
}

// The round on the host: the draft feeds whatever it lacks of `tokens`, then proposes g tokens,
// each fed back but the last; the target scores what it lacks and the g drafts in one pass; its
// last g + 1 distributions decide.
Round host_round(Model& target, Model& draft, const std::vector<std::int32_t>& tokens, std::int64_t g, Sampler& rng,
                 const Residual& residual_of) {
  Round r;
  std::vector<Distribution> p;
  const metrics::Clock clock = work_clock(target, draft);
  if (g > 0) {
    p.push_back(timed(r.draft_seconds, clock, [&] {
      return draft.feed({tokens.begin() + draft.length(), tokens.end()}).back();
    }));
    for (std::int64_t i = 0; i < g; ++i) {
      r.drafts.push_back(rng.draw(p.back()));
      if (i + 1 < g) p.push_back(timed(r.draft_seconds, clock, [&] { return draft.feed({r.drafts.back()}).back(); }));
    }
  }
  const std::vector<Distribution> all =
      timed(r.target_seconds, clock, [&] { return target.feed(target_feed(target, tokens, r.drafts)); });
  const std::vector<Distribution> q(all.end() - (g + 1), all.end());
  for (std::int64_t i = 0; i < g; ++i)
    r.alpha_sum += acceptance(p[static_cast<std::size_t>(i)], q[static_cast<std::size_t>(i)]);
  r.verdict = verify(r.drafts, p, q, rng, residual_of);
  return r;
}

// The same round with every distribution left on the GPU: the host sees the drafted tokens and
// the verdict, never a row of probabilities. The uniform numbers are rng's, in the host round's
// order: one per draft, then those the walk consumes, read ahead from a copy of rng. The passes
// are asynchronous here, so the round leaves its time unsplit (draft_seconds, target_seconds 0).
Round device_round(Model& target, Model& draft, const std::vector<std::int32_t>& tokens, std::int64_t g, Sampler& rng) {
  Round r;
  Tensor p;  // [g, V]: the draft's distribution at each drafted position
  if (g > 0) {
    Tensor row = draft.feed_on_device({tokens.begin() + draft.length(), tokens.end()}, 1);
    p = Tensor::empty({g, row.size(1)}, DType::F64, Device::CUDA);
    for (std::int64_t i = 0; i < g; ++i) {
      Tensor dst = p.slice(0, i, i + 1);
      dst.copy_from(row);
      r.drafts.push_back(cuda::draw(p, i, rng.uniform()));
      if (i + 1 < g) row = draft.feed_on_device({r.drafts.back()}, 1);
    }
  }
  const Tensor q = target.feed_on_device(target_feed(target, tokens, r.drafts), g + 1);
  Sampler ahead = rng;  // a copy: the next g + 1 numbers of rng's stream, read without consuming them
  std::vector<double> u(static_cast<std::size_t>(g + 1));
  for (double& x : u) x = ahead.uniform();
  const cuda::DeviceVerdict dv = cuda::verify(r.drafts, p, q, u);
  for (int i = 0; i < dv.used; ++i) rng.uniform();  // consume what the walk used
  r.verdict = dv.verdict;
  r.alpha_sum = dv.alpha_sum;
  return r;
}

bool is_the_residual(const Residual& f) {
  using Fn = Distribution (*)(const Distribution&, const Distribution&);
  const Fn* fn = f.target<Fn>();
  return fn != nullptr && *fn == &residual;
}

}  // namespace

SpeculativeRun speculative_generate(Model& target, Model& draft, const std::vector<std::int32_t>& prompt, int max_new,
                                    std::int64_t gamma, Sampler& rng, const std::vector<std::int64_t>& eos_ids,
                                    const Residual& residual_of) {
  IL_CHECK(!prompt.empty(), "speculative sampling: an empty prompt (it starts with BOS at least)");
  IL_CHECK(max_new >= 0, "speculative sampling: max_new is ", max_new);
  IL_CHECK(gamma >= 0, "speculative sampling: gamma (drafts per round) is ", gamma);
  IL_CHECK(target.length() == 0 && draft.length() == 0, "speculative sampling: the models must start empty");
  // A custom residual is a host function, so its rounds run on the host whatever the models' device.
  const bool on_device = target.device() == Device::CUDA && draft.device() == Device::CUDA && is_the_residual(residual_of);
  SpeculativeRun run;
  run.tokens = prompt;
  metrics::Timer clock(work_clock(target, draft));
  auto is_eos = [&](std::int32_t t) { return std::find(eos_ids.begin(), eos_ids.end(), t) != eos_ids.end(); };
  while (static_cast<int>(run.generated.size()) < max_new && !run.stopped_at_eos) {
    const auto n = static_cast<std::int64_t>(run.tokens.size());
    const std::int64_t left = max_new - static_cast<std::int64_t>(run.generated.size());
    const std::int64_t g = std::min(gamma, left - 1);  // the round's emitted tokens never pass max_new
    const Round r = on_device ? device_round(target, draft, run.tokens, g, rng)
                              : host_round(target, draft, run.tokens, g, rng, residual_of);
    const Verdict& v = r.verdict;
    run.alpha_sum += r.alpha_sum, run.alpha_positions += g;
    run.draft_seconds += r.draft_seconds, run.target_seconds += r.target_seconds;
    ++run.rounds;
    run.drafted += g, run.accepted += v.accepted;
    std::vector<std::int32_t> emitted(r.drafts.begin(), r.drafts.begin() + v.accepted);
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
