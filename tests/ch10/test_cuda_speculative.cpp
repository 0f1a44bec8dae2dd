// Chapter 10 on the GPU: both models on CUDA, the target's verification pass over γ + 1 tokens
// and the whole round (distributions, draws, accept/reject walk) there. Each kernel equals its
// host twin: the sampling distributions equal Sampler::probabilities, and with the same seed the
// device round emits the host round's tokens and leaves the random stream where the host leaves
// it. Greedy and sampled speculative decoding on tiny-mha equal the CPU's token for token.
// (Skipped, with the driver's reason, without a GPU.)
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "chapters/10_speculative_sampling/cuda_speculative.h"
#include "chapters/10_speculative_sampling/speculative.h"
#include "golden_util.h"
#include "table_model.h"

namespace inferlab {
namespace {

using ch10::Distribution;

using test::TableModel;

// Random tables over V tokens; every row of the draft is nonzero everywhere, the target's has zeros.
std::vector<Distribution> random_table(std::int64_t V, std::uint64_t seed, bool with_zeros) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<Distribution> t(static_cast<std::size_t>(V), Distribution(static_cast<std::size_t>(V)));
  for (auto& row : t) {
    double sum = 0;
    for (auto& x : row) sum += (x = with_zeros && u(g) < 0.3 ? 0.0 : u(g) + 1e-3);
    for (auto& x : row) x /= sum;
  }
  return t;
}

TEST(CudaSpeculative, DistributionsEqualTheSamplersOnEveryRow) {
  IL_REQUIRE_CUDA();
  const std::int64_t T = 5, V = 1000;
  std::mt19937_64 g(3);
  std::normal_distribution<float> n(0, 2);
  std::vector<float> l(static_cast<std::size_t>(T * V));
  for (auto& x : l) x = n(g);
  l[17] = l[18] = 9.0f;  // a tie at the top: ids break it
  l[V + 995] = 50.0f;    // row 1's largest logit is beyond a vocabulary of 988: never drawn there
  const Tensor host = Tensor::from_vector(l, {T, V}), dev = host.to(Device::CUDA);
  auto params = [](float t, int k, float p, std::int64_t vocab) {
    SamplingParams s;
    s.temperature = t, s.top_k = k, s.top_p = p, s.vocab = vocab;
    return s;
  };
  for (const SamplingParams& sp : {params(1, 0, 1, 0), params(0.7f, 40, 1, 0), params(1.3f, 0, 0.9f, 0),
                                   params(1, 100, 0.8f, 988), params(0, 0, 1, 988), params(0.5f, 1, 1, 0)}) {
    const std::vector<double> d = ch10::cuda::distributions(dev, sp).to_double_vector();
    Sampler s(sp);
    for (std::int64_t t = 0; t < T; ++t) {
      const std::vector<double> want = s.probabilities(host.slice(0, t, t + 1));
      // Both sums are over at most V terms of double rounding: each probability is within
      // (V + 2)·2⁻⁵³ of its value relative, whatever the order.
      for (std::int64_t i = 0; i < V; ++i)
        ASSERT_NEAR(d[static_cast<std::size_t>(t * V + i)], want[static_cast<std::size_t>(i)],
                    want[static_cast<std::size_t>(i)] * static_cast<double>(V + 2) * 0x1p-52)
            << "row " << t << " id " << i << ", T " << sp.temperature << " top-k " << sp.top_k << " top-p " << sp.top_p;
    }
  }
}

TEST(CudaSpeculative, BrokenLogitsAreRefusedByName) {
  IL_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> l(128, 0.0f);
  l[64 + 9] = std::numeric_limits<float>::quiet_NaN();
  for (const float t : {1.0f, 0.0f}) {  // sampled and greedy
    SamplingParams sp;
    sp.temperature = t;
    test::expect_error(
        [&] {
      ch10::cuda::distributions(Tensor::from_vector(l, {2, 64}).to(Device::CUDA), sp);
        },
        {"logit 9 of row 1", "NaN"});
    std::vector<float> minf(128, 0.0f);
    std::fill(minf.begin() + 64, minf.end(), -inf);
    test::expect_error(
        [&] {
      ch10::cuda::distributions(Tensor::from_vector(minf, {2, 64}).to(Device::CUDA), sp);
        },
        {"every logit of row 1 is -inf"});
  }
}

TEST(CudaSpeculative, DrawsEqualTheHostsForTheSameUniformNumbers) {
  IL_REQUIRE_CUDA();
  const std::int64_t V = 3000;  // more ids than threads: several per thread, zeros among them
  std::vector<double> w;
  std::mt19937_64 g(5);
  std::uniform_real_distribution<double> u(0, 1);
  for (std::int64_t i = 0; i < V; ++i) w.push_back(i % 7 == 3 ? 0.0 : u(g));
  const Tensor dev = Tensor::from_vector(w, {1, V}).to(Device::CUDA);
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 99;
  Sampler host(sp), numbers(sp);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(ch10::cuda::draw(dev, 0, numbers.uniform()), host.draw(w)) << "draw " << i;
  // The edges: u = 0 takes the first nonzero id, one nonzero weight is always drawn, all zeros is refused.
  EXPECT_EQ(ch10::cuda::draw(dev, 0, 0.0), 0);
  std::vector<double> one(static_cast<std::size_t>(V), 0.0), zeros(static_cast<std::size_t>(V), 0.0);
  one[2500] = 0.25;
  const Tensor one_dev = Tensor::from_vector(one, {1, V}).to(Device::CUDA);
  for (const double x : {0.0, 0.5, 1.0 - 0x1p-53}) EXPECT_EQ(ch10::cuda::draw(one_dev, 0, x), 2500);
  test::expect_error([&] { ch10::cuda::draw(Tensor::from_vector(zeros, {1, V}).to(Device::CUDA), 0, 0.5); }, {"sum to 0"});
}

TEST(CudaSpeculative, TheWalkEqualsTheHostsOnHandMadeRows) {
  IL_REQUIRE_CUDA();
  // Unnormalised rows (both walks take them) where q = p / 2 at the first position: half the drafts
  // are rejected there with an empty residual, so the token comes from q itself; then p = q; and a
  // draft of probability 0 under its own model, which is refused.
  const std::vector<Distribution> p = {{0.4, 0.6, 0.0}, {0.2, 0.3, 0.5}};
  const std::vector<Distribution> q = {{0.2, 0.3, 0.0}, {0.2, 0.3, 0.5}, {0.1, 0.1, 0.8}};
  auto dev = [](const std::vector<Distribution>& rows) {
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    return Tensor::from_vector(flat, {static_cast<std::int64_t>(rows.size()), 3}).to(Device::CUDA);
  };
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 8;
  Sampler a(sp), b(sp);
  int rejected_at_first = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<std::int32_t> drafts = {trial % 2, 2};
    const ch10::Verdict host = ch10::verify(drafts, p, q, a);
    Sampler ahead = b;
    std::vector<double> u(3);
    for (double& x : u) x = ahead.uniform();
    const ch10::cuda::DeviceVerdict d = ch10::cuda::verify(drafts, dev(p), dev(q), u);
    for (int i = 0; i < d.used; ++i) b.uniform();
    ASSERT_EQ(d.verdict.accepted, host.accepted) << "trial " << trial;
    ASSERT_EQ(d.verdict.next, host.next) << "trial " << trial;
    ASSERT_EQ(d.verdict.bonus, host.bonus) << "trial " << trial;
    ASSERT_NEAR(d.alpha_sum, ch10::acceptance(p[0], q[0]) + ch10::acceptance(p[1], q[1]), 1e-15);
    rejected_at_first += host.accepted == 0;
  }
  EXPECT_EQ(a.uniform(), b.uniform());
  EXPECT_GT(rejected_at_first, 100);  // the empty-residual branch ran
  const std::vector<Distribution> p0 = {{0.0, 1.0, 0.0}, {0.2, 0.3, 0.5}};
  test::expect_error([&] { ch10::cuda::verify({0, 2}, dev(p0), dev(q), {0.1, 0.2, 0.3}); }, {"probability 0"});
}

