// Chapter 04: MLA against transformers' DeepseekV3 (tiny-mla's logits and latent caches,
// float64, tools/golden.py), and the two decode paths against each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/json_file.h"
#include "common/metrics.h"
#include "common/models/mla.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
using models::mla::MlaPath;

using test::golden_bound;
using test::ids_of;

using test::max_abs;
using test::max_diff;
using test::two_path_bound;

class MlaGolden : public ::testing::TestWithParam<MlaPath> {};

TEST_P(MlaGolden, LogitsLatentCacheAndGreedyTokensMatchTransformers) {
  const MlaPath path = GetParam();
  const std::string model_dir = kData + "/models/tiny-mla", golden_dir = kData + "/golden/tiny-mla";
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const models::mla::MlaModel m = models::mla::load_mla(model_dir);
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  const auto& c = m.config();
  const std::int64_t r = m.mla.kv_lora_rank, dr = m.mla.qk_rope_head_dim;
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    SCOPED_TRACE("prompt " + std::to_string(p) + ": " + prompt["text"].get<std::string>());
    const std::string key = "prompt" + std::to_string(p++) + ".";
    const auto ids = ids_of(g.get(key + "input_ids"));
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids);
    const std::int64_t T = static_cast<std::int64_t>(ids.size());

    // Logits at every position, from one prefill through the latent cache.
    models::mla::LatentCache cache(c, m.mla, T);
    const auto got = models::mla::forward_cached(m, cache, ids, true, path).to_double_vector();
    const auto want = g.get(key + "logits").to_double_vector();
    const double bound = golden_bound(c, max_abs(want));
    const double worst = max_diff(got, want);
    EXPECT_LE(worst, bound) << "max |Δ logit| against transformers (float64)";
    RecordProperty(key + "worst_over_bound", std::to_string(worst / bound));
    const auto want_last = g.get(key + "last_logits_f64").to_double_vector();
    const std::vector<double> got_last(got.end() - static_cast<std::ptrdiff_t>(want_last.size()), got.end());
    EXPECT_LE(max_diff(got_last, want_last), golden_bound(c, max_abs(want_last)));

    // The latent cache after prefill: [c ‖ k_pe] per row against transformers' c_kv and k_rope.
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      const Tensor rows = cache.rows(l);
      const Tensor ckv = g.get(key + "layer" + std::to_string(l) + ".c_kv");
      const Tensor kr = g.get(key + "layer" + std::to_string(l) + ".k_rope");
      std::vector<double> a, b;
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = 0; j < r; ++j) a.push_back(rows.at<float>({t, 0, j})), b.push_back(ckv.at<float>({t, j}));
        for (std::int64_t j = 0; j < dr; ++j) a.push_back(rows.at<float>({t, 0, r + j})), b.push_back(kr.at<float>({t, j}));
      }
      EXPECT_LE(max_diff(a, b), golden_bound(c, max_abs(b))) << "layer " << l << " latent rows";
    }

    // Greedy continuation, token for token (prefill, then one token per step).
    const auto greedy = ids_of(g.get(key + "greedy_ids"));
    Sampler s({});
    EXPECT_EQ(models::mla::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}, path).generated, greedy);
  }
  EXPECT_GE(p, 1);
}

INSTANTIATE_TEST_SUITE_P(Paths, MlaGolden, ::testing::Values(MlaPath::Plain, MlaPath::Absorbed),
                         [](const auto& info) { return info.param == MlaPath::Plain ? "Plain" : "Absorbed"; });

// A small random DeepseekV3 shape; q_lora_rank and the pairing vary.
struct Shape4 {
  TransformerConfig c;
  models::mla::MlaConfig mla;
};

