// Chapters 01 and 02 against Hugging Face transformers: the bundled models' logits at every
// position, their KV caches after prefill, and their greedy continuations, computed in float64
// by tools/golden.py (data/golden/<model>/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "chapters/01_naive_decode/generate.h"
#include "common/json_file.h"
#include "common/models/kv_cache.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"
#include "test_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;

using test::golden_bound;
using test::ids_of;

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsCachesAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam();
  const std::string model_dir = kData + "/models/" + name, golden_dir = kData + "/golden/" + name;
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const models::Llama m = models::load_llama(model_dir);
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  const auto& c = m.config;
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    SCOPED_TRACE(name + " prompt " + std::to_string(p) + ": " + prompt["text"].get<std::string>());
    const std::string key = "prompt" + std::to_string(p++) + ".";
    const auto ids = ids_of(g.get(key + "input_ids"));
    // The tokenizer: our tokenizer.json reader against the ids transformers was given.
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids);

    // Logits at every position (chapter 01's forward pass).
    const auto want = g.get(key + "logits").to_double_vector();
    const auto got = ch01::forward(m, ids, true).to_double_vector();
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    const double bound = golden_bound(c, scale);
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LE(worst, bound) << "max |Δ logit| against transformers (float64)";
    RecordProperty(key + "worst_over_bound", std::to_string(worst / bound));

    // The KV cache after prefill (chapter 02): transformers keeps [K, T, H] per layer (keys after
    // RoPE); ours is [T, K, H].
    models::ContiguousKVCache cache(c, static_cast<std::int64_t>(ids.size()));
    const auto last = models::forward_cached(m, cache, ids).to_double_vector();
    const auto want_last = g.get(key + "last_logits_f64").to_double_vector();
    for (std::size_t i = 0; i < last.size(); ++i) ASSERT_NEAR(last[i], want_last[i], bound) << "logit " << i;
    const std::int64_t T = static_cast<std::int64_t>(ids.size());
    for (std::int64_t l = 0; l < c.num_layers; ++l)
      for (const char* kv : {"k", "v"}) {
        const Tensor ref = g.get(key + "layer" + std::to_string(l) + "." + kv);
        const Tensor ours = kv[0] == 'k' ? cache.k(l) : cache.v(l);
        double s = 0, w = 0;
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
            for (std::int64_t d = 0; d < c.head_dim; ++d) {
              const double a = ours.at<float>({t, h, d}), b = ref.at<float>({h, t, d});
              s = std::max(s, std::fabs(b)), w = std::max(w, std::fabs(a - b));
            }
        EXPECT_LE(w, golden_bound(c, s)) << "layer " << l << " " << kv;
      }

    // Greedy continuations, token for token, through both chapters.
    const auto greedy = ids_of(g.get(key + "greedy_ids"));
    Sampler s1({}), s2({});
    EXPECT_EQ(ch01::generate_naive(m, ids, static_cast<int>(greedy.size()), s1, {}).generated, greedy);
    EXPECT_EQ(models::generate_cached(m, ids, static_cast<int>(greedy.size()), s2, {}).generated, greedy);
  }
  EXPECT_GE(p, 1);
}

INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::Values("tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-draft"));

// Llama's attention_bias (biases on q_proj, k_proj, v_proj and o_proj) and mlp_bias (on gate_proj,
// up_proj and down_proj), against tools/make_llama_bias_goldens.py's random models: logits at
// every position through chapter 01's pass and chapter 02's cache (one prefill, then a token at a
// time), and greedy tokens through both.
const std::string kLlamaRandom = kData + "/golden/llama-random";
const std::vector<std::string> kBiasModels = {"llama-attention-bias", "llama-all-bias"};

TEST(LlamaRandomGolden, TheManifestListsTheModelsThisTestChecks) {
  const auto manifest = load_json(kLlamaRandom + "/manifest.json");
  std::vector<std::string> names;
  for (const auto& e : manifest["models"]) {
    names.push_back(e["name"].get<std::string>());
    // Zeroing the biases moves the logits far beyond any rounding: the golden checks them.
    EXPECT_GT(e["checks"]["max_abs_logit_diff_without_o_proj_bias"].get<double>(), 0.1) << names.back();
  }
  EXPECT_EQ(names, kBiasModels) << "tools/make_llama_bias_goldens.py and this test list different models";
  EXPECT_EQ(manifest["compute_dtype"], "float64");
}

