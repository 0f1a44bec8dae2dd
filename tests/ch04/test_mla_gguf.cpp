// Chapter 04 from llama.cpp's GGUF files (common/models/mla_gguf.h): the four random
// DeepSeek-V2/V3 models with MoE layers of data/golden/moe-random, and two dense MLA models of
// data/golden/mla-random (a low-rank query; DeepSeek-V3's YaRN), written as llama.cpp's converter
// writes architecture deepseek2 (tools/make_moe_gguf.py: kv_b_proj split into attn_k_b and
// attn_v_b, the experts stacked). From the file each gives transformers' float64 logits within
// the float32 bound and its greedy tokens, by both decode paths, and the logits of the Hugging
// Face folder it came from: the same bits where the file holds the checkpoint's numbers in the
// checkpoint's order. A Q8_0 file's weights are the checkpoint's within Q8_0's rounding; a file
// with a key or tensor wrong is refused naming it; another architecture is refused naming the
// chapter that runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "common/models/mla_gguf.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "mla_golden_util.h"

namespace inferlab {
namespace {

using models::mla::MlaPath;

const std::string kGolden = std::string(INFERLAB_DATA_DIR) + "/golden";

struct Case {
  std::string set;  // the golden set the model's folder is in
  // Whether the GGUF path computes what the folder's does in the same order (so the same bits),
  // or, where not, why not (then the two are held to two float32 golden bounds).
  std::string not_exact;
};

const std::map<std::string, Case> kCases = {
    {"deepseek-v2-greedy", {"moe-random", ""}},
    {"deepseek-v2-group", {"moe-random", ""}},
    {"deepseek-v3-noaux", {"moe-random", ""}},
    {"deepseek-v3-shared",
     {"moe-random",
      "rope_interleave false: the file's q_pe and k_pe rows are in llama.cpp's adjacent-pair order, so the score's "
      "rope part sums in another order"}},
    {"v3-qlora-interleave", {"mla-random", ""}},
    // YaRN: mscale_all_dim comes back as 0.1 · mscale_all_dim stored in f32, divided by 0.1, a few
    // ulps off in double; the softmax scale it gives rounds to the same float.
    {"v3-yarn-deepseek", {"mla-random", ""}},
};

std::string folder(const std::string& name) { return kGolden + "/" + kCases.at(name).set + "/" + name; }

// The configs the file gives against the folder's: everything the forward pass reads.
void expect_same_config(const models::mla::MlaModel& g, const models::mla::MlaModel& hf) {
  const TransformerConfig &a = g.config(), &b = hf.config();
  EXPECT_EQ(a.architecture, b.architecture);
  for (auto [x, y] : {std::pair{a.hidden_size, b.hidden_size},
                      {a.intermediate_size, b.intermediate_size},
                      {a.num_layers, b.num_layers},
                      {a.num_heads, b.num_heads},
                      {a.vocab_size, b.vocab_size},
                      {a.max_position_embeddings, b.max_position_embeddings},
                      {a.head_dim, b.head_dim}})
    EXPECT_EQ(x, y);
  EXPECT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  const models::mla::MlaConfig &m = g.mla, &n = hf.mla;
  for (auto [x, y] : {std::pair{m.q_lora_rank, n.q_lora_rank},
                      {m.kv_lora_rank, n.kv_lora_rank},
                      {m.qk_nope_head_dim, n.qk_nope_head_dim},
                      {m.qk_rope_head_dim, n.qk_rope_head_dim},
                      {m.v_head_dim, n.v_head_dim}})
    EXPECT_EQ(x, y);
  EXPECT_EQ(m.yarn.has_value(), n.yarn.has_value());
  EXPECT_EQ(m.rope_attention_factor, n.rope_attention_factor);
  EXPECT_NEAR(m.softmax_mscale, n.softmax_mscale, 1e-7 * n.softmax_mscale);
  EXPECT_EQ(g.base.rope_pairing, RopePairing::Adjacent) << "llama.cpp's deepseek2 rotates adjacent pairs";
  ASSERT_EQ(a.moe.has_value(), b.moe.has_value());
  if (!a.moe) return;
  const MoeConfig &p = *a.moe, &q = *b.moe;
  EXPECT_EQ(p.names, q.names);
  for (auto [x, y] : {std::pair{p.num_experts, q.num_experts},
                      {p.top_k, q.top_k},
                      {p.expert_size, q.expert_size},
                      {p.shared_size, q.shared_size},
                      {p.n_group, q.n_group},
                      {p.topk_group, q.topk_group},
                      {p.first_dense, q.first_dense}})
    EXPECT_EQ(x, y);
  EXPECT_EQ(p.scoring, q.scoring);
  EXPECT_EQ(p.grouping, q.grouping);
  EXPECT_EQ(p.score_bias, q.score_bias);
  EXPECT_EQ(p.norm_topk_prob, q.norm_topk_prob);
  EXPECT_EQ(p.routed_scaling_factor, q.routed_scaling_factor);
}

class MlaGguf : public ::testing::TestWithParam<std::tuple<std::string, MlaPath>> {};

TEST_P(MlaGguf, LogitsAndGreedyTokensMatchTransformersAndTheFolder) {
  const auto [name, path] = GetParam();
  const std::string dir = folder(name);
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.gguf")) << dir << "/model.gguf is missing (tools/make_moe_gguf.py)";
  const models::mla::MlaModel g = models::mla::load_mla(dir + "/model.gguf");
  const models::mla::MlaModel hf = models::mla::load_mla(dir);
  expect_same_config(g, hf);
  const auto& c = g.config();
  for (std::size_t i = 0; i < g.base.layers.size(); ++i)
    EXPECT_EQ(g.base.layers[i].moe.defined(), hf.base.layers[i].moe.defined()) << "layer " << i;

  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  const auto want = gold.get("logits").to_double_vector();
  models::mla::LatentCache cache(c, g.mla, T);
  const auto got = models::mla::forward_cached(g, cache, ids, true, path).to_double_vector();
  test::expect_golden(c, got, want, "GGUF prefill logits against transformers");
  models::mla::LatentCache steps(c, g.mla, T);
  test::expect_prefill_then_steps(g, steps, ids, want, path);
  const auto greedy = test::ids_of(gold.get("greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::mla::generate_cached(g, ids, static_cast<int>(greedy.size()), sampler, {}, path).generated, greedy);

  models::mla::LatentCache hf_cache(c, hf.mla, T);
  const auto ref = models::mla::forward_cached(hf, hf_cache, ids, true, path).to_double_vector();
  const std::string& why = kCases.at(name).not_exact;
  if (why.empty()) {
    EXPECT_EQ(got, ref) << "the GGUF's logits against the folder's: the same numbers in the same order";
  } else {
    SCOPED_TRACE(why);
    test::expect_within(got, ref, std::vector<double>(ref.size(), test::two_path_bound(c, ref)),
                        "the GGUF's logits against the folder's");
  }
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& [name, c] : kCases) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Models, MlaGguf,
                         ::testing::Combine(::testing::ValuesIn(case_names()),
                                            ::testing::Values(MlaPath::Plain, MlaPath::Absorbed)),
                         test::model_path_name);

// The weights of the Q8_0 file against the checkpoint's: the Q8_0 blocks of 32 within half a
// step d = max|w| / 127 plus d's own F16 rounding times up to 127 steps (max|w| · 2^-11); the F16
// fallbacks (rows not whole blocks: ffn_down_exps, attn_k_b and attn_v_b, so kv_b_proj) within
// F16's 2^-11 relative (2^-25 below its normal range); the router, the score bias and the norms
// exact (F32, as the converter keeps them).
TEST(MlaGguf, Q8WeightsAreTheCheckpointsWithinTheirRounding) {
  const std::string dir = folder("deepseek-v3-noaux");
  const models::mla::MlaModel q = models::mla::load_mla(dir + "/model-q8_0.gguf");
  const models::mla::MlaModel hf = models::mla::load_mla(dir);
  expect_same_config(q, hf);
  {  // the file's types, as the converter's --outtype q8_0 picks them
    const gguf::File f(dir + "/model-q8_0.gguf");
    for (const auto& [name, type] : {std::pair{"blk.1.ffn_gate_exps.weight", gguf::Type::Q8_0},
                                     {"blk.0.attn_q.weight", gguf::Type::Q8_0},
                                     {"token_embd.weight", gguf::Type::Q8_0},
                                     {"blk.1.ffn_down_exps.weight", gguf::Type::F16},
                                     {"blk.0.attn_k_b.weight", gguf::Type::F16},
                                     {"blk.1.ffn_gate_inp.weight", gguf::Type::F32},
                                     {"blk.1.exp_probs_b.bias", gguf::Type::F32},
                                     {"blk.0.attn_kv_a_norm.weight", gguf::Type::F32}})
      EXPECT_EQ(gguf::type_name(f.info(name).type), gguf::type_name(type)) << name;
  }
  enum class Kind { Exact, Q8, F16 };
  auto expect_near = [](const Tensor& got_t, const Tensor& want_t, Kind kind, const std::string& what) {
    const auto got = got_t.to_double_vector(), want = want_t.to_double_vector();
    ASSERT_EQ(got.size(), want.size()) << what;
    if (kind == Kind::Exact) {
      EXPECT_EQ(got, want) << what;
      return;
    }
    std::vector<double> bound(want.size());
    for (std::size_t i = 0; i < want.size(); i += 32) {
      double amax = 0;
      for (std::size_t j = i; j < std::min(i + 32, want.size()); ++j) amax = std::max(amax, std::fabs(want[j]));
      for (std::size_t j = i; j < std::min(i + 32, want.size()); ++j)
        bound[j] = kind == Kind::Q8 ? amax / 127 * 0.5 + amax * 0x1p-11 : std::max(std::fabs(want[j]) * 0x1p-11, 0x1p-25);
    }
    test::expect_within(got, want, bound, what);
  };
  // A matrix is Q8_0 where its rows are whole blocks of 32, F16 where not.
  auto matrix = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    expect_near(a, b, b.size(1) % 32 == 0 ? Kind::Q8 : Kind::F16, what);
  };
  matrix(q.base.embed, hf.base.embed, "token_embd");
  matrix(q.base.lm_head.weight, hf.base.lm_head.weight, "output");
  expect_near(q.base.final_norm, hf.base.final_norm, Kind::Exact, "output_norm");
  for (std::size_t l = 0; l < q.attn.size(); ++l) {
    const std::string at = "layer " + std::to_string(l) + " ";
    const models::mla::MlaAttention &a = q.attn[l], &b = hf.attn[l];
    matrix(a.wq.weight, b.wq.weight, at + "attn_q");
    matrix(a.wkv_a.weight, b.wkv_a.weight, at + "attn_kv_a_mqa");
    expect_near(a.wkv_b.weight, b.wkv_b.weight, Kind::F16, at + "attn_k_b and attn_v_b");
    matrix(a.wo.weight, b.wo.weight, at + "attn_output");
    expect_near(a.kv_a_norm, b.kv_a_norm, Kind::Exact, at + "attn_kv_a_norm");
    const models::LlamaLayer &x = q.base.layers[l], &y = hf.base.layers[l];
    expect_near(x.attn_norm, y.attn_norm, Kind::Exact, at + "attn_norm");
    if (!y.moe.defined()) {
      for (auto [u, v] : {std::pair{&x.w_gate, &y.w_gate}, {&x.w_up, &y.w_up}, {&x.w_down, &y.w_down}})
        matrix(u->weight, v->weight, at + "dense ffn");
      continue;
    }
    expect_near(x.moe.router.weight, y.moe.router.weight, Kind::Exact, at + "ffn_gate_inp");
    expect_near(x.moe.score_bias, y.moe.score_bias, Kind::Exact, at + "exp_probs_b");
    for (std::size_t e = 0; e < y.moe.experts.size(); ++e)
      for (auto [u, v] : {std::pair{&x.moe.experts[e].gate, &y.moe.experts[e].gate},
                          {&x.moe.experts[e].up, &y.moe.experts[e].up},
                          {&x.moe.experts[e].down, &y.moe.experts[e].down}})
        matrix(u->weight, v->weight, at + "expert " + std::to_string(e));
    for (auto [u, v] : {std::pair{&x.moe.shared.gate, &y.moe.shared.gate},
                        {&x.moe.shared.up, &y.moe.shared.up},
                        {&x.moe.shared.down, &y.moe.shared.down}})
      matrix(u->weight, v->weight, at + "shared expert");
  }
  // And the model runs from the file, to finite logits.
  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  models::mla::LatentCache cache(q.config(), q.mla, static_cast<std::int64_t>(ids.size()));
  for (double v : models::mla::forward_cached(q, cache, ids, true).to_double_vector()) ASSERT_TRUE(std::isfinite(v));
}

// The Hugging Face names chapter 04 reads, as llama.cpp's deepseek2 names them.
TEST(MlaGguf, TensorNames) {
  std::int64_t e = 0;
  EXPECT_EQ(models::mla::deepseek2_tensor_name("model.embed_tokens.weight", &e), "token_embd.weight");
  EXPECT_EQ(e, -1);
  EXPECT_EQ(models::mla::deepseek2_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(models::mla::deepseek2_tensor_name("model.layers.12.self_attn.kv_a_proj_with_mqa.weight"),
            "blk.12.attn_kv_a_mqa.weight");
  EXPECT_EQ(models::mla::deepseek2_tensor_name("model.layers.3.mlp.gate.e_score_correction_bias"), "blk.3.exp_probs_b.bias");
  EXPECT_EQ(models::mla::deepseek2_tensor_name("model.layers.3.mlp.experts.17.down_proj.weight", &e),
            "blk.3.ffn_down_exps.weight");
  EXPECT_EQ(e, 17);
  EXPECT_EQ(models::mla::deepseek2_tensor_name("model.layers.3.mlp.shared_experts.up_proj.weight", &e),
            "blk.3.ffn_up_shexp.weight");
  EXPECT_EQ(e, -1);
  for (const char* none : {"model.layers.x.mlp.gate.weight", "model.layers.1.mlp.experts.a.up_proj.weight",
                           "model.layers.1.self_attn.k_proj.weight", "model.rotary_emb.inv_freq", "model.layers..norm"})
    EXPECT_EQ(models::mla::deepseek2_tensor_name(none), "") << none;
}

// ---------------------------------------------------------------------------------------------
// Files that are wrong.

using Changes = std::map<std::string, std::optional<gguf::Value>>;

// A copy of the GGUF at `from` at `to`, with each metadata key of `changes` set to its value
// (removed when that is nullopt) and its tensors passed through `edit` (which may drop, add or
// change them).
void rewrite(const std::string& from, const std::string& to, const Changes& changes,
             const std::function<void(std::vector<gguf::Output>&)>& edit = nullptr) {
  const gguf::File f(from);
  std::vector<std::pair<std::string, gguf::Value>> meta;
  for (const auto& [k, v] : f.metadata())
    if (!changes.count(k)) meta.emplace_back(k, v);
    else if (changes.at(k)) meta.emplace_back(k, *changes.at(k));
  for (const auto& [k, v] : changes)
    if (v && !f.has(k)) meta.emplace_back(k, *v);
  std::vector<gguf::Output> ts;
  for (const auto& i : f.tensors()) ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1}).clone()});
  if (edit) edit(ts);
  gguf::write(to, meta, ts);
}

