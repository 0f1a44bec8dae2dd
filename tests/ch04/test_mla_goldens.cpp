// Chapter 04 against transformers on the random tiny models of data/golden/mla-random
// (tools/make_mla_goldens.py): DeepseekV3 with q_lora_rank null and set, both RoPE pairings,
// dv ≠ dn and two YaRN configs, and DeepseekV2 with and without YaRN. Per model and decode path:
// logits at every position (one prefill, and a prefill followed by one token per step), the
// latent cache rows after prefill, and the greedy continuation, against float64 references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "common/json_file.h"
#include "common/models/mla.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "mla_golden_util.h"

namespace inferlab {
namespace {

using models::mla::MlaPath;
using test::golden_bound;
using test::ids_of;

const std::string kDir = std::string(INFERLAB_DATA_DIR) + "/golden/mla-random";
constexpr double u = 0x1p-24;  // float32 unit roundoff

// The models tools/make_mla_goldens.py writes (ModelList checks the manifest agrees).
const std::vector<std::string> kModels = {
    "v3-qdirect-halfsplit", "v3-qlora-interleave", "v3-yarn-deepseek", "v3-yarn-mscale", "v2-qlora", "v2-yarn"};

using test::max_abs;

using test::expect_golden;

// The cache's rows 0 .. T-1 of every layer, [c ‖ k_pe], against transformers' c_kv and k_rope.
// DeepseekV3 with rope_interleave de-interleaves k_pe before rotating it (even dims first, then
// odd ones), where chapter 04 rotates adjacent pairs in place: its k_pe[2j] is transformers'
// k_rope[j] and k_pe[2j + 1] is k_rope[dr/2 + j]. DeepseekV2 and the half split keep the order.
void expect_latent_rows(const models::mla::MlaModel& m, const models::mla::LatentCache& cache, const SafetensorsFile& g,
                        std::int64_t T, const std::string& when) {
  const auto& c = m.config();
  const std::int64_t r = m.mla.kv_lora_rank, dr = m.mla.qk_rope_head_dim;
  const bool deinterleaved = c.architecture == "DeepseekV3ForCausalLM" && m.mla.rope_interleave;
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const Tensor stored = cache.rows(l);
    const Tensor ckv = g.get("layer" + std::to_string(l) + ".c_kv");
    const Tensor kr = g.get("layer" + std::to_string(l) + ".k_rope");
    std::vector<double> got, want;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t j = 0; j < r; ++j) got.push_back(stored.at<float>({t, 0, j})), want.push_back(ckv.at<float>({t, j}));
      for (std::int64_t j = 0; j < dr; ++j) {
        const std::int64_t hf = deinterleaved ? (j % 2) * (dr / 2) + j / 2 : j;
        got.push_back(stored.at<float>({t, 0, r + j})), want.push_back(kr.at<float>({t, hf}));
      }
    }
    expect_golden(c, got, want, when + ": layer " + std::to_string(l) + " latent rows [c ‖ k_pe]");
  }
}

TEST(MlaRandomGoldens, ModelList) {
  const auto manifest = load_json(kDir + "/manifest.json");
  std::vector<std::string> names;
  for (const auto& e : manifest["models"]) names.push_back(e["name"].get<std::string>());
  EXPECT_EQ(names, kModels) << "tools/make_mla_goldens.py and this test list different models";
  EXPECT_EQ(manifest["compute_dtype"], "float64");  // what golden_bound assumes
}

class MlaRandomGolden : public ::testing::TestWithParam<std::tuple<std::string, MlaPath>> {};