// A random model's golden (data/golden/<set>/<name>): logits at every position through chapter
// 01's pass and chapter 02's cache (one prefill, then a prefill of 3 and a token at a time), and
// greedy tokens through both.
void expect_random_golden(const models::Llama& m, const std::string& dir, const std::string& name) {
  const auto& c = m.config;
  const SafetensorsFile g(dir + "/golden.safetensors");
  const auto ids = ids_of(g.get("input_ids"));
  const auto want = g.get("logits").to_double_vector();
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  test::expect_golden(c, ch01::forward(m, ids, true).to_double_vector(), want, name + ": chapter 01 logits");
  models::ContiguousKVCache whole(c, T);
  test::expect_golden(c, models::forward_cached(m, whole, ids, true).to_double_vector(), want, name + ": prefill logits");
  models::ContiguousKVCache steps(c, T);
  test::expect_golden(c, models::forward_cached(m, steps, {ids.begin(), ids.begin() + 3}, true).to_double_vector(),
                      test::rows_of(want, V, 0, 3), name + ": prefill of the first 3");
  for (std::int64_t t = 3; t < T; ++t)
    test::expect_golden(c, models::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                        test::rows_of(want, V, t, t + 1), name + ": decode step at position " + std::to_string(t));
  const auto greedy = ids_of(g.get("greedy_ids"));
  Sampler s1({}), s2({});
  EXPECT_EQ(ch01::generate_naive(m, ids, static_cast<int>(greedy.size()), s1, {}).generated, greedy);
  EXPECT_EQ(models::generate_cached(m, ids, static_cast<int>(greedy.size()), s2, {}).generated, greedy);
}

class LlamaRandomGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaRandomGolden, BiasedLogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), dir = kLlamaRandom + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors"))
      << dir << " is missing (tools/make_llama_bias_goldens.py)";
  const models::Llama m = models::load_llama(dir);
  const auto& c = m.config;
  const bool mlp = name == "llama-all-bias";
  ASSERT_TRUE(c.attention_bias && c.attention_out_bias);
  ASSERT_EQ(c.mlp_bias, mlp);
  for (const auto& l : m.layers) {
    for (const Linear* w : {&l.wq, &l.wk, &l.wv, &l.wo}) EXPECT_TRUE(w->bias.defined());
    for (const Linear* w : {&l.w_gate, &l.w_up, &l.w_down}) EXPECT_EQ(w->bias.defined(), mlp);
  }
  expect_random_golden(m, dir, name);
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaRandomGolden, ::testing::ValuesIn(kBiasModels), test::ModelName());

// Qwen3 (tools/make_family_goldens.py's random models in data/golden/family-random): a
// Llama-family layer with an RMSNorm over head_dim on every query and key head before RoPE. The
// same checks as the biased Llamas above; and the Gemma models of the same set refused by name,
// with the chapter that runs them.
const std::string kFamily = kData + "/golden/family-random";
const std::vector<std::string> kQwen3 = {"qwen3-gqa", "qwen3-tied"};

TEST(Qwen3Golden, TheManifestListsTheModelsThisTestChecks) {
  const auto manifest = load_json(kFamily + "/manifest.json");
  std::vector<std::string> names;
  for (const auto& e : manifest["models"])
    if (e["chapter"] == "01") names.push_back(e["name"].get<std::string>());
  auto all = kQwen3;
  all.push_back("llama32-tied");
  EXPECT_EQ(names, all) << "tools/make_family_goldens.py and this test list different models";
  EXPECT_EQ(manifest["compute_dtype"], "float64");
}

class Qwen3Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen3Golden, LogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), dir = kFamily + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_family_goldens.py)";
  const models::Llama m = models::load_llama(dir);
  const auto& c = m.config;
  ASSERT_TRUE(c.qk_norm);
  EXPECT_EQ(m.tied(), name == "qwen3-tied");
  for (const auto& l : m.layers) {
    ASSERT_TRUE(l.q_norm.defined() && l.k_norm.defined());
    EXPECT_EQ(l.q_norm.shape(), (Shape{c.head_dim}));
  }
  expect_random_golden(m, dir, name);
}

INSTANTIATE_TEST_SUITE_P(Models, Qwen3Golden, ::testing::ValuesIn(kQwen3), test::ModelName());

// Llama 3.2's kind of folder: no lm_head tensor (tie_word_embeddings) and llama3 RoPE scaling.
TEST(Llama32Golden, TiedHeadAndLlama3ScalingMatchTransformers) {
  const std::string dir = kFamily + "/llama32-tied";
  const models::Llama m = models::load_llama(dir);
  EXPECT_TRUE(m.tied());
  EXPECT_FALSE(m.config.rope_scaling.is_null());
  expect_random_golden(m, dir, "llama32-tied");
}

// Without its per-head norms a Qwen3 is a different model: the golden would catch a loader that
// dropped them (the test above), and this says by how much.
TEST(Qwen3Golden, TheHeadNormsChangeTheLogits) {
  models::Llama m = models::load_llama(kFamily + "/qwen3-gqa");
  const SafetensorsFile g(kFamily + "/qwen3-gqa/golden.safetensors");
  const auto ids = test::ids_of(g.get("input_ids"));
  const auto want = g.get("logits").to_double_vector();
  for (auto& l : m.layers) l.q_norm = Tensor(), l.k_norm = Tensor();
  EXPECT_GT(test::max_diff(ch01::forward(m, ids, true).to_double_vector(), want), 0.1);
}

// Gemma interleaves local and global layers: chapters 01 and 02 would attend to everything, so
// they refuse it and name chapter 06, which runs it.
TEST(Qwen3Golden, GemmaIsRefusedNamingChapterSix) {
  for (const char* name : {"gemma2-alternating", "gemma3-pattern"})
    test::expect_error([&] { models::load_llama(kFamily + "/" + name); }, {"chapter 06", "ch06_local_attention"});
}

}  // namespace
}  // namespace inferlab
