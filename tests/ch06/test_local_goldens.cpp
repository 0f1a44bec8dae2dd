// Chapter 06 against transformers (float64): tiny-swa and tiny-hybrid (MinistralForCausalLM,
// tools/golden.py: three prompts inside the window, and one prompt of 95 tokens that wraps the
// ring of 64), and the random Mistral, Ministral and Qwen2 models of data/golden/window-random
// (tools/make_window_goldens.py: windows of 5 to 7 over 40 tokens, hybrid layer types, Qwen2's
// max_window_layers, windows present but unused). Logits from one prefill and token by token,
// the KV rows after prefill, greedy tokens; all through the ring cache.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/models/local.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
const std::string kRandom = kData + "/golden/window-random";
using test::expect_golden;
using test::ids_of;
using test::rows_of;

const std::vector<std::string> kModels = {"mistral-w7", "mistral-null", "ministral-hybrid", "qwen2-window", "qwen2-unused"};

// Every position's logits: one prefill, and a short prefill then one token per step.
void check_logits(const models::local::LocalModel& m, const std::vector<std::int32_t>& ids, const std::vector<double>& want,
                  const std::string& what) {
  const auto& c = m.config();
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  models::local::RingKVCache whole(c, m.layout, T);
  expect_golden(c, models::local::forward_cached(m, whole, ids, true).to_double_vector(), want, what + ": prefill logits");
  const std::int64_t P = std::min<std::int64_t>(3, T - 1);
  models::local::RingKVCache steps(c, m.layout, T);
  expect_golden(c, models::local::forward_cached(m, steps, {ids.begin(), ids.begin() + P}, true).to_double_vector(),
                rows_of(want, V, 0, P), what + ": prefill of the first " + std::to_string(P));
  for (std::int64_t t = P; t < T; ++t)
    expect_golden(c, models::local::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                  rows_of(want, V, t, t + 1), what + ": decode step at position " + std::to_string(t));
}

class ZooWindowGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooWindowGolden, LogitsCachesAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), model_dir = kData + "/models/" + name, golden_dir = kData + "/golden/" + name;
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const models::local::LocalModel m = models::local::load_local(model_dir);
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  EXPECT_EQ(manifest["compute_dtype"], "float64");
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  const auto& c = m.config();
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    const std::string key = "prompt" + std::to_string(p++) + ".";
    SCOPED_TRACE(name + " " + key);
    const auto ids = ids_of(g.get(key + "input_ids"));
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids);
    check_logits(m, ids, g.get(key + "logits").to_double_vector(), key);
    models::local::RingKVCache cache(c, m.layout, static_cast<std::int64_t>(ids.size()));
    models::local::forward_cached(m, cache, ids);
    for (std::int64_t l = 0; l < c.num_layers; ++l)
      for (const char* kv : {"k", "v"}) {
        const Tensor ref = g.get(key + "layer" + std::to_string(l) + "." + kv),
                     ours = kv[0] == 'k' ? cache.k(l) : cache.v(l);
        std::vector<double> got, want;
        for (std::int64_t t = 0; t < static_cast<std::int64_t>(ids.size()); ++t)  // inside the window: slot t
          for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
            for (std::int64_t d = 0; d < c.head_dim; ++d)
              got.push_back(ours.at<float>({cache.slot(l, t), h, d})), want.push_back(ref.at<float>({h, t, d}));
        expect_golden(c, got, want, key + "layer " + std::to_string(l) + " " + kv);
      }
    Sampler s({});
    const auto greedy = ids_of(g.get(key + "greedy_ids"));
    EXPECT_EQ(models::local::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
  }
  // The long prompt: 95 tokens, the ring of 64 wraps; transformers' logits at its last 8 positions.
  const auto ids = ids_of(g.get("long.input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  ASSERT_GT(T, 64);
  const auto tail = g.get("long.logits_tail").to_double_vector();
  const std::int64_t n = static_cast<std::int64_t>(tail.size()) / c.vocab_size;
  models::local::RingKVCache whole(c, m.layout, T), steps(c, m.layout, T);
  const auto all = models::local::forward_cached(m, whole, ids, true).to_double_vector();
  expect_golden(c, rows_of(all, c.vocab_size, T - n, T), tail, "long prompt, one prefill");
  std::vector<double> stepped;
  models::local::forward_cached(m, steps, {ids.begin(), ids.begin() + 60});
  for (std::int64_t t = 60; t < T; ++t) {
    const auto row = models::local::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector();
    if (t >= T - n) stepped.insert(stepped.end(), row.begin(), row.end());
  }
  expect_golden(c, stepped, tail, "long prompt, decoded token by token past the window");
  Sampler s({});
  const auto greedy = ids_of(g.get("long.greedy_ids"));
  EXPECT_EQ(models::local::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooWindowGolden, ::testing::Values("tiny-swa", "tiny-hybrid"), test::ModelName());

TEST(WindowRandomGoldens, ModelList) {
  const auto manifest = load_json(kRandom + "/manifest.json");
  std::vector<std::string> names;
  for (const auto& e : manifest["models"]) names.push_back(e["name"].get<std::string>());
  EXPECT_EQ(names, kModels) << "tools/make_window_goldens.py and this test list different models";
  EXPECT_EQ(manifest["compute_dtype"], "float64");
}

class WindowRandomGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowRandomGolden, WindowsLogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), dir = kRandom + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_window_goldens.py)";
  const models::local::LocalModel m = models::local::load_local(dir);
  nlohmann::json entry;
  const nlohmann::json manifest = load_json(kRandom + "/manifest.json");
  for (const auto& e : manifest["models"])
    if (e["name"] == name) entry = e;
  ASSERT_FALSE(entry.is_null());
  EXPECT_EQ(m.layout.window, entry["windows"].get<std::vector<std::int64_t>>()) << "the windows transformers applies";
  const SafetensorsFile g(dir + "/golden.safetensors");
  const auto ids = ids_of(g.get("input_ids"));
  check_logits(m, ids, g.get("logits").to_double_vector(), name);
  Sampler s({});
  const auto greedy = ids_of(g.get("greedy_ids"));
  EXPECT_EQ(models::local::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, WindowRandomGolden, ::testing::ValuesIn(kModels), test::ModelName());

}  // namespace
}  // namespace inferlab
