// Chapter 05 against its float64 oracle, tools/ref_transformer.py (no transformers class computes
// cross-layer attention; the reference equals transformers' Llama with sharing switched off):
// tiny-cla's goldens (tools/golden.py) and the random models of data/golden/cla-random
// (tools/make_cla_goldens.py): a sharing factor that does not divide L, s = 3, GQA and MQA
// storage layers, an untied head. Per model: every position's logits of a whole prefill and of a
// prefill followed by single-token steps, the storage layers' K and V, and greedy tokens.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/models/cla.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
const std::string kRandom = kData + "/golden/cla-random";
using test::ids_of;

// The models tools/make_cla_goldens.py writes (ModelList checks the manifest agrees).
const std::vector<std::string> kModels = {"L4-s2-mha", "L4-s3-gqa", "L5-s2-mqa", "L7-s3-gqa"};

using test::expect_golden;
using test::rows_of;

// The storage layers' rows 0 .. T-1 against the reference's K and V of the layers that store
// ([K, T, H]; ours [T, K, H]); storage layer j holds model layer j·s's.
void expect_storage(const models::cla::ClaModel& m, const models::cla::SharedKVCache& cache, const SafetensorsFile& g,
                    const std::string& key, std::int64_t T, const std::string& when) {
  const auto& c = m.config();
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    if (!m.layout.stores(l)) {
      EXPECT_FALSE(g.contains(key + "layer" + std::to_string(l) + ".k")) << "the reference stores layer " << l;
      continue;
    }
    const std::int64_t s = m.layout.storage[static_cast<std::size_t>(l)];
    for (const char* kv : {"k", "v"}) {
      const Tensor ref = g.get(key + "layer" + std::to_string(l) + "." + kv);
      const Tensor ours = kv[0] == 'k' ? cache.storage().k(s) : cache.storage().v(s);
      std::vector<double> got, want;
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
          for (std::int64_t d = 0; d < c.head_dim; ++d)
            got.push_back(ours.at<float>({t, h, d})), want.push_back(ref.at<float>({h, t, d}));
      expect_golden(c, got, want,
                    when + ": layer " + std::to_string(l) + " " + kv + " (storage layer " + std::to_string(s) + ")");
    }
  }
}

// Everything one golden sequence checks; `key` prefixes the golden file's names ("prompt0.", "").
void check_sequence(const models::cla::ClaModel& m, const SafetensorsFile& g, const std::string& key) {
  const auto& c = m.config();
  const auto ids = ids_of(g.get(key + "input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const auto want = g.get(key + "logits").to_double_vector();
  // One prefill of the whole sequence: every position's logits, then the cache.
  models::cla::SharedKVCache cache(c, m.layout, T);
  expect_golden(c, models::cla::forward_cached(m, cache, ids, true).to_double_vector(), want, "prefill logits");
  expect_storage(m, cache, g, key, T, "prefill");
  models::cla::SharedKVCache last(c, m.layout, T);
  expect_golden(c, models::cla::forward_cached(m, last, ids).to_double_vector(),
                g.get(key + "last_logits_f64").to_double_vector(), "last position's logits (float64 golden)");
  // A short prefill, then one token per step (teacher-forced): step t's logits are row t.
  const std::int64_t P = std::min<std::int64_t>(5, T - 1);
  models::cla::SharedKVCache steps(c, m.layout, T);
  expect_golden(c, models::cla::forward_cached(m, steps, {ids.begin(), ids.begin() + P}, true).to_double_vector(),
                rows_of(want, V, 0, P), "prefill of the first " + std::to_string(P));
  for (std::int64_t t = P; t < T; ++t)
    expect_golden(c, models::cla::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                  rows_of(want, V, t, t + 1), "decode step at position " + std::to_string(t));
  expect_storage(m, steps, g, key, T, "prefill then decode");
  // Greedy continuation through the shared cache, token for token.
  const auto greedy = ids_of(g.get(key + "greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::cla::generate_cached(m, ids, static_cast<int>(greedy.size()), sampler, {}).generated, greedy);
}

TEST(ClaGolden, TinyClaMatchesItsReference) {
  const std::string model_dir = kData + "/models/tiny-cla", golden_dir = kData + "/golden/tiny-cla";
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const models::cla::ClaModel m = models::cla::load_cla(model_dir);
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  EXPECT_EQ(manifest["compute_dtype"], "float64");  // what golden_bound assumes
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    SCOPED_TRACE("tiny-cla prompt " + std::to_string(p) + ": " + prompt["text"].get<std::string>());
    const std::string key = "prompt" + std::to_string(p++) + ".";
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids_of(g.get(key + "input_ids")));
    check_sequence(m, g, key);
  }
  EXPECT_EQ(p, 3);
}

TEST(ClaRandomGoldens, ModelList) {
  const auto manifest = load_json(kRandom + "/manifest.json");
  std::vector<std::string> names;
  for (const auto& e : manifest["models"]) names.push_back(e["name"].get<std::string>());
  EXPECT_EQ(names, kModels) << "tools/make_cla_goldens.py and this test list different models";
  EXPECT_EQ(manifest["compute_dtype"], "float64");
}

class ClaRandomGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ClaRandomGolden, LogitsStorageLayersAndGreedyTokensMatchTheReference) {
  const std::string dir = kRandom + "/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_cla_goldens.py)";
  const models::cla::ClaModel m = models::cla::load_cla(dir);
  const auto cfg = load_json(dir + "/config.json");
  EXPECT_EQ(m.layout.share_factor, cfg["kv_share_factor"].get<std::int64_t>());
  EXPECT_EQ(m.layout.storage_layers(), static_cast<std::int64_t>(cfg["kv_producer_layers"].size()));
  check_sequence(m, SafetensorsFile(dir + "/golden.safetensors"), "");
}

INSTANTIATE_TEST_SUITE_P(Models, ClaRandomGolden, ::testing::ValuesIn(kModels), test::ModelName());

}  // namespace
}  // namespace inferlab