Shape4 small(bool q_lora, bool interleave) {
  Shape4 s;
  auto& c = s.c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.hidden_size = 48, c.intermediate_size = 96, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 4, c.head_dim = 8;
  c.vocab_size = 64, c.max_position_embeddings = 64, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  s.mla.kv_lora_rank = 16, s.mla.qk_nope_head_dim = 12, s.mla.qk_rope_head_dim = 8, s.mla.v_head_dim = 10;
  s.mla.q_lora_rank = q_lora ? 24 : 0;
  s.mla.rope_interleave = interleave;
  return s;
}

class MlaTwoPath : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(MlaTwoPath, AbsorbedEqualsPlainAndPrefillThenDecodeEqualsOneForward) {
  const auto [q_lora, interleave] = GetParam();
  const Shape4 s = small(q_lora, interleave);
  auto rng = test::rng_for_test();
  const models::mla::MlaModel m = models::mla::random_mla(s.c, s.mla, rng());
  std::vector<std::int32_t> ids;
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(s.c.vocab_size - 1));
  for (int i = 0; i < 11; ++i) ids.push_back(tok(rng));
  const std::int64_t T = static_cast<std::int64_t>(ids.size());

  // One full forward, both paths: every position's logits.
  models::mla::LatentCache plain_cache(s.c, s.mla, T), abs_cache(s.c, s.mla, T);
  const auto plain = models::mla::forward_cached(m, plain_cache, ids, true, MlaPath::Plain).to_double_vector();
  const auto absorbed = models::mla::forward_cached(m, abs_cache, ids, true, MlaPath::Absorbed).to_double_vector();
  EXPECT_LE(max_diff(absorbed, plain), two_path_bound(s.c, plain)) << "absorbed against plain";
  // Layer 0's latent rows come before either path's attention: identical. Later layers' rows
  // inherit the paths' rounding through the residual stream.
  EXPECT_EQ(plain_cache.rows(0).to_double_vector(), abs_cache.rows(0).to_double_vector());
  for (std::int64_t l = 1; l < s.c.num_layers; ++l) {
    const auto want = plain_cache.rows(l).to_double_vector();
    EXPECT_LE(max_diff(abs_cache.rows(l).to_double_vector(), want), two_path_bound(s.c, want)) << "layer " << l;
  }

  // Prefill a prefix, then decode the rest one token at a time: each step's logits are the full
  // forward's row for that position.
  const std::int64_t V = s.c.vocab_size, P = 4;
  for (MlaPath path : {MlaPath::Plain, MlaPath::Absorbed}) {
    SCOPED_TRACE(path == MlaPath::Plain ? "plain" : "absorbed");
    models::mla::LatentCache cache(s.c, s.mla, T);
    models::mla::forward_cached(m, cache, std::vector<std::int32_t>(ids.begin(), ids.begin() + P), false, path);
    for (std::int64_t t = P; t < T; ++t) {
      const auto step =
          models::mla::forward_cached(m, cache, {ids[static_cast<std::size_t>(t)]}, false, path).to_double_vector();
      const std::vector<double> row(plain.begin() + t * V, plain.begin() + (t + 1) * V);
      EXPECT_LE(max_diff(step, row), two_path_bound(s.c, row)) << "position " << t;
    }
    EXPECT_EQ(cache.length(), T);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaTwoPath,
                         ::testing::Values(std::pair{false, false}, std::pair{false, true}, std::pair{true, false},
                                           std::pair{true, true}),
                         [](const auto& info) {
  return std::string(info.param.first ? "QLora" : "QDirect") + (info.param.second ? "Interleaved" : "HalfSplit");
});

TEST(MlaCache, HoldsOneLatentRowPerTokenAndLayer) {
  const Shape4 s = small(false, false);
  models::mla::LatentCache cache(s.c, s.mla, 10);
  EXPECT_EQ(cache.bytes(), 10 * (16 + 8) * 2 * 4);
  EXPECT_EQ(cache.rows(0).shape(), (Shape{10, 1, 24}));
  cache.commit(6);
  cache.truncate(2);
  EXPECT_EQ(cache.length(), 2);
  EXPECT_THROW(cache.truncate(3), Error);
  EXPECT_THROW(cache.commit(9), Error);
  cache.release();
  EXPECT_EQ(cache.bytes(), 0);
}