TEST(CudaSpeculative, TheDeviceRoundEmitsTheHostRoundsTokens) {
  IL_REQUIRE_CUDA();
  // The chi-square test's models (tests/ch10/test_speculative.cpp) but larger and random: the
  // device round must emit exactly the host round's tokens and leave the stream where it does.
  const std::int64_t V = 300;
  const auto target = random_table(V, 1, true), draft = random_table(V, 2, false);
  SamplingParams sp;
  sp.temperature = 1, sp.seed = 20261202;
  Sampler a(sp), b(sp);
  std::int64_t accepted = 0, drafted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const std::int64_t gamma = 1 + trial % 4;
    TableModel ht(target, Device::CPU), hd(draft, Device::CPU), dt(target, Device::CUDA), dd(draft, Device::CUDA);
    const auto host = ch10::speculative_generate(ht, hd, {0}, 9, gamma, a, {});
    const auto dev = ch10::speculative_generate(dt, dd, {0}, 9, gamma, b, {});
    ASSERT_EQ(dev.generated, host.generated) << "trial " << trial;
    ASSERT_EQ(dev.origin, host.origin) << "trial " << trial;
    ASSERT_NEAR(dev.alpha_sum, host.alpha_sum, 1e-12 * static_cast<double>(host.alpha_positions + 1)) << "trial " << trial;
    accepted += host.accepted, drafted += host.drafted;
  }
  EXPECT_EQ(a.uniform(), b.uniform());  // the same numbers consumed
  EXPECT_GT(accepted, 0);               // both branches of the walk ran
  EXPECT_LT(accepted, drafted);
}