gguf::Value u32(std::uint32_t v) { return gguf::Value::u32(v); }

// Files from before llama.cpp split kv_b (no key_length_mla: key_length and value_length are a
// head's, the tensor attn_kv_b [N·(dn + dv), r] as trained) read into the same model.
TEST(MlaGguf, TheOlderSingleKvBTensorReadsTheSame) {
  const std::string dir = folder("deepseek-v3-noaux");
  const models::mla::MlaModel split = models::mla::load_mla(dir + "/model.gguf");
  test::TempDir tmp;
  rewrite(dir + "/model.gguf", tmp.file("old.gguf"),
          {{"deepseek2.attention.key_length_mla", std::nullopt},
           {"deepseek2.attention.value_length_mla", std::nullopt},
           {"deepseek2.attention.key_length", u32(16)},
           {"deepseek2.attention.value_length", u32(8)},
           {"deepseek2.attention.head_count_kv", u32(4)}},
          [&](std::vector<gguf::Output>& ts) {
    std::erase_if(ts, [](const gguf::Output& t) {
      return t.name.find("attn_k_b") != std::string::npos || t.name.find("attn_v_b") != std::string::npos;
    });
    for (std::size_t l = 0; l < split.attn.size(); ++l) {
      const Tensor w = split.attn[l].wkv_b.weight;
      ts.push_back({"blk." + std::to_string(l) + ".attn_kv_b.weight", gguf::Type::F32, w.shape(),
                    Tensor::wrap(const_cast<void*>(w.raw_data()), {static_cast<std::int64_t>(w.nbytes())}, DType::U8,
                                 Device::CPU, nullptr)
                        .clone()});
    }
  });
  const models::mla::MlaModel old = models::mla::load_mla(tmp.file("old.gguf"));
  const auto ids = test::ids_of(SafetensorsFile(dir + "/golden.safetensors").get("input_ids"));
  models::mla::LatentCache a(split.config(), split.mla, 16), b(old.config(), old.mla, 16);
  EXPECT_EQ(models::mla::forward_cached(old, b, ids, true).to_double_vector(),
            models::mla::forward_cached(split, a, ids, true).to_double_vector());
  // And the split form's keys without its tensors: named.
  rewrite(dir + "/model.gguf", tmp.file("bad.gguf"), {}, [&](std::vector<gguf::Output>& ts) {
    std::erase_if(ts, [](const gguf::Output& t) { return t.name == "blk.0.attn_k_b.weight"; });
  });
  test::expect_error([&] { models::mla::load_mla(tmp.file("bad.gguf")); }, {"tensor blk.0.attn_k_b.weight is missing"});
}