// W_UK and W_UV are kv_b_proj's rows, head by head: the absorbed path's weights hold exactly
// W_KVB's values, nothing more.
TEST(MlaAbsorb, SplitsKvBProjIntoEachHeadsUkTransposedAndUv) {
  const Shape4 s = small(false, false);
  auto rng = test::rng_for_test();
  const models::mla::MlaModel m = models::mla::random_mla(s.c, s.mla, rng());
  const std::int64_t N = s.c.num_heads, dn = s.mla.qk_nope_head_dim, dv = s.mla.v_head_dim, r = s.mla.kv_lora_rank;
  const models::mla::MlaAttention& a = m.attn[1];
  const Tensor w = a.wkv_b.weight;
  ASSERT_EQ(a.uk_t.size(), static_cast<std::size_t>(N));
  ASSERT_EQ(a.uv.size(), static_cast<std::size_t>(N));
  for (std::int64_t h = 0; h < N; ++h) {
    const Tensor& uk = a.uk_t[static_cast<std::size_t>(h)];
    const Tensor& uv = a.uv[static_cast<std::size_t>(h)];
    ASSERT_EQ(uk.shape(), (Shape{r, dn}));
    ASSERT_EQ(uv.shape(), (Shape{dv, r}));
    for (std::int64_t j = 0; j < r; ++j) {
      for (std::int64_t i = 0; i < dn; ++i)
        ASSERT_EQ(uk.at<float>({j, i}), w.at<float>({h * (dn + dv) + i, j}))
            << "head " << h << " W_UK[" << i << ", " << j << "]";
      for (std::int64_t i = 0; i < dv; ++i)
        ASSERT_EQ(uv.at<float>({i, j}), w.at<float>({h * (dn + dv) + dn + i, j}))
            << "head " << h << " W_UV[" << i << ", " << j << "]";
    }
  }
}

// mla_cost is what the ops count when the block runs: its matmul and attention FLOPs, exactly,
// for a prefill chunk after nothing, a chunk after a cached prefix, and a decode row.
TEST(MlaCost, EqualsTheFlopsTheOpsCount) {
  auto rng = test::rng_for_test();
  for (bool q_lora : {false, true}) {
    const Shape4 s = small(q_lora, false);
    const models::mla::MlaModel m = models::mla::random_mla(s.c, s.mla, rng());
    for (auto [S, T] : {std::pair<std::int64_t, std::int64_t>{0, 7}, {5, 3}, {9, 1}}) {
      for (MlaPath path : {MlaPath::Plain, MlaPath::Absorbed}) {
        SCOPED_TRACE(std::string(path == MlaPath::Plain ? "plain" : "absorbed") + ", S = " + std::to_string(S) +
                     ", T = " + std::to_string(T) + (q_lora ? ", q_lora" : ""));
        models::mla::LatentCache cache(s.c, s.mla, S + T);
        if (S > 0) {
          cache.append(0, test::uniform(rng, {S, s.mla.latent_dim()}, -1, 1));
          cache.commit(S);
        }
        std::vector<models::SequenceStep> seqs{{std::vector<std::int32_t>(static_cast<std::size_t>(T), 1), &cache}};
        const models::Batch batch(m.base, seqs);
        const Tensor h = test::uniform(rng, {T, s.c.hidden_size}, -1, 1);
        metrics::CountScope scope;
        models::mla::attention_block(m, m.attn[0], h, batch, 0, path);
        const auto& ops = scope.by_op();
        const models::mla::MlaCost cost = models::mla::mla_cost(s.mla, s.c.hidden_size, s.c.num_heads, T, S, path);
        EXPECT_EQ(ops.at("matmul").flops + ops.at("attention").flops, cost.projection_flops + cost.cache_flops);
        EXPECT_EQ(cost.cache_bytes, static_cast<double>((S + T) * s.mla.latent_dim() * 4));
        EXPECT_EQ(cost.rebuilt_bytes > 0, path == MlaPath::Plain);
      }
    }
  }
}

