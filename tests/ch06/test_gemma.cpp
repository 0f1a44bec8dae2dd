// Gemma 2 and Gemma 3 (text) through chapter 06 against transformers (float64): the random models
// of data/golden/family-random (tools/make_family_goldens.py). Their local layers run in ring
// caches, their global ones in rows; the logits at every position (one prefill, and a short prefill
// then one token at a time, past the windows) and the greedy tokens must match. Also: the layouts
// as transformers reads them, the ring and the masked cache giving the same logits (soft-capping
// and Gemma's scale in both), and the config fields refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/models/local.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "test_util.h"

namespace inferlab {
namespace {

const std::string kFamily = std::string(INFERLAB_DATA_DIR) + "/golden/family-random";
const std::vector<std::string> kGemma = {"gemma2-alternating", "gemma3-pattern", "gemma2-gguf", "gemma3-gguf"};

nlohmann::json entry(const std::string& name) {
  const auto manifest = load_json(kFamily + "/manifest.json");
  for (const auto& e : manifest["models"])
    if (e["name"] == name) return e;
  return nullptr;
}

TEST(GemmaGolden, TheManifestListsTheModelsThisTestChecks) {
  std::vector<std::string> names;
  const auto manifest = load_json(kFamily + "/manifest.json");
  for (const auto& e : manifest["models"]) {
    if (e["chapter"] != "06") continue;
    names.push_back(e["name"].get<std::string>());
    // Every Gemma feature moves the logits far beyond rounding: the golden checks each of them.
    for (const auto& [k, v] : e["checks"].items()) {
      if (k.find("max_abs_logit_diff_with") == 0) {
        EXPECT_GT(v.get<double>(), 0.1) << names.back() << " " << k;
      }
    }
  }
  EXPECT_EQ(names, kGemma) << "tools/make_family_goldens.py and this test list different models";
}

class GemmaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmaGolden, WindowsLogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), dir = kFamily + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_family_goldens.py)";
  const models::local::LocalModel m = models::local::load_local(dir);
  const auto& c = m.config();
  EXPECT_EQ(m.layout.window, entry(name)["windows"].get<std::vector<std::int64_t>>()) << "the windows transformers applies";
  const SafetensorsFile g(dir + "/golden.safetensors");
  const auto ids = test::ids_of(g.get("input_ids"));
  const auto want = g.get("logits").to_double_vector();
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  models::local::RingKVCache whole(c, m.layout, T);
  test::expect_golden(c, models::local::forward_cached(m, whole, ids, true).to_double_vector(), want,
                      name + ": prefill logits");
  models::local::RingKVCache steps(c, m.layout, T);
  test::expect_golden(c, models::local::forward_cached(m, steps, {ids.begin(), ids.begin() + 3}, true).to_double_vector(),
                      test::rows_of(want, V, 0, 3), name + ": prefill of the first 3");
  for (std::int64_t t = 3; t < T; ++t)
    test::expect_golden(c, models::local::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                        test::rows_of(want, V, t, t + 1), name + ": decode step at position " + std::to_string(t));
  // The simple way: every position kept, the windows a mask; the same logits.
  models::local::MaskedKVCache masked(c, m.layout, T);
  test::expect_golden(c, models::local::forward_cached(m, masked, ids, true).to_double_vector(), want,
                      name + ": masked cache");
  Sampler s({});
  const auto greedy = test::ids_of(g.get("greedy_ids"));
  EXPECT_EQ(models::local::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, GemmaGolden, ::testing::ValuesIn(kGemma), test::ModelName());

TEST(Gemma, ConfigsReadAsTransformersReadsThem) {
  const models::local::LocalModel g2 = models::local::load_local(kFamily + "/gemma2-alternating");
  EXPECT_EQ(g2.config().attn_logit_softcapping, 3.0);
  EXPECT_EQ(g2.config().final_logit_softcapping, 4.0);
  EXPECT_EQ(g2.config().query_pre_attn_scalar, 20.0);
  EXPECT_DOUBLE_EQ(g2.config().embed_scale, std::sqrt(32.0));  // float32 weights: √D unrounded
  EXPECT_TRUE(g2.config().tie_word_embeddings);                // Gemma's default, left out of config.json
  EXPECT_FALSE(g2.config().qk_norm);
  const models::local::LocalModel g3 = models::local::load_local(kFamily + "/gemma3-pattern");
  EXPECT_TRUE(g3.config().qk_norm);
  EXPECT_EQ(g3.config().attn_logit_softcapping, 0.0);  // null in Gemma 3's config
  for (std::int64_t i = 0; i < g3.config().num_layers; ++i)
    EXPECT_EQ(g3.base.layers[static_cast<std::size_t>(i)].inv_freq.defined(), g3.layout.is_local(i)) << "layer " << i;
}

// A config field out of range or of the wrong type is refused, naming the file and the field.
TEST(Gemma, BadFieldsAreRefusedByName) {
  const std::string src = kFamily + "/gemma2-alternating/config.json";
  const auto base = load_json(src);
  const std::string dir = ::testing::TempDir() + "/gemma-bad";
  std::filesystem::create_directories(dir);
  struct Case {
    const char* field;
    nlohmann::json value;
  };
  for (const Case& k :
       {Case{"attn_logit_softcapping", -1.0}, Case{"final_logit_softcapping", "thirty"}, Case{"query_pre_attn_scalar", -4},
        Case{"query_pre_attn_scalar", 0}, Case{"attn_logit_softcapping", 0}, Case{"hidden_activation", "relu"},
        Case{"sliding_window", 0}, Case{"use_bidirectional_attention", true}}) {
    auto j = base;
    j[k.field] = k.value;
    test::write_file(dir + "/config.json", j.dump());
    test::expect_error(
        [&] { parse_transformer_config(load_hf_config(dir)), models::local::parse_local_layout(load_hf_config(dir), 4); },
        {dir + "/config.json", k.field});
  }
  auto j = base;
  j.erase("head_dim");  // Gemma's default, not hidden_size / num_attention_heads (8 here)
  test::write_file(dir + "/config.json", j.dump());
  EXPECT_EQ(parse_transformer_config(load_hf_config(dir)).head_dim, 256);
  j = base;
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["sliding_window_pattern"] = 0;
  j.erase("layer_types");
  test::write_file(dir + "/config.json", j.dump());
  test::expect_error([&] { models::local::parse_local_layout(load_hf_config(dir), 4); }, {"sliding_window_pattern"});
}