TEST_P(MlaRandomGolden, LogitsLatentCacheAndGreedyTokensMatchTransformers) {
  const auto [name, path] = GetParam();
  const std::string dir = kDir + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_mla_goldens.py)";
  const models::mla::MlaModel m = models::mla::load_mla(dir);
  const SafetensorsFile g(dir + "/golden.safetensors");
  const nlohmann::json manifest = load_json(kDir + "/manifest.json");
  nlohmann::json entry;
  for (const auto& e : manifest["models"])
    if (e["name"] == name) entry = e;
  ASSERT_FALSE(entry.is_null()) << name << " is not in the manifest";
  const auto& c = m.config();
  const auto ids = ids_of(g.get("input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size());

  // The numbers transformers derives from the config: the softmax scale (with DeepseekV3's YaRN
  // mscale²), YaRN's factor on cos and sin, and the dr frequencies. transformers computes its
  // YaRN ramp in float32, which moves a frequency by up to 4u · f · (1 - 1/s) (f the plain one).
  const auto& numbers = entry["transformers_numbers"];
  const double scale = numbers["softmax_scale"].get<double>();
  EXPECT_NEAR(m.mla.softmax_scale(), scale, u * scale) << "softmax scale";
  EXPECT_NEAR(m.mla.rope_attention_factor, numbers["rope_attention_scaling"].get<double>(), 1e-15) << "cos/sin factor";
  const auto want_freq = g.get("rope.inv_freq_f64").to_double_vector();
  const auto plain = rope_inv_freq(m.mla.qk_rope_head_dim, c.rope_theta).to_double_vector();
  const double s = m.mla.yarn ? m.mla.yarn->factor : 1.0;
  std::vector<double> freq_bound;
  for (std::size_t i = 0; i < plain.size(); ++i) freq_bound.push_back(u * want_freq[i] + 4 * u * plain[i] * (1 - 1 / s));
  test::expect_within(m.base.inv_freq.to_double_vector(), want_freq, freq_bound, "RoPE frequencies");

  // One prefill of the whole sequence: every position's logits, then the latent cache.
  const auto want = g.get("logits").to_double_vector();
  models::mla::LatentCache cache(c, m.mla, T);
  expect_golden(c, models::mla::forward_cached(m, cache, ids, true, path).to_double_vector(), want, "prefill logits");
  expect_latent_rows(m, cache, g, T, "prefill");

  // A short prefill, then one token per step (teacher-forced): step t's logits are row t.
  models::mla::LatentCache steps(c, m.mla, T);
  test::expect_prefill_then_steps(m, steps, ids, want, path);
  expect_latent_rows(m, steps, g, T, "prefill then decode");

  // Greedy continuation through the cache, token for token.
  const auto greedy = ids_of(g.get("greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::mla::generate_cached(m, ids, static_cast<int>(greedy.size()), sampler, {}, path).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, MlaRandomGolden,
                         ::testing::Combine(::testing::ValuesIn(kModels),
                                            ::testing::Values(MlaPath::Plain, MlaPath::Absorbed)),
                         test::model_path_name);

// The YaRN and DeepseekV2 fields that the chapter refuses, by name: rope_scaling types other
// than yarn, a malformed yarn field, V2's mscale_all_dim (transformers' V2 ignores it where V3
// applies it) and V2's MLP biases.
TEST(MlaRandomGoldens, RefusalsNameTheField) {
  auto error_of = [](const std::string& model, const char* field, const nlohmann::json& value) -> std::string {
    HfConfig hf = load_hf_config(kDir + "/" + model);
    hf.json[field] = value;
    try {
      models::mla::parse_mla_config(hf, parse_transformer_config(hf));
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  auto expect_named = [](const std::string& err, std::initializer_list<const char*> words) {
    for (const char* w : words) EXPECT_NE(err.find(w), std::string::npos) << err;
  };
  expect_named(error_of("v3-yarn-deepseek", "rope_scaling", {{"type", "linear"}, {"factor", 4.0}}),
               {"field 'rope_scaling'", "type 'linear' is not implemented in chapter 04"});
  expect_named(error_of("v3-yarn-deepseek", "rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"beta_slow", -1}}),
               {"field 'rope_scaling'", "'beta_slow' must be a finite non-negative number"});
  expect_named(error_of("v3-yarn-deepseek", "rope_scaling", {{"type", "yarn"}, {"mscale", 1.0}}),
               {"field 'rope_scaling'", "missing field 'factor'"});
  expect_named(error_of("v2-yarn", "rope_scaling", {{"type", "yarn"}, {"factor", 8.0}, {"mscale_all_dim", 0.707}}),
               {"field 'rope_scaling'", "'mscale_all_dim' is 0.707", "DeepseekV2ForCausalLM ignores it"});
  expect_named(error_of("v2-qlora", "mlp_bias", true), {"field 'mlp_bias' is true"});
  EXPECT_EQ(error_of("v2-yarn", "rope_scaling", {{"type", "yarn"}, {"factor", 8.0}, {"mscale", 0.707}}), "no error");
  // DeepseekV2 rotates adjacent pairs whatever rope_interleave says.
  HfConfig v2 = load_hf_config(kDir + "/v2-qlora");
  v2.json["rope_interleave"] = false;
  EXPECT_TRUE(models::mla::parse_mla_config(v2, parse_transformer_config(v2)).rope_interleave);
}

}  // namespace
}  // namespace inferlab
