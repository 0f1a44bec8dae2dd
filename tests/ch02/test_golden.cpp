// Chapters 01 and 02 against Hugging Face transformers: the bundled models' logits at every
// position, their KV caches after prefill, and their greedy continuations, computed in float64
// by tools/golden.py (data/golden/<model>/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "chapters/02_kv_cache/kv_cache.h"
#include "common/json_file.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

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
  const ch01::Llama m = ch01::load_llama(model_dir);
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
    ch02::ContiguousKVCache cache(c, static_cast<std::int64_t>(ids.size()));
    const auto last = ch02::forward_cached(m, cache, ids).to_double_vector();
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
    EXPECT_EQ(ch02::generate_cached(m, ids, static_cast<int>(greedy.size()), s2, {}).generated, greedy);
  }
  EXPECT_GE(p, 1);
}

INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::Values("tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-draft"));

}  // namespace
}  // namespace inferlab
