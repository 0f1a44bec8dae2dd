// Chapter 08's sampler and denoiser: the commit schedule, the samplers' invariants (each step
// commits its count, masks only fall, the prompt and committed tokens never change), an oracle
// denoiser reproduced under any schedule, Gumbel-max frequencies against softmax(l/τ), the
// denoiser bidirectional and batched, and refusals by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/08_diffusion_lm/diffusion.h"
#include "common/json_file.h"
#include "golden_util.h"
#include "test_util.h"

namespace inferlab {
namespace {

using ch08::Remasking;
using ch08::SamplerOptions;

const std::string kData = INFERLAB_DATA_DIR;

TEST(CommitCounts, SumToTheMasksAndDifferByAtMostOne) {
  EXPECT_EQ(ch08::commit_counts(16, 8), std::vector<std::int64_t>(8, 2));
  EXPECT_EQ(ch08::commit_counts(10, 4), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(ch08::commit_counts(5, 5), std::vector<std::int64_t>(5, 1));
  for (std::int64_t m = 0; m <= 40; ++m)
    for (std::int64_t s = 1; s <= 12; ++s) {
      const auto k = ch08::commit_counts(m, s);
      ASSERT_EQ(static_cast<std::int64_t>(k.size()), s);
      EXPECT_EQ(std::accumulate(k.begin(), k.end(), std::int64_t{0}), m) << m << " over " << s;
      EXPECT_LE(*std::max_element(k.begin(), k.end()) - *std::min_element(k.begin(), k.end()), 1);
      EXPECT_TRUE(std::is_sorted(k.rbegin(), k.rend())) << "the larger counts come first";
    }
}

// A denoiser that knows the answer: at every position the target's logit stands `margin` above
// random others.
ch08::Denoiser oracle(const std::vector<std::int32_t>& target, std::int64_t V, float margin, std::uint64_t seed) {
  return [=](const std::vector<std::int32_t>& canvas) {
    std::mt19937_64 rng(seed + canvas.size());
    Tensor l = test::uniform(rng, {static_cast<std::int64_t>(canvas.size()), V});
    for (std::size_t p = 0; p < canvas.size(); ++p)
      l.data<float>()[p * static_cast<std::size_t>(V) + static_cast<std::size_t>(target[p])] += margin;
    return l;
  };
}

std::vector<SamplerOptions> schedules() {
  std::vector<SamplerOptions> out;
  for (const std::int64_t block : {12, 6, 3, 1})
    for (const std::int64_t per_block : {1, 2, 3})
      for (const Remasking r : {Remasking::LowConfidence, Remasking::Random})
        for (const double tau : {0.0, 1.0}) {
          if (per_block > block) continue;
          SamplerOptions o;
          o.gen_length = 12, o.block_length = block, o.steps = per_block * (12 / block), o.remasking = r,
          o.temperature = tau;
          o.seed = static_cast<std::uint64_t>(block * 100 + per_block);
          out.push_back(o);
        }
  return out;
}

TEST(Sampler, AnOracleDenoiserIsReproducedUnderAnySchedule) {
  auto rng = test::rng_for_test();
  const std::int64_t V = 20;
  const std::int32_t mask = 1;
  const std::vector<std::int32_t> prompt = {0, 5, 7};
  std::vector<std::int32_t> target = prompt;
  for (int i = 0; i < 12; ++i) target.push_back(2 + static_cast<std::int32_t>(rng() % (V - 2)));
  const auto f = oracle(target, V, 60.0f, rng());
  for (const SamplerOptions& o : schedules()) {
    SCOPED_TRACE("block " + std::to_string(o.block_length) + ", steps " + std::to_string(o.steps) + ", tau " +
                 std::to_string(o.temperature));
    EXPECT_EQ(ch08::sample_llada(f, prompt, mask, o).tokens, target);
    EXPECT_EQ(ch08::sample_mdlm(f, prompt, mask, o).tokens, target);
  }
}

// Frames of a run: what each step committed, and what it left alone.
void expect_invariants(const ch08::DiffusionRun& r, const std::vector<std::int32_t>& prompt, std::int32_t mask,
                       const std::vector<std::int64_t>* counts) {
  std::vector<std::int32_t> before = prompt;
  before.resize(r.tokens.size(), mask);
  std::int64_t masks_before = static_cast<std::int64_t>(r.tokens.size() - prompt.size());
  for (std::size_t i = 0; i < r.frames.size(); ++i) {
    const auto& f = r.frames[i];
    std::int64_t masks = 0;
    for (std::size_t p = 0; p < f.canvas.size(); ++p) {
      masks += f.canvas[p] == mask;
      if (p < prompt.size()) {
        EXPECT_EQ(f.canvas[p], prompt[p]) << "the prompt changed at step " << i;
      }
      if (before[p] != mask) {
        EXPECT_EQ(f.canvas[p], before[p]) << "a committed token changed at step " << i;
      }
      const bool committed_now =
          std::find(f.committed.begin(), f.committed.end(), static_cast<std::int64_t>(p)) != f.committed.end();
      EXPECT_EQ(committed_now, before[p] == mask && f.canvas[p] != mask) << "position " << p << ", step " << i;
    }
    EXPECT_LE(masks, masks_before) << "the mask count rose at step " << i;
    EXPECT_EQ(masks_before - masks, static_cast<std::int64_t>(f.committed.size()));
    if (counts) {
      EXPECT_EQ(static_cast<std::int64_t>(f.committed.size()), (*counts)[i]) << "step " << i;
    }
    before = f.canvas, masks_before = masks;
  }
  EXPECT_EQ(masks_before, 0) << "masks left after the last step";
  EXPECT_EQ(before, r.tokens);
  for (std::size_t g = 0; g < r.commit_step.size(); ++g) {
    const auto s = static_cast<std::size_t>(r.commit_step[g]);
    ASSERT_LT(s, r.frames.size());
    const auto& c = r.frames[s].committed;
    EXPECT_NE(std::find(c.begin(), c.end(), static_cast<std::int64_t>(prompt.size() + g)), c.end());
  }
}

models::Llama small_denoiser(std::mt19937_64& rng) {
  TransformerConfig c;
  c.architecture = "InferLabMDLMForMaskedDiffusion";
  c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
  c.vocab_size = 30, c.max_position_embeddings = 64, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  return models::random_llama(c, rng());
}

TEST(Sampler, EachStepCommitsItsCountAndNothingElseChanges) {
  auto rng = test::rng_for_test();
  ch08::DiffusionModel m{small_denoiser(rng), 1};
  const auto f = ch08::denoiser(m);
  const std::vector<std::int32_t> prompt = {0, 4, 9, 4};
  for (const SamplerOptions& o : schedules()) {
    SCOPED_TRACE("block " + std::to_string(o.block_length) + ", steps " + std::to_string(o.steps));
    const auto r = ch08::sample_llada(f, prompt, m.mask_id, o);
    EXPECT_EQ(r.forwards, o.steps);
    std::vector<std::int64_t> counts;
    for (std::int64_t b = 0; b < o.gen_length / o.block_length; ++b) {
      const auto k = ch08::commit_counts(o.block_length, o.steps / (o.gen_length / o.block_length));
      counts.insert(counts.end(), k.begin(), k.end());
    }
    expect_invariants(r, prompt, m.mask_id, &counts);
    for (auto t : r.tokens) EXPECT_NE(t, m.mask_id);
    const auto md = ch08::sample_mdlm(f, prompt, m.mask_id, o);
    expect_invariants(md, prompt, m.mask_id, nullptr);
  }
  SamplerOptions one;  // R = L: exactly one token per step
  one.gen_length = one.steps = one.block_length = 9;
  const auto r = ch08::sample_llada(f, prompt, m.mask_id, one);
  for (const auto& fr : r.frames) EXPECT_EQ(fr.committed.size(), 1u);
}

TEST(Sampler, LowConfidenceCommitsTheMostProbablePositionsFirst) {
  // Position p's target logit is p: the last masked positions are the most confident, so with
  // one commit per step the canvas fills from the right.
  const std::int64_t V = 40;
  const std::vector<std::int32_t> prompt = {0};
  const ch08::Denoiser f = [&](const std::vector<std::int32_t>& canvas) {
    Tensor l = Tensor::zeros({static_cast<std::int64_t>(canvas.size()), V}, DType::F32);
    for (std::size_t p = 0; p < canvas.size(); ++p) l.data<float>()[p * V + 2 + p] = static_cast<float>(p);
    return l;
  };
  SamplerOptions o;
  o.gen_length = o.steps = o.block_length = 6;
  const auto r = ch08::sample_llada(f, prompt, 1, o);
  EXPECT_EQ(r.commit_step, (std::vector<std::int64_t>{5, 4, 3, 2, 1, 0}));
}

TEST(Gumbel, FrequenciesMatchTheTemperedSoftmax) {
  std::mt19937_64 rng(20261201);  // fixed: the test's outcome must not depend on the run
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -3.0f};
  const std::int32_t exclude = 6;
  for (const double tau : {0.5, 1.0, 2.0}) {
    const int n = 30000;
    std::vector<double> count(logits.size(), 0);
    for (int i = 0; i < n; ++i)
      count[static_cast<std::size_t>(ch08::gumbel_draw(logits.data(), 7, tau, exclude, rng).token)] += 1;
    EXPECT_EQ(count[exclude], 0) << "the mask token was drawn";
    double z = 0;
    for (int v = 0; v < 6; ++v) z += std::exp(logits[static_cast<std::size_t>(v)] / tau);
    double chi2 = 0;
    for (int v = 0; v < 6; ++v) {
      const double expected = n * std::exp(logits[static_cast<std::size_t>(v)] / tau) / z;
      chi2 += (count[static_cast<std::size_t>(v)] - expected) * (count[static_cast<std::size_t>(v)] - expected) / expected;
    }
    EXPECT_LT(chi2, 20.52) << "tau " << tau << ": chi-square with 5 degrees of freedom above its 0.1% point";
  }
  // τ = 0: the argmax, and its probability under softmax(l) without the excluded token.
  const auto d = ch08::gumbel_draw(logits.data(), 7, 0.0, exclude, rng);
  EXPECT_EQ(d.token, 3);
  double z = 0;
  for (int v = 0; v < 6; ++v) z += std::exp(logits[static_cast<std::size_t>(v)] - 2.0);
  EXPECT_NEAR(d.probability, 1.0 / z, 1e-12);
}

TEST(Denoiser, IsBidirectionalAndBatchesEqualCanvasesAlone) {
  auto rng = test::rng_for_test();
  ch08::DiffusionModel m{small_denoiser(rng), 1};
  auto canvas = test::random_tokens(rng, 10, m.base.config.vocab_size);
  const auto base = ch08::denoise(m, {canvas}).to_double_vector();
  auto changed = canvas;
  changed[9] = (changed[9] + 1) % 30;  // the last token: a causal model's first rows would not move
  const auto moved = ch08::denoise(m, {changed}).to_double_vector();
  EXPECT_GT(test::max_diff(test::rows_of(moved, 30, 0, 1), test::rows_of(base, 30, 0, 1)), 1e-4);
  const auto causal = ch01::forward(m.base, canvas, true).to_double_vector();
  const auto causal_changed = ch01::forward(m.base, changed, true).to_double_vector();
  EXPECT_EQ(test::rows_of(causal, 30, 0, 9), test::rows_of(causal_changed, 30, 0, 9));
  const auto other = test::random_tokens(rng, 6, m.base.config.vocab_size);
  auto both = ch08::denoise(m, {canvas, other}).to_double_vector();
  auto want = base;
  const auto alone = ch08::denoise(m, {other}).to_double_vector();
  want.insert(want.end(), alone.begin(), alone.end());
  EXPECT_LE(test::max_diff(both, want), test::two_path_bound(m.base.config, want));
  ch08::NoCache c;
  EXPECT_EQ(c.bytes(), 0);
  EXPECT_THROW(c.truncate(1), Error);
}

TEST(Sampler, BadOptionsAndInputsAreRefusedByName) {
  const ch08::Denoiser f = [](const std::vector<std::int32_t>& canvas) {
    return Tensor::zeros({static_cast<std::int64_t>(canvas.size()), 8}, DType::F32);
  };
  auto refused = [&](SamplerOptions o, const std::string& says, std::vector<std::int32_t> prompt = {0}) {
    test::expect_error([&] { ch08::sample_llada(f, prompt, 1, o); }, {says});
  };
  SamplerOptions o;
  o.gen_length = 10, o.block_length = 4, o.steps = 4;
  refused(o, "multiple of the block length");
  o.block_length = 5, o.steps = 3;
  refused(o, "multiple of the 2 blocks");
  o.steps = 12;
  refused(o, "at most 10 steps");
  o.steps = 2, o.temperature = -1;
  refused(o, "temperature");
  o.temperature = 0;
  refused(o, "mask token", {0, 1});
  const ch08::Denoiser nan = [](const std::vector<std::int32_t>& canvas) {
    Tensor l = Tensor::zeros({static_cast<std::int64_t>(canvas.size()), 8}, DType::F32);
    l.data<float>()[l.numel() - 1] = NAN;
    return l;
  };
  test::expect_error([&] { ch08::sample_llada(nan, {0}, 1, o); }, {"NaN"});
}

TEST(DiffusionLoad, CausalModelsAndDenoisersAreToldApart) {
  const std::string mdlm = kData + "/models/tiny-mdlm", mha = kData + "/models/tiny-mha";
  if (!std::filesystem::exists(mdlm)) GTEST_SKIP() << mdlm << " is missing (see tools/README.md)";
  test::expect_error([&] { ch08::load_diffusion(mha); }, {"not a bidirectional denoiser"});
  test::expect_error([&] { models::load_llama(mdlm); }, {"chapter 08"});
  {  // chapter 05's cross-layer sharing used to be ignored: the model ran with a K/V of its own per layer
    test::TempDir dir;
    nlohmann::json c = load_json(mdlm + "/config.json");
    c["kv_share_factor"] = 2;
    test::write_file(dir.file("config.json"), c.dump());
    test::expect_error([&] { ch08::load_diffusion(dir.path().string()); },
                       {"field 'kv_share_factor'", "chapter 08's denoiser does not implement"});
  }
  const auto m = ch08::load_diffusion(mdlm);
  EXPECT_EQ(m.mask_id, 1);
  // The discrete ELBO: finite, positive, the same for the same draws.
  const std::vector<std::int32_t> tokens = {0, 523, 524, 278, 525, 522, 482, 15, 300, 301};
  const double a = ch08::negative_elbo(m, tokens, 4, 7), b = ch08::negative_elbo(m, tokens, 4, 7);
  EXPECT_EQ(a, b);
  EXPECT_GT(a, 0);
  EXPECT_TRUE(std::isfinite(a));
}

}  // namespace
}  // namespace inferlab
