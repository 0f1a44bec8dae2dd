// The mixture-of-experts FFN (common/moe.h) in chapters 01 and 02: Mixtral and Qwen2-MoE against
// transformers on the random models of data/golden/moe-random (tools/make_moe_goldens.py), the
// routing rules on hand-made logits, the grouped path against the ref:: loop, a batch against
// its rows one at a time, and the refusals.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <functional>
#include <random>
#include <set>

#include "chapters/01_naive_decode/generate.h"
#include "common/json_file.h"
#include "common/metrics.h"
#include "common/models/kv_cache.h"
#include "common/safetensors.h"
#include "golden_util.h"

namespace inferlab {
namespace {

using test::expect_golden;
using test::ids_of;

const std::string kDir = std::string(INFERLAB_DATA_DIR) + "/golden/moe-random";
using Chosen = std::vector<std::int32_t>;

// ---------------------------------------------------------------------------------------------
// Goldens: chapter 01's forward pass, chapter 02's cached one step by step, greedy tokens.
class MoeLlamaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeLlamaGolden, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = kDir + "/" + GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors")) << dir << " is missing (tools/make_moe_goldens.py)";
  const models::Llama m = models::load_llama(dir);
  const SafetensorsFile g(dir + "/golden.safetensors");
  const auto& c = m.config;
  ASSERT_TRUE(c.moe.has_value());
  std::int64_t moe_layers = 0;
  for (const auto& l : m.layers) moe_layers += l.moe.defined() ? 1 : 0;
  const nlohmann::json manifest = load_json(kDir + "/manifest.json");
  bool listed = false;
  for (const auto& e : manifest["models"])
    if (e["name"] == GetParam()) {
      listed = true;
      EXPECT_EQ(moe_layers, e["moe_layers"].get<std::int64_t>()) << "MoE layers";
    }
  EXPECT_TRUE(listed) << GetParam() << " is not in the manifest";
  const auto ids = ids_of(g.get("input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const auto want = g.get("logits").to_double_vector();

  expect_golden(c, ch01::forward(m, ids, true).to_double_vector(), want, "chapter 01 logits");
  models::ContiguousKVCache cache(c, T);
  const std::int64_t P = 5;
  expect_golden(c, models::forward_cached(m, cache, {ids.begin(), ids.begin() + P}, true).to_double_vector(),
                test::rows_of(want, V, 0, P), "prefill of the first 5");
  for (std::int64_t t = P; t < T; ++t)
    expect_golden(c, models::forward_cached(m, cache, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                  test::rows_of(want, V, t, t + 1), "decode step at position " + std::to_string(t));
  const auto greedy = ids_of(g.get("greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::generate_cached(m, ids, static_cast<int>(greedy.size()), sampler, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, MoeLlamaGolden, ::testing::Values("mixtral", "qwen2-moe"), test::ModelName());

// ---------------------------------------------------------------------------------------------
// Routing on hand-made logits: each rule's choice and weights.
TEST(MoeRouting, EachRuleChoosesAndWeighsAsTransformers) {
  MoeConfig c;
  c.num_experts = 4, c.top_k = 2, c.expert_size = 1;
  std::int32_t e[2];
  float w[2];
  const float logits[4] = {0.f, 1.f, 3.f, 2.f};
  const double z = 1 + std::exp(1.0) + std::exp(3.0) + std::exp(2.0);
  // Softmax, not renormalised (Qwen2-MoE's default, DeepSeek-V2 with routed_scaling_factor).
  c.routed_scaling_factor = 2;
  route_row(c, logits, nullptr, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{2, 3}));
  EXPECT_NEAR(w[0], 2 * std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(w[1], 2 * std::exp(2.0) / z, 1e-6);
  // Renormalised (Mixtral): the two weights sum to one.
  c.routed_scaling_factor = 1, c.norm_topk_prob = true;
  route_row(c, logits, nullptr, e, w);
  EXPECT_NEAR(w[0], std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1, 1e-6);
  // V2's group_limited_greedy, 2 groups {0, 1} {2, 3}, one kept: the best group's two experts.
  c.norm_topk_prob = false, c.grouping = MoeGrouping::GroupMax, c.n_group = 2, c.topk_group = 1;
  const float split[4] = {2.9f, 2.8f, 3.f, -5.f};  // group 1 holds the best expert, group 0 the two next
  route_row(c, split, nullptr, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{2, 3}));  // only group 1 is kept: its weak expert is chosen
  // V3's noaux_tc: groups by their top-2 sum, so group 0 (2.9 + 2.8 after sigmoid) wins.
  c.scoring = MoeScoring::Sigmoid, c.grouping = MoeGrouping::GroupTop2Sum;
  route_row(c, split, nullptr, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{0, 1}));
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-2.9)), 1e-6);  // the weight is the unbiased sigmoid score
  // The bias moves the choice, not the weight.
  c.grouping = MoeGrouping::None, c.n_group = 1, c.topk_group = 1;
  const float bias[4] = {0.f, 0.f, 0.f, 1.f};
  route_row(c, split, bias, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{3, 2}));       // sigmoid(-5) + 1 = 1.007 first ...
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(5.0)), 1e-6);  // ... weighted by its unbiased sigmoid(-5)
  const float b2[4] = {0.f, 0.f, 0.f, 0.1f};
  route_row(c, split, b2, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{2, 0}));  // 0.107 is below the others
  const float b3[4] = {0.f, 0.f, -0.1f, 0.2f};
  route_row(c, split, b3, e, w);
  EXPECT_EQ(Chosen(e, e + 2), (Chosen{0, 1}));  // 3's bias drops it below both of group 0
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-2.9)), 1e-6);
}