// Above crossover_rows rows per step (at a long context) the plain path needs fewer FLOPs, below
// it the absorbed one: DeepSeek-V2's dimensions.
TEST(MlaCost, CrossoverRowsSplitsThePaths) {
  models::mla::MlaConfig v2;
  v2.kv_lora_rank = 512, v2.qk_nope_head_dim = 128, v2.qk_rope_head_dim = 64, v2.v_head_dim = 128;
  const double cross = models::mla::crossover_rows(v2);
  EXPECT_NEAR(cross, 512.0 * 256 / 768, 1e-9);
  const std::int64_t S = 1 << 22;
  auto cache_flops = [&](std::int64_t T, MlaPath p) { return models::mla::mla_cost(v2, 5120, 128, T, S, p).cache_flops; };
  for (std::int64_t T : {std::int64_t{1}, static_cast<std::int64_t>(std::floor(cross))})
    EXPECT_LT(cache_flops(T, MlaPath::Absorbed), cache_flops(T, MlaPath::Plain)) << "T = " << T;
  for (std::int64_t T : {static_cast<std::int64_t>(std::ceil(cross)) + 1, std::int64_t{1024}})
    EXPECT_GT(cache_flops(T, MlaPath::Absorbed), cache_flops(T, MlaPath::Plain)) << "T = " << T;
  // 2r ≤ dn + dv: the absorbed path is never the costlier one, at any T.
  v2.kv_lora_rank = 128;
  EXPECT_TRUE(std::isinf(models::mla::crossover_rows(v2)));
}

// Config fields that would change the math and are not implemented are refused by name.
TEST(MlaConfigRefusals, NameTheField) {
  const HfConfig base = load_hf_config(kData + "/models/tiny-mla");
  auto refused = [&](const char* field, const nlohmann::json& value) {
    HfConfig hf = base;
    hf.json[field] = value;
    try {
      const TransformerConfig c = parse_transformer_config(hf);
      models::mla::parse_mla_config(hf, c);
    } catch (const Error& e) {
      return std::string(e.what()).find(std::string("'") + field + "'") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused("first_k_dense_replace", -1));
  // Past the 4 layers: the checkpoint's MoE tensors would be looked for as dense ones.
  EXPECT_TRUE(refused("first_k_dense_replace", 100));
  {
    HfConfig hf = base;
    hf.json["first_k_dense_replace"] = 100;
    test::expect_error([&] { models::mla::parse_mla_config(hf, parse_transformer_config(hf)); },
                       {"'first_k_dense_replace' = 100 exceeds num_hidden_layers (4)"});
    // A factor past float32 turned every expert weight into inf and the first logits into NaN.
    hf.json["first_k_dense_replace"] = 1;
    hf.json["n_routed_experts"] = 4;
    hf.json["routed_scaling_factor"] = 1e39;
    test::expect_error([&] { models::mla::parse_mla_config(hf, parse_transformer_config(hf)); },
                       {"'routed_scaling_factor' must be a positive float32, got 1e+39"});
  }
  EXPECT_TRUE(refused("rope_scaling", nlohmann::json{{"type", "linear"}, {"factor", 40}}));
  EXPECT_TRUE(refused("attention_bias", true));
  EXPECT_TRUE(refused("qk_head_dim", 30));
  EXPECT_TRUE(refused("head_dim", 16));
  EXPECT_TRUE(refused("qk_rope_head_dim", 7));
  HfConfig ok = base;
  const TransformerConfig c = parse_transformer_config(ok);
  EXPECT_NO_THROW(models::mla::parse_mla_config(ok, c));
}

}  // namespace
}  // namespace inferlab
