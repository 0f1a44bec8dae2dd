// Chapter 10: the emitted tokens follow the target's distribution exactly (chi-square on single
// tokens and 2- and 3-token joints, 10^5 trials, a fixed seed; the same test rejects a wrong
// residual), p = q accepts everything, disjoint supports emit one token per round, the measured
// tokens per round match the formula, and greedy speculative decoding is the target's greedy
// decoding token for token on tiny-mha.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "chapters/10_speculative_sampling/speculative.h"
#include "golden_util.h"
#include "table_model.h"

namespace inferlab {
namespace {

using ch10::Distribution;

using test::TableModel;

const std::vector<Distribution> kTarget = {
    {0.10, 0.20, 0.30, 0.40}, {0.50, 0.25, 0.15, 0.10}, {0.05, 0.05, 0.45, 0.45}, {0.25, 0.25, 0.25, 0.25}};
const std::vector<Distribution> kDraft = {
    {0.40, 0.30, 0.20, 0.10}, {0.10, 0.10, 0.40, 0.40}, {0.30, 0.30, 0.20, 0.20}, {0.70, 0.10, 0.10, 0.10}};

// The chi-square statistic's 0.1% point for `df` degrees of freedom (Wilson and Hilferty).
double chi2_critical(double df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Chi-square of the first `k` emitted tokens' joint frequencies against the target's joint.
struct JointTest {
  double chi2[3] = {0, 0, 0};
};

JointTest run_joint(const ch10::Residual& residual, std::int64_t gamma, int trials) {
  std::map<std::vector<std::int32_t>, double> counts[3];
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 20261201;
  Sampler rng(sp);
  for (int i = 0; i < trials; ++i) {
    TableModel target(kTarget), draft(kDraft);
    const auto run = ch10::speculative_generate(target, draft, {0}, 3, gamma, rng, {}, residual);
    EXPECT_EQ(run.generated.size(), 3u);
    for (int k = 1; k <= 3; ++k) counts[k - 1][{run.generated.begin(), run.generated.begin() + k}] += 1;
  }
  JointTest t;
  for (int k = 1; k <= 3; ++k) {
    double chi2 = 0;
    std::vector<std::int32_t> x(static_cast<std::size_t>(k), 0);
    for (int cell = 0; cell < (1 << (2 * k)); ++cell) {
      double prob = 1;
      std::int32_t prev = 0;
      for (int j = 0; j < k; ++j) {
        x[static_cast<std::size_t>(j)] = (cell >> (2 * j)) & 3;
        prob *= kTarget[static_cast<std::size_t>(prev)][static_cast<std::size_t>(x[static_cast<std::size_t>(j)])];
        prev = x[static_cast<std::size_t>(j)];
      }
      const double expected = prob * trials, seen = counts[k - 1].count(x) ? counts[k - 1][x] : 0;
      chi2 += (seen - expected) * (seen - expected) / expected;
    }
    t.chi2[k - 1] = chi2;
  }
  return t;
}

TEST(Speculative, EmittedTokensFollowTheTargetExactly) {
  for (const std::int64_t gamma : {1, 2, 4}) {
    const auto t = run_joint(ch10::residual, gamma, 100000);
    for (int k = 1; k <= 3; ++k) {
      const double df = (1 << (2 * k)) - 1;
      EXPECT_LT(t.chi2[k - 1], chi2_critical(df)) << "gamma " << gamma << ", joint of " << k << " tokens";
    }
  }
}

TEST(Speculative, TheChiSquareTestCatchesAWrongResidual) {
  // Drawing from q after a rejection (instead of norm(max(q − p, 0))) over-produces the tokens the
  // draft already proposes too often: the same test must reject it.
  const ch10::Residual wrong = [](const Distribution& q, const Distribution&) { return q; };
  const auto t = run_joint(wrong, 2, 100000);
  EXPECT_GT(t.chi2[0], chi2_critical(3));
  EXPECT_GT(t.chi2[1], chi2_critical(15));
}

TEST(Speculative, EqualModelsAcceptEverythingAndDisjointOnesNothing) {
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 7;
  Sampler rng(sp);
  {
    TableModel target(kTarget), draft(kTarget);
    const auto run = ch10::speculative_generate(target, draft, {0}, 41, 4, rng, {});
    EXPECT_EQ(run.accepted, run.drafted);
    EXPECT_EQ(run.rounds, 9);  // 8 rounds of 5, then one of 1 (γ shrinks to what is left)
    EXPECT_DOUBLE_EQ(run.alpha(), 1.0);
  }
  {
    const std::vector<Distribution> low = {{0.5, 0.5, 0, 0}, {0.5, 0.5, 0, 0}, {0.5, 0.5, 0, 0}, {0.5, 0.5, 0, 0}};
    const std::vector<Distribution> high = {{0, 0, 0.5, 0.5}, {0, 0, 0.5, 0.5}, {0, 0, 0.5, 0.5}, {0, 0, 0.5, 0.5}};
    TableModel target(high), draft(low);
    const auto run = ch10::speculative_generate(target, draft, {0}, 30, 3, rng, {});
    EXPECT_EQ(run.accepted, 0);
    EXPECT_EQ(run.rounds, 30);  // one token per round, every one resampled from the target
    for (auto t : run.generated) EXPECT_GE(t, 2);
    for (std::size_t i = 0; i + 1 < run.origin.size(); ++i) EXPECT_EQ(run.origin[i], ch10::Origin::Resampled);
    EXPECT_EQ(run.origin.back(), ch10::Origin::Target);  // the last round has no room for a draft
  }
}

TEST(Speculative, TokensPerRoundMatchTheFormula) {
  // Every row of p and q overlaps by the same α, so a round is a truncated geometric trial.
  const std::vector<Distribution> q(4, Distribution{0.4, 0.3, 0.2, 0.1}), p(4, Distribution{0.1, 0.2, 0.3, 0.4});
  const double alpha = ch10::acceptance(p[0], q[0]);
  EXPECT_NEAR(alpha, 0.6, 1e-12);
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 11;
  Sampler rng(sp);
  for (const std::int64_t gamma : {1, 3, 6}) {
    TableModel target(q), draft(p);
    const int n = 60000;
    const auto run = ch10::speculative_generate(target, draft, {0}, n, gamma, rng, {});
    const double want = ch10::expected_tokens_per_round(alpha, gamma);
    // A round emits 1 + min(G, γ) tokens, G geometric; its variance, summed over the rounds.
    double m2 = 0;
    for (std::int64_t k = 0; k <= gamma; ++k) {
      const double pk =
          k < gamma ? std::pow(alpha, static_cast<double>(k)) * (1 - alpha) : std::pow(alpha, static_cast<double>(gamma));
      m2 += pk * static_cast<double>((k + 1) * (k + 1));
    }
    const double sd = std::sqrt((m2 - want * want) / static_cast<double>(run.rounds));
    EXPECT_NEAR(run.tokens_per_round(), want, 5 * sd + 1.0 / static_cast<double>(run.rounds)) << "gamma " << gamma;
    EXPECT_NEAR(run.alpha(), alpha, 1e-12);
  }
  EXPECT_NEAR(ch10::expected_tokens_per_round(0.8, 4), 3.3616, 1e-12);  // the lecture's worked example, recomputed
  EXPECT_NEAR(ch10::expected_speedup(0.8, 4, 2.0 / 30.0), 3.3616 / (4 * 2.0 / 30.0 + 1), 1e-12);
}

TEST(Speculative, ResidualIsTheTargetsUnderProposedMass) {
  const Distribution q = {0.5, 0.3, 0.2}, p = {0.2, 0.6, 0.2};
  const auto r = ch10::residual(q, p);
  EXPECT_NEAR(r[0], 1.0, 1e-12);
  EXPECT_EQ(r[1], 0.0);
  EXPECT_EQ(r[2], 0.0);
  EXPECT_EQ(ch10::residual(q, q), q);  // nothing left over: q itself
  test::expect_error([] { ch10::residual({0.5, 0.5}, {1.0}); }, {"distributions over 2 and 1"});
}

// The acceptance rule alone: u < min(1, q/p). A draft the target likes at least as much is kept
// at every u; otherwise exactly the u below q/p keep it.
TEST(Speculative, AcceptsWithProbabilityMinOfOneAndQOverP) {
  for (const double u : {0.0, 0.3, 0.999999}) {
    EXPECT_TRUE(ch10::accepts(0.5, 0.25, u)) << "q > p, u " << u;
    EXPECT_TRUE(ch10::accepts(0.2, 0.2, u)) << "q = p, u " << u;
    EXPECT_FALSE(ch10::accepts(0.0, 0.4, u)) << "q = 0, u " << u;
  }
  EXPECT_TRUE(ch10::accepts(0.125, 0.5, 0.249));  // q/p = 0.25
  EXPECT_FALSE(ch10::accepts(0.125, 0.5, 0.251));
  EXPECT_FALSE(ch10::accepts(0.125, 0.5, 0.25));  // kept for u in [0, 0.25): probability exactly 0.25
  // Over a grid of u, the share kept is q/p.
  int kept = 0;
  for (int i = 0; i < 1000; ++i) kept += ch10::accepts(0.3, 0.5, (i + 0.5) / 1000);
  EXPECT_EQ(kept, 600);
}

// The walk on distributions that leave nothing to chance: every draft the target likes more is
// kept, the first it cannot emit is rejected and the round ends with the residual's only token,
// and when all are kept the bonus comes from the last target distribution. The random numbers
// are consumed as the GPU round assumes: one per draft considered, then one draw.
TEST(Speculative, TheWalkStopsAtTheFirstRejectionAndAddsABonusOtherwise) {
  const Distribution p = {0.25, 0.25, 0.25, 0.25};
  const Distribution likes0 = {1, 0, 0, 0}, likes2 = {0, 0, 1, 0}, likes3 = {0, 0, 0, 1};
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 7;
  for (const int reject_at : {0, 1, 2, 3}) {  // 3: every draft kept
    std::vector<std::int32_t> drafts;
    std::vector<Distribution> ps, qs;
    for (int i = 0; i < 3; ++i) {
      drafts.push_back(0);
      ps.push_back(p);
      qs.push_back(i == reject_at ? likes2 : likes0);  // the target never emits token 0 at the rejected draft
    }
    qs.push_back(likes3);
    Sampler rng(sp), replay(sp);
    const ch10::Verdict v = ch10::verify(drafts, ps, qs, rng);
    if (reject_at < 3) {
      EXPECT_EQ(v.accepted, reject_at);
      EXPECT_EQ(v.next, 2) << "the residual of a rejection is where the target exceeds the draft";
      EXPECT_FALSE(v.bonus);
      for (int i = 0; i <= reject_at; ++i) replay.uniform();
      replay.draw(ch10::residual(likes2, p));
    } else {
      EXPECT_EQ(v.accepted, 3);
      EXPECT_EQ(v.next, 3) << "the bonus token comes from the target's last distribution";
      EXPECT_TRUE(v.bonus);
      for (int i = 0; i < 3; ++i) replay.uniform();
      replay.draw(likes3);
    }
    EXPECT_EQ(rng.uniform(), replay.uniform()) << "random numbers consumed, rejection at " << reject_at;
  }
  // No drafts: only the bonus, drawn from q₁.
  Sampler rng(sp);
  const ch10::Verdict v = ch10::verify({}, {}, {likes3}, rng);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 3);
  EXPECT_TRUE(v.bonus);
}

const std::string kData = INFERLAB_DATA_DIR;

TEST(Speculative, GreedyIsTheTargetsGreedyDecodingTokenForToken) {
  const std::string mha = kData + "/models/tiny-mha", draft_dir = kData + "/models/tiny-draft";
  ASSERT_TRUE(std::filesystem::exists(draft_dir)) << draft_dir << " is missing (see tools/README.md)";
  const models::Llama target = models::load_llama(mha), draft = models::load_llama(draft_dir);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  Sampler greedy({});
  const auto want = models::generate_cached(target, prompt, 64, greedy, {}).generated;
  for (const std::int64_t gamma : {1, 3, 5}) {
    ch10::CachedModel t(target, 128, {}), d(draft, 128, {});
    Sampler rng({});
    const auto run = ch10::speculative_generate(t, d, prompt, 64, gamma, rng, {});
    EXPECT_EQ(run.generated, want) << "gamma " << gamma;
    EXPECT_EQ(run.target_forwards, run.rounds);
    EXPECT_LT(run.rounds, 64) << "some drafts must be accepted for this to be a test of the rollback";
    EXPECT_EQ(t.length(), static_cast<std::int64_t>(prompt.size() + 64) - 1);  // all but the last emitted token
    // The time split the chapter prints: both models' passes inside the run's time.
    EXPECT_GT(run.draft_seconds, 0.0);
    EXPECT_GT(run.target_seconds, 0.0);
    EXPECT_LE(run.draft_seconds + run.target_seconds, run.seconds);
  }
}

TEST(Speculative, BadArgumentsAreRefusedByName) {
  SamplingParams sp;
  sp.temperature = 1;
  Sampler rng(sp);
  TableModel target(kTarget), draft(kDraft);
  test::expect_error([&] { ch10::speculative_generate(target, draft, {}, 3, 2, rng, {}); }, {"empty prompt"});
  test::expect_error([&] { ch10::speculative_generate(target, draft, {0}, 3, -1, rng, {}); }, {"gamma"});
  test::expect_error([&] { ch10::verify({1}, {kDraft[0]}, {kTarget[0]}, rng); }, {"one more target"});
  test::expect_error([&] { ch10::verify({1}, {{1, 0, 0, 0}}, {kTarget[0], kTarget[1]}, rng); }, {"probability 0"});
}

}  // namespace
}  // namespace inferlab
