// Sampling: greedy, temperature, top-k, top-p; reproducibility from the seed.
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/sampling.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_error;

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(Sampling, GreedyIsArgmax) {
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {1, 500});
  Sampler s({});
  const float* p = x.data<float>();
  EXPECT_EQ(s.sample(x), std::max_element(p, p + 500) - p);
  std::vector<float> tie = {0.5f, 2.0f, 2.0f};
  EXPECT_EQ(s.sample(tie.data(), 3), 1);
}

TEST(Sampling, TheRandomStreamIsTheStandardsMt19937_64) {
  // The C++ standard fixes this value ([rand.predef]): the 10000th output of a
  // default-constructed mt19937_64. Our uniforms are its top 53 bits.
  std::mt19937_64 g;
  g.discard(9999);
  EXPECT_EQ(g(), 9981545732273789042ull);
  Sampler s({1.0f, 0, 1.0f, 5489});  // 5489 is the default seed
  std::mt19937_64 h(5489);
  EXPECT_EQ(s.uniform(), static_cast<double>(h() >> 11) * 0x1.0p-53);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {1, 1000}, -3, 3);
  auto run = [&](std::uint64_t seed) {
    Sampler s({1.0f, 0, 1.0f, seed});
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(x));
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampling, FrequenciesFollowTheTemperedDistribution) {
  // With p = (0.5, 0.3, 0.15, 0.05) and temperature T, tokens should come up with
  // probability p^(1/T) / Σ p^(1/T). 40000 draws: each frequency within 5 standard deviations
  // (the seed is fixed, so this is deterministic; 5σ is a margin, not a tuning knob).
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  const auto l = logits_of(p);
  for (float T : {1.0f, 0.5f, 2.0f}) {
    Sampler s({T, 0, 1.0f, 99});
    std::vector<int> count(4, 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++count[s.sample(l.data(), 4)];
    double z = 0;
    for (double q : p) z += std::pow(q, 1.0 / T);
    for (int i = 0; i < 4; ++i) {
      const double want = std::pow(p[i], 1.0 / T) / z;
      EXPECT_NEAR(count[i] / double(n), want, 5 * std::sqrt(want * (1 - want) / n)) << "T=" << T << " token " << i;
    }
  }
}

TEST(Sampling, ProbabilitiesAreTheDistributionThatSampleDrawsFrom) {
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  const auto l = logits_of(p);
  const Tensor logits = Tensor::from_vector(l, {1, 4});
  struct Case {
    SamplingParams sp;
    std::vector<double> want;  // from the definitions, by hand
  };
  const double z2 = std::pow(0.5, 0.5) + std::pow(0.3, 0.5) + std::pow(0.15, 0.5) + std::pow(0.05, 0.5);
  for (const Case& c : std::vector<Case>{
           {{1.0f, 0, 1.0f, 3}, {0.5, 0.3, 0.15, 0.05}},
           {{2.0f, 0, 1.0f, 3},
            {std::pow(0.5, 0.5) / z2, std::pow(0.3, 0.5) / z2, std::pow(0.15, 0.5) / z2, std::pow(0.05, 0.5) / z2}},
           {{1.0f, 2, 1.0f, 3}, {0.5 / 0.8, 0.3 / 0.8, 0, 0}},                 // top-k 2
           {{1.0f, 0, 0.9f, 3}, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},     // top-p: 0.95 is the first prefix >= 0.9
           {{0.0f, 0, 1.0f, 3}, {1, 0, 0, 0}},                                 // greedy
           {{1.0f, 0, 1.0f, 3, 3}, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},  // only the first 3 ids exist
       }) {
    Sampler s(c.sp);
    const auto got = s.probabilities(logits);
    ASSERT_EQ(got.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], c.want[i], 1e-6) << "T=" << c.sp.temperature << " id " << i;
    // sample() draws from exactly that distribution: 40000 draws, each frequency within 5σ.
    std::vector<int> count(4, 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++count[s.sample(l.data(), 4)];
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(count[i] / double(n), got[i], 5 * std::sqrt(got[i] * (1 - got[i]) / n) + 1e-12) << i;
  }
}

TEST(Sampling, DrawFollowsTheGivenWeights) {
  Sampler s({1.0f, 0, 1.0f, 7});
  const std::vector<double> w = {0.2, 0.0, 1.2, 0.6};  // not normalised: 0.1, 0, 0.6, 0.3
  std::vector<int> count(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[s.draw(w)];
  EXPECT_EQ(count[1], 0);
  for (int i : {0, 2, 3}) {
    const double want = w[i] / 2.0;
    EXPECT_NEAR(count[i] / double(n), want, 5 * std::sqrt(want * (1 - want) / n)) << i;
  }
  expect_error([&] { s.draw({}); }, {"empty distribution"});
  expect_error([&] { s.draw({0.0, 0.0}); }, {"sum to 0"});
  expect_error([&] { s.draw({0.5, -0.1}); }, {"probability 1", "-0.1"});
  expect_error([&] { s.draw({0.5, std::nan("")}); }, {"probability 1"});
}

TEST(Sampling, TopKAndTopPRestrictTheSupport) {
  const std::vector<double> p = {0.05, 0.4, 0.1, 0.3, 0.15};  // ranks: 1, 3, 4, 2, 0
  const auto l = logits_of(p);
  auto support = [&](SamplingParams sp) {
    Sampler s(sp);
    std::set<int> seen;
    for (int i = 0; i < 3000; ++i) seen.insert(s.sample(l.data(), 5));
    return seen;
  };
  EXPECT_EQ(support({1.0f, 1, 1.0f, 1}), (std::set<int>{1}));  // top-1 is greedy
  EXPECT_EQ(support({1.0f, 2, 1.0f, 1}), (std::set<int>{1, 3}));
  EXPECT_EQ(support({1.0f, 0, 0.7f, 1}), (std::set<int>{1, 3}));      // 0.4 + 0.3 reaches 0.7
  EXPECT_EQ(support({1.0f, 0, 0.71f, 1}), (std::set<int>{1, 3, 4}));  // needs the third
  EXPECT_EQ(support({1.0f, 0, 0.01f, 1}), (std::set<int>{1}));
  EXPECT_EQ(support({1.0f, 0, 1.0f, 1}), (std::set<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(support({1.0f, 3, 0.5f, 1}), (std::set<int>{1, 3}));  // top-p within the top-k mass
}

TEST(Sampling, BadParametersAndNaNAreClearErrors) {
  expect_error([] { Sampler({-1.0f, 0, 1.0f, 0}); }, {"temperature"});
  expect_error([] { Sampler({1.0f, -2, 1.0f, 0}); }, {"top-k"});
  expect_error([] { Sampler({1.0f, 0, 0.0f, 0}); }, {"top-p"});
  expect_error([] { Sampler({1.0f, 0, 1.5f, 0}); }, {"top-p"});
  std::vector<float> bad = {0.1f, std::nanf(""), 0.3f};
  Sampler s({});
  expect_error([&] { s.sample(bad.data(), 3); }, {"logit 1 is NaN"});
  expect_error([&] { s.sample(Tensor::zeros({2, 3}, DType::F32)); }, {"one row"});
  std::vector<float> overflow = {0.1f, INFINITY, 0.3f}, masked = {-INFINITY, -INFINITY};
  expect_error([&] { s.sample(overflow.data(), 3); }, {"logit 1 is +inf"});
  expect_error([&] { s.sample(masked.data(), 2); }, {"every logit is -inf"});
  expect_error([&] { Sampler({1.0f, 0, 1.0f, 0, 8}).sample(bad.data(), 3); }, {"3 logits for a vocabulary of 8"});
}

TEST(Sampling, PaddedVocabularyRowsAreNeverChosen) {
  // Rows 3 and 4 pad the embedding table beyond a 3-token tokenizer; they hold most of the mass.
  const auto l = logits_of({0.1, 0.1, 0.1, 0.4, 0.3});
  for (float t : {0.0f, 1.0f, 5.0f}) {
    Sampler s({t, 0, 1.0f, 7, 3});
    for (int i = 0; i < 500; ++i) ASSERT_LT(s.sample(l.data(), 5), 3) << "temperature " << t;
  }
  Sampler all({0.0f, 0, 1.0f, 7, 0});
  EXPECT_EQ(all.sample(l.data(), 5), 3);  // without the limit greedy takes the padding row
}

}  // namespace
}  // namespace inferlab