TEST(CudaSpeculative, ACustomResidualRunsTheHostRound) {
  IL_REQUIRE_CUDA();
  const auto t = random_table(8, 1, true), d = random_table(8, 2, false);
  TableModel ht(t, Device::CPU), hd(d, Device::CPU), dt(t, Device::CUDA), dd(d, Device::CUDA);
  SamplingParams sp;
  sp.temperature = 1;
  Sampler a(sp), b(sp);
  const ch10::Residual wrong = [](const Distribution& q, const Distribution&) { return q; };
  const auto host = ch10::speculative_generate(ht, hd, {0}, 40, 2, a, {}, wrong);
  const auto dev = ch10::speculative_generate(dt, dd, {0}, 40, 2, b, {}, wrong);
  EXPECT_EQ(dev.generated, host.generated);
}

// tiny-mha verifying tiny-draft on the GPU and on the CPU, with the same seed.
void expect_gpu_equals_cpu(const SamplingParams& sp) {
  const std::string data = INFERLAB_DATA_DIR;
  const models::Llama target = models::load_llama(data + "/models/tiny-mha"),
                      draft = models::load_llama(data + "/models/tiny-draft");
  const models::Llama gt = target.to(Device::CUDA, DType::F32), gd = draft.to(Device::CUDA, DType::F32);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  ch10::CachedModel ct(target, 128, sp), cd(draft, 128, sp), t(gt, 128, sp), d(gd, 128, sp);
  Sampler a(sp), b(sp);
  const auto cpu = ch10::speculative_generate(ct, cd, prompt, 48, 4, a, {});
  const auto gpu = ch10::speculative_generate(t, d, prompt, 48, 4, b, {});
  // The logits differ by float rounding, so a draw could land differently only when its uniform
  // number falls within ~1e-6 of a boundary: over 48 tokens, a chance of about 1e-4.
  EXPECT_EQ(gpu.generated, cpu.generated);
  EXPECT_EQ(gpu.rounds, cpu.rounds);
  EXPECT_NEAR(gpu.alpha(), cpu.alpha(), 1e-4);
}

TEST(CudaSpeculative, GreedyOnTheGpuEqualsTheCpu) {
  IL_REQUIRE_CUDA();
  expect_gpu_equals_cpu({});
}

TEST(CudaSpeculative, SampledOnTheGpuEqualsTheCpu) {
  IL_REQUIRE_CUDA();
  SamplingParams sp;
  sp.temperature = 1, sp.top_p = 0.95f, sp.seed = 4, sp.vocab = 988;
  expect_gpu_equals_cpu(sp);
}

}  // namespace
}  // namespace inferlab
