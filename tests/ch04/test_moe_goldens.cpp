// Chapter 04 on DeepSeek-V2/V3 models with mixture-of-experts layers, against transformers on the
// random models of data/golden/moe-random (tools/make_moe_goldens.py): V2's softmax scores with
// greedy and group-limited routing, V3's sigmoid scores with the score bias and noaux_tc groups,
// shared experts, dense layers before first_k_dense_replace. Per model and decode path: logits
// at every position (one prefill, and a prefill followed by one token per step) and the greedy
// continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "chapters/04_mla/moe_decode.h"
#include "common/json_file.h"
#include "common/models/mla.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "mla_golden_util.h"

namespace inferlab {
namespace {

using models::mla::MlaPath;
using test::expect_golden;
using test::ids_of;

const std::string kDir = std::string(INFERLAB_DATA_DIR) + "/golden/moe-random";
const std::vector<std::string> kModels = {"deepseek-v2-greedy", "deepseek-v2-group", "deepseek-v3-noaux",
                                          "deepseek-v3-shared"};

TEST(MoeDeepSeekGoldens, ModelList) {
  std::vector<std::string> names;
  const nlohmann::json manifest = load_json(kDir + "/manifest.json");
  for (const auto& e : manifest["models"])
    if (e["class"].get<std::string>().rfind("Deepseek", 0) == 0) names.push_back(e["name"].get<std::string>());
  EXPECT_EQ(names, kModels) << "tools/make_moe_goldens.py and this test list different DeepSeek models";
}

class MoeDeepSeekGolden : public ::testing::TestWithParam<std::tuple<std::string, MlaPath>> {};

TEST_P(MoeDeepSeekGolden, LogitsAndGreedyTokensMatchTransformers) {
  const auto [name, path] = GetParam();
  const std::string dir = kDir + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_moe_goldens.py)";
  const models::mla::MlaModel m = models::mla::load_mla(dir);
  const auto& c = m.config();
  ASSERT_TRUE(c.moe.has_value());
  std::int64_t moe_layers = 0;
  for (std::size_t i = 0; i < m.base.layers.size(); ++i) {
    moe_layers += m.base.layers[i].moe.defined() ? 1 : 0;
    EXPECT_EQ(m.base.layers[i].moe.defined(), static_cast<std::int64_t>(i) >= c.moe->first_dense) << "layer " << i;
  }
  const nlohmann::json manifest = load_json(kDir + "/manifest.json");
  bool listed = false;
  for (const auto& e : manifest["models"])
    if (e["name"] == name) {
      listed = true;
      EXPECT_EQ(moe_layers, e["moe_layers"].get<std::int64_t>());
    }
  EXPECT_TRUE(listed) << name << " is not in the manifest";
  const SafetensorsFile g(dir + "/golden.safetensors");
  const auto ids = ids_of(g.get("input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  const auto want = g.get("logits").to_double_vector();

  models::mla::LatentCache cache(c, m.mla, T);
  expect_golden(c, models::mla::forward_cached(m, cache, ids, true, path).to_double_vector(), want, "prefill logits");
  models::mla::LatentCache steps(c, m.mla, T);
  test::expect_prefill_then_steps(m, steps, ids, want, path);
  const auto greedy = ids_of(g.get("greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::mla::generate_cached(m, ids, static_cast<int>(greedy.size()), sampler, {}, path).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, MoeDeepSeekGolden,
                         ::testing::Combine(::testing::ValuesIn(kModels),
                                            ::testing::Values(MlaPath::Plain, MlaPath::Absorbed)),
                         test::model_path_name);

}  // namespace
}  // namespace inferlab

namespace inferlab {
namespace {

// The decode arithmetic: one token reads its k experts, the shared ones and the router (a dense FFN
// of the same active width reads all but the router); a large batch reads every expert; and the
// measured count of experts touched follows the routing it is given.
TEST(MoeDecode, BytesPerStepFollowTheExpertsTouched) {
  ch04::MoeShape s;
  s.name = "test", s.hidden = 64, s.moe_layers = 3, s.bytes_per_value = 2;
  s.moe.num_experts = 16, s.moe.top_k = 4, s.moe.expert_size = 8, s.moe.shared_size = 16;
  const double D = 64, expert = 3 * D * 8 * 2, router = 16 * D * 2, shared = 3 * D * 16 * 2;
  const ch04::MoeStep one = ch04::moe_step(s, 1);
  EXPECT_DOUBLE_EQ(one.experts_touched, 4);
  EXPECT_DOUBLE_EQ(one.moe_bytes, 3 * (router + 4 * expert + shared));
  EXPECT_DOUBLE_EQ(one.dense_bytes, 3 * (4 * expert + shared));
  EXPECT_DOUBLE_EQ(one.all_expert_bytes, 3 * (router + 16 * expert + shared));
  EXPECT_DOUBLE_EQ(one.rows_per_expert, 1);
  const ch04::MoeStep many = ch04::moe_step(s, 4096);
  EXPECT_NEAR(many.moe_bytes, many.all_expert_bytes, 1e-6);
  EXPECT_DOUBLE_EQ(many.dense_bytes, one.dense_bytes);  // a dense FFN reads the same bytes at any batch
  EXPECT_NEAR(many.rows_per_expert, 4096.0 * 4 / 16, 1e-6);
  // Two tokens per layer, k = 2: a batch of both touches the union of their experts.
  const std::vector<std::vector<std::int32_t>> layers = {{0, 1, 2, 3}, {5, 6, 5, 6}};
  EXPECT_DOUBLE_EQ(ch04::measured_experts_touched(layers, 2, 1), 2);
  EXPECT_DOUBLE_EQ(ch04::measured_experts_touched(layers, 2, 2), (4.0 + 2.0) / 2);
}

}  // namespace
}  // namespace inferlab