TEST(MlaGguf, AWrongKeyIsRefusedByName) {
  test::TempDir dir;
  const std::string good = folder("deepseek-v3-noaux") + "/model.gguf", bad = dir.file("bad.gguf");
  struct Bad {
    std::string key;
    std::optional<gguf::Value> value;
    std::vector<std::string> words;
  };
  const std::vector<Bad> cases = {
      {"deepseek2.attention.kv_lora_rank", std::nullopt, {"missing metadata 'deepseek2.attention.kv_lora_rank'"}},
      {"deepseek2.attention.kv_lora_rank", gguf::Value::str("16"), {"'deepseek2.attention.kv_lora_rank' is STRING"}},
      {"deepseek2.block_count", u32(0), {"'deepseek2.block_count' = 0 is not a plausible count"}},
      {"deepseek2.attention.key_length", u32(99), {"'deepseek2.attention.key_length' = 99 is not 24"}},
      {"deepseek2.attention.value_length", u32(8), {"'deepseek2.attention.value_length' = 8 is not 16"}},
      {"deepseek2.attention.key_length_mla", u32(8), {"'deepseek2.attention.key_length_mla' = 8 leaves no dimension"}},
      // A head's nope part 4 wider than the tensors: the first one read says so.
      {"deepseek2.attention.key_length_mla", u32(20), {"tensor blk.0.attn_q.weight has shape [64, 32], expected [80, 32]"}},
      {"deepseek2.attention.head_count_kv", u32(2), {"'deepseek2.attention.head_count_kv' = 2 is neither 1"}},
      {"deepseek2.expert_gating_func", u32(3), {"'deepseek2.expert_gating_func' = 3", "softmax (1"}},
      {"deepseek2.expert_count", std::nullopt, {"missing metadata 'deepseek2.expert_count'"}},
      {"deepseek2.expert_used_count", u32(9), {"num_experts_per_tok' must be in [1, 8], got 9", "deepseek2.* metadata"}},
      {"deepseek2.expert_group_count", u32(3), {"n_group 3 does not divide the 8 routed experts"}},
      {"deepseek2.expert_group_used_count", std::nullopt, {"'deepseek2.expert_group_count' = 4 without"}},
      {"deepseek2.expert_weights_norm", u32(1), {"'deepseek2.expert_weights_norm' is UINT32, not BOOL"}},
      {"deepseek2.rope.scaling.type", gguf::Value::str("linear"), {"'deepseek2.rope.scaling.type' is 'linear'"}},
      {"deepseek2.rope.scaling.type", gguf::Value::str("yarn"), {"YaRN without metadata", "yarn_log_multiplier"}},
      {"deepseek2.vocab_size", u32(65), {"'deepseek2.vocab_size' = 65 but token_embd.weight has 64 rows"}},
      {"tokenizer.ggml.eos_token_id", u32(64), {"'tokenizer.ggml.eos_token_id' = 64 is outside the vocabulary"}},
      {"deepseek2.leading_dense_block_count",
       u32(100),
       {"'deepseek2.leading_dense_block_count' = 100 exceeds deepseek2.block_count (2)"}},
      // Fewer layers than the file holds: the tensors of the others are named.
      {"deepseek2.block_count", u32(1), {"tensor 'blk.1.", "is not part of the model", "deepseek2.block_count = 1"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.key);
    rewrite(good, bad, {{c.key, c.value}});
    test::expect_error([&] { models::mla::load_mla(bad); }, {"bad.gguf"});
    for (const auto& w : c.words) test::expect_error([&] { models::mla::load_mla(bad); }, {w});
  }
  rewrite(good, bad, {});  // the copy itself loads
  EXPECT_EQ(models::mla::load_mla(bad).config().num_layers, 2);
}

TEST(MlaGguf, AWrongTensorIsRefusedByName) {
  test::TempDir dir;
  const std::string good = folder("deepseek-v3-noaux") + "/model.gguf", bad = dir.file("bad.gguf");
  auto with = [&](const std::function<void(std::vector<gguf::Output>&)>& edit) {
    rewrite(good, bad, {}, edit);
    return bad;
  };
  auto named = [](std::vector<gguf::Output>& ts, const std::string& name) -> gguf::Output& {
    for (auto& t : ts)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  test::expect_error(
      [&] {
    models::mla::load_mla(with([&](auto& ts) {
      ts.erase(std::find_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "blk.1.attn_v_b.weight"; }));
    }));
      },
      {"bad.gguf: tensor blk.1.attn_v_b.weight is missing"});
  // attn_k_b as kv_b_proj's rows are stored, [N, dn, r], not transposed: dn = 8, r = 16.
  test::expect_error(
      [&] {
    models::mla::load_mla(with([&](auto& ts) { named(ts, "blk.0.attn_k_b.weight").shape = {4, 8, 16}; }));
      },
      {"tensor blk.0.attn_k_b.weight has shape [4, 8, 16], expected [4, 16, 8]"});
  test::expect_error(
      [&] {
    models::mla::load_mla(with([&](auto& ts) { named(ts, "blk.1.ffn_up_exps.weight").shape = {4, 24, 32}; }));
      },
      {"tensor blk.1.ffn_up_exps.weight has shape [4, 24, 32], expected [8, 12, 32]"});
  test::expect_error(
      [&] {
    models::mla::load_mla(with([&](auto& ts) {
      gguf::Output extra = named(ts, "output_norm.weight");
      extra.name = "blk.1.nextn.enorm.weight";
      ts.push_back(extra);
    }));
      },
      {"tensor 'blk.1.nextn.enorm.weight' is not part of the model"});
  test::expect_error(
      [&] {
    models::mla::load_mla(with([&](auto& ts) {
      const float nan = std::nanf("");
      std::memcpy(named(ts, "blk.1.exp_probs_b.bias").bytes.template data<std::uint8_t>() + 4 * 5, &nan, 4);
    }));
      },
      {"tensor blk.1.exp_probs_b.bias", "is nan"});
  // A file cut short: the tensor table describes bytes that are not there.
  {
    std::ifstream in(good, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    test::expect_error([&] { models::mla::load_mla(bad); }, {"bad.gguf", "runs past the end of the file"});
  }
}

// The architectures chapter 04 does not run are refused naming the chapter that does; chapter
// 04 is named for deepseek2 files (chapter 09 refuses them so: tests/ch09/test_moe_gguf.cpp).
TEST(MlaGguf, AnotherArchitectureNamesTheChapterThatRunsIt) {
  test::expect_error([&] { models::mla::load_mla(kGolden + "/moe-random/mixtral/model.gguf"); },
                     {"mixtral/model.gguf: architecture 'llama' is not deepseek2", "ch09_quantization run FILE.gguf"});
  test::TempDir dir;
  rewrite(folder("deepseek-v2-greedy") + "/model.gguf", dir.file("g.gguf"),
          {{"general.architecture", gguf::Value::str("gemma3")}});
  test::expect_error([&] { models::mla::load_mla(dir.file("g.gguf")); },
                     {"'gemma3' is not deepseek2", "ch06_local_attention"});
  EXPECT_NE(where_gguf_runs("deepseek2").find("ch04_mla generate --model FILE.gguf"), std::string::npos);
  EXPECT_NE(where_gguf_runs("qwen2moe").find("chapter 09"), std::string::npos);
  EXPECT_EQ(where_gguf_runs("mamba"), "");
}

}  // namespace
}  // namespace inferlab