// The same models as llama.cpp's converter writes them (tools/make_family_goldens.py's model.gguf,
// norms with Gemma's + 1 added, llama.cpp's metadata keys): the windows llama.cpp reads, the
// golden logits, and the logits of the Hugging Face folder through the same cache.
class GemmaGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmaGguf, TheGgufIsTheSameModelAsTheFolder) {
  const std::string name = GetParam(), dir = kFamily + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.gguf"))
      << dir << "/model.gguf is missing (tools/make_family_goldens.py)";
  ASSERT_TRUE(entry(name)["gguf"].get<bool>());
  const models::local::LocalModel g = models::local::load_local(dir + "/model.gguf"), hf = models::local::load_local(dir);
  EXPECT_EQ(g.layout.window, entry(name)["windows"].get<std::vector<std::int64_t>>()) << "the windows llama.cpp applies";
  const auto &c = g.config(), &h = hf.config();
  EXPECT_EQ(c.architecture, h.architecture);
  EXPECT_EQ(c.qk_norm, h.qk_norm);
  EXPECT_EQ(c.tie_word_embeddings, h.tie_word_embeddings);
  EXPECT_EQ(c.attn_logit_softcapping, h.attn_logit_softcapping);
  EXPECT_EQ(c.final_logit_softcapping, h.final_logit_softcapping);
  EXPECT_EQ(c.query_pre_attn_scalar, h.query_pre_attn_scalar);
  EXPECT_EQ(c.rope_local_base_freq, h.rope_local_base_freq);
  EXPECT_EQ(c.rope_scaling.dump(), h.rope_scaling.is_null() ? "null" : h.rope_scaling.dump());
  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  const auto want = gold.get("logits").to_double_vector();
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  models::local::RingKVCache a(c, g.layout, T), b(h, hf.layout, T);
  const auto got = models::local::forward_cached(g, a, ids, true).to_double_vector();
  test::expect_golden(c, got, want, name + ".gguf: logits");
  const auto folder = models::local::forward_cached(hf, b, ids, true).to_double_vector();
  EXPECT_LE(test::max_diff(got, folder), test::two_path_bound(c, folder)) << "the GGUF against the folder";
  Sampler s({});
  const auto greedy = test::ids_of(gold.get("greedy_ids"));
  EXPECT_EQ(models::local::generate_cached(g, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, GemmaGguf, ::testing::Values("gemma2-gguf", "gemma3-gguf"), test::ModelName());

// A refusal of an architecture names the chapter that runs it.
TEST(Gemma, RefusalsNameTheChapterThatRuns) {
  const std::string dir = ::testing::TempDir() + "/other-arch";
  std::filesystem::create_directories(dir);
  auto j = load_json(kFamily + "/gemma2-alternating/config.json");
  for (const auto& [arch, chapter] : {std::pair{"MambaForCausalLM", "it runs in chapter 07, ch07_mamba"},
                                      std::pair{"DeepseekV3ForCausalLM", "it runs in chapter 04, ch04_mla"},
                                      std::pair{"InferLabMDLMForMaskedDiffusion", "chapter 08"}}) {
    j["architectures"] = {arch};
    test::write_file(dir + "/config.json", j.dump());
    test::expect_error([&] { models::local::parse_local_layout(load_hf_config(dir), 4); }, {arch, chapter});
    test::expect_error([&] { models::load_llama(dir); }, {chapter});
  }
  test::expect_error([&] { models::load_llama(kFamily + "/gemma3-gguf"); }, {"chapter 06", "ch06_local_attention"});
}

// Soft-capping reaches both attention paths: the reference loop and the threaded kernel agree,
// and a cap changes the result.
TEST(Gemma, SoftcapInBothAttentionPaths) {
  std::mt19937_64 rng(7);
  auto rand = [&](Shape s) {
    Tensor t = Tensor::empty(s, DType::F32);
    std::normal_distribution<float> d(0, 3);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  };
  const Tensor q = rand({5, 4, 8}), k = rand({9, 2, 8}), v = rand({9, 2, 8});
  AttentionParams p;
  p.softcap = 2.0f;
  p.window = 4;
  Tensor a = Tensor::empty({5, 4, 8}, DType::F32), b = Tensor::empty({5, 4, 8}, DType::F32);
  ref::attention(q, k, v, a, p);
  ops::attention(q, k, v, b, p);
  const auto ra = a.to_double_vector(), rb = b.to_double_vector();
  EXPECT_LT(test::max_diff(ra, rb), 1e-5 * test::max_abs(ra));
  p.softcap = 0;
  EXPECT_GT(test::max_diff(ops::attention(q, k, v, p).to_double_vector(), ra), 1e-2);
  p.softcap = -1;
  test::expect_error([&] { ops::attention(q, k, v, p); }, {"softcap"});
}

}  // namespace
}  // namespace inferlab