// transformers masks the groups left out to a score of 0.0: with V3's bias a kept expert scoring
// below 0 loses to a masked one, which is then chosen. Chapter 04 does the same.
TEST(MoeRouting, MaskedGroupsScoreZeroAsInTransformers) {
  MoeConfig c;
  c.num_experts = 4, c.top_k = 2, c.expert_size = 1, c.scoring = MoeScoring::Sigmoid;
  c.grouping = MoeGrouping::GroupTop2Sum, c.n_group = 2, c.topk_group = 1;
  const float logits[4] = {0.f, 0.f, 0.f, 0.f};  // every sigmoid score 0.5
  std::int32_t e[2];
  float w[2];
  auto choose = [&](std::array<float, 4> bias) {
    route_row(c, logits, bias.data(), e, w);
    return Chosen{e[0], e[1]};
  };
  // Biased {1.1, 0.1, 0.2, 0.2}: group 0 (1.2) beats group 1 (0.4); its two experts.
  EXPECT_EQ(choose({0.6f, -0.4f, -0.3f, -0.3f}), (Chosen{0, 1}));
  // Biased {1.1, -0.2, 0.2, 0.9}: group 1 (1.1) beats group 0 (0.9); its two, 0.2 above the masked 0.0.
  EXPECT_EQ(choose({0.6f, -0.7f, -0.3f, 0.4f}), (Chosen{3, 2}));
  // Biased {-0.1, -0.2, -0.05, 2.5}: group 1 kept, but expert 2's -0.05 loses to the masked 0.0 of
  // expert 0 (the lower index of the two masked), which runs with its own unbiased score.
  EXPECT_EQ(choose({-0.6f, -0.7f, -0.55f, 2.0f}), (Chosen{3, 0}));
  EXPECT_NEAR(w[1], 0.5, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Two paths: the grouped block equals the ref:: loop; a batch equals its rows one at a time.
TransformerConfig random_moe_config(MoeGrouping grouping) {
  TransformerConfig c = models::memory_bound_shape(2, 4, 64, 64);
  c.hidden_size = 48, c.intermediate_size = 64, c.num_heads = 4, c.head_dim = 12;
  MoeConfig m;
  m.names = MoeNames::DeepSeek, m.num_experts = 8, m.top_k = 3, m.expert_size = 16, m.shared_size = 24;
  m.shared_gate = grouping == MoeGrouping::None;  // Qwen2-MoE's gate in one of the two
  m.grouping = grouping, m.n_group = grouping == MoeGrouping::None ? 1 : 4, m.topk_group = m.n_group == 1 ? 1 : 2;
  m.scoring = grouping == MoeGrouping::GroupTop2Sum ? MoeScoring::Sigmoid : MoeScoring::Softmax;
  m.score_bias = grouping == MoeGrouping::GroupTop2Sum, m.norm_topk_prob = true, m.routed_scaling_factor = 1.5;
  m.first_dense = 1;
  m.validate("test", c.num_layers);
  c.moe = m;
  return c;
}

Tensor random_rows(std::int64_t T, std::int64_t D, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  Tensor h = Tensor::empty({T, D}, DType::F32);
  for (std::int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = d(rng);
  return h;
}

TEST(MoeBlock, GroupedPathEqualsRefLoopAndBatchEqualsRows) {
  for (MoeGrouping grouping : {MoeGrouping::None, MoeGrouping::GroupMax, MoeGrouping::GroupTop2Sum}) {
    const TransformerConfig c = random_moe_config(grouping);
    const models::Llama m = models::random_llama(c, 7);
    ASSERT_FALSE(m.layers[0].moe.defined());
    const MoeFfn& f = m.layers[1].moe;
    ASSERT_TRUE(f.defined());
    ASSERT_EQ(f.shared_gate.defined(), grouping == MoeGrouping::None);
    const std::int64_t T = 37, D = c.hidden_size;
    const Tensor h = random_rows(T, D, 11);
    const auto want = ref::moe_block(f, h).to_double_vector();
    const double bound = test::two_path_bound(c, want);
    // The routing is computed once per path from the same logits' values: the same experts.
    test::expect_within(moe_block(f, h).to_double_vector(), want, std::vector<double>(want.size(), bound),
                        "grouped vs ref, grouping " + std::to_string(static_cast<int>(grouping)));
    std::vector<double> rows;
    for (std::int64_t t = 0; t < T; ++t)
      for (double v : moe_block(f, h.slice(0, t, t + 1)).to_double_vector()) rows.push_back(v);
    test::expect_within(rows, want, std::vector<double>(want.size(), bound), "row by row vs batch");
    // And the whole layer through chapter 01's mlp_block.
    test::expect_within(models::mlp_block(m.layers[1], h).to_double_vector(), want, std::vector<double>(want.size(), bound),
                        "mlp_block");
  }
}

// The grouped path reads each touched expert's weights once a call, the ref:: loop once per
// (row, choice), and the router once per row: the counted bytes differ by exactly that (the
// activations they move are the same rows either way).
TEST(MoeBlock, GroupedPathReadsEachTouchedExpertOnce) {
  const TransformerConfig c = random_moe_config(MoeGrouping::None);
  const models::Llama m = models::random_llama(c, 3);
  const MoeFfn& f = m.layers[1].moe;
  const double expert_bytes = 3.0 * static_cast<double>(f.experts[0].gate.bytes());
  for (std::int64_t T : {1, 2, 5, 40}) {
    const Tensor h = random_rows(T, c.hidden_size, 100 + static_cast<std::uint64_t>(T));
    std::set<std::int32_t> touched;
    double grouped = 0, loop = 0;
    {
      MoeRoutingHook hook([&](const MoeFfn&, const MoeRouting& r) { touched.insert(r.expert.begin(), r.expert.end()); });
      metrics::CountScope scope;
      moe_block(f, h);
      grouped = scope.work().bytes;
    }
    {
      metrics::CountScope scope;
      ref::moe_block(f, h);
      loop = scope.work().bytes;
    }
    const double k = static_cast<double>(c.moe->top_k), n = static_cast<double>(touched.size());
    EXPECT_DOUBLE_EQ(loop - grouped, (static_cast<double>(T) * k - n) * expert_bytes +
                                         static_cast<double>(T - 1) * static_cast<double>(f.router.bytes()))
        << "T = " << T << ", " << n << " experts touched";
    if (T == 1) {
      EXPECT_EQ(n, k);
    }
  }
}

TEST(MoeBlock, ExpectedExpertsTouched) {
  EXPECT_DOUBLE_EQ(expected_experts_touched(64, 6, 1), 6);
  EXPECT_NEAR(expected_experts_touched(64, 6, 2), 64 * (1 - (58.0 / 64) * (58.0 / 64)), 1e-12);
  EXPECT_NEAR(expected_experts_touched(256, 8, 1000), 256, 1e-9);
}

// ---------------------------------------------------------------------------------------------
// Refusals name the field, and the chapter that runs what this one does not.
std::string error_of(const std::string& model, const std::function<void(HfConfig&)>& edit) {
  HfConfig hf = load_hf_config(kDir + "/" + model);
  edit(hf);
  try {
    parse_transformer_config(hf);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MoeConfigRefusals, NameTheField) {
  auto expect_named = [](const std::string& err, std::initializer_list<const char*> words) {
    for (const char* w : words) EXPECT_NE(err.find(w), std::string::npos) << err;
  };
  expect_named(error_of("mixtral", [](HfConfig& h) { h.json["num_experts_per_tok"] = 5; }),
               {"num_experts_per_tok", "[1, 4]", "got 5"});
  expect_named(error_of("mixtral", [](HfConfig& h) { h.json["num_local_experts"] = 0; }), {"num_local_experts", "got 0"});
  expect_named(error_of("mixtral", [](HfConfig& h) { h.json["num_experts_per_tok"] = "two"; }), {"num_experts_per_tok"});
  expect_named(error_of("qwen2-moe", [](HfConfig& h) { h.json["mlp_only_layers"] = {7}; }),
               {"field 'mlp_only_layers' lists layer 7"});
  expect_named(error_of("qwen2-moe", [](HfConfig& h) { h.json["decoder_sparse_step"] = 0; }), {"decoder_sparse_step"});
  expect_named(error_of("qwen2-moe", [](HfConfig& h) { h.json["shared_expert_intermediate_size"] = 0; }),
               {"shared_expert_intermediate_size"});
  expect_named(error_of("deepseek-v2-group", [](HfConfig& h) { h.json["n_group"] = 3; }), {"n_group 3 does not divide"});
  expect_named(error_of("deepseek-v2-group", [](HfConfig& h) { h.json["topk_group"] = 5; }), {"topk_group", "got 5"});
  expect_named(error_of("deepseek-v2-group", [](HfConfig& h) { h.json["topk_method"] = "noaux_tc"; }),
               {"field 'topk_method' is 'noaux_tc'"});
  expect_named(error_of("deepseek-v2-greedy", [](HfConfig& h) { h.json["norm_topk_prob"] = true; }),
               {"field 'norm_topk_prob' is true", "ignores it"});
  expect_named(error_of("deepseek-v3-noaux", [](HfConfig& h) { h.json["scoring_func"] = "softmax"; }),
               {"field 'scoring_func' is 'softmax'"});
  expect_named(error_of("deepseek-v3-noaux", [](HfConfig& h) { h.json["moe_layer_freq"] = 2; }),
               {"field 'moe_layer_freq' is 2"});
  expect_named(error_of("deepseek-v3-noaux", [](HfConfig& h) { h.json["routed_scaling_factor"] = -1; }),
               {"routed_scaling_factor"});
  expect_named(error_of("deepseek-v3-noaux", [](HfConfig& h) { h.json["n_routed_experts"] = nullptr; }),
               {"field 'n_routed_experts' is null"});
  EXPECT_EQ(error_of("deepseek-v3-noaux", [](HfConfig&) {}), "no error");
}

TEST(MoeConfigRefusals, ChaptersNameTheChapterThatRunsTheModel) {
  // A DeepSeek folder in chapter 01: MLA and its MoE layers are chapter 04's.
  try {
    models::load_llama(kDir + "/deepseek-v3-noaux");
    ADD_FAILURE() << "chapter 01 loaded a DeepSeek model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it runs in chapter 04, ch04_mla"), std::string::npos) << e.what();
  }
  // Every architecture some chapter runs is named with it; one none runs gets nothing.
  EXPECT_NE(where_it_runs("MixtralForCausalLM").find("chapters 01 and 02"), std::string::npos);
  EXPECT_NE(where_it_runs("DeepseekV2ForCausalLM").find("ch04_mla"), std::string::npos);
  EXPECT_NE(where_it_runs("MinistralForCausalLM").find("ch06_local_attention"), std::string::npos);
  EXPECT_EQ(where_it_runs("GPT2LMHeadModel"), "");
  // An MoE model on CUDA: the option that runs it.
  const models::Llama m = models::load_llama(kDir + "/mixtral");
  try {
    m.to(Device::CUDA, DType::F32);
    ADD_FAILURE() << "an MoE model moved to CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
  }
}

// Parameters: an MoE layer counts every expert, and the model's count matches its tensors.
TEST(MoeConfig, ParametersCountEveryExpert) {
  for (const char* name : {"mixtral", "qwen2-moe"}) {
    const models::Llama m = models::load_llama(kDir + "/" + name);
    std::int64_t n = m.embed.numel() + m.final_norm.numel() + (m.tied() ? 0 : m.lm_head.weight.numel());
    for (const auto& l : m.layers) {
      n += l.attn_norm.numel() + l.mlp_norm.numel();
      for (const Linear* w : l.linears())
        if (w->defined()) n += w->weight.numel() + (w->bias.defined() ? w->bias.numel() : 0);
      if (l.moe.defined())
        for (const Linear* w : l.moe.linears()) n += w->weight.numel();
    }
    EXPECT_EQ(m.config.num_parameters(), n) << name;
  }
}

}  // namespace
}  // namespace inferlab
