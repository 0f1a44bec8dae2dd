// Chapter 05: cross-layer attention. Two paths (s = 1 is chapter 02 exactly; cached equals
// recomputed; a batch equals each sequence alone), the cache and parameter formulas, the layout,
// and the refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/models/cla.h"
#include "common/safetensors.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
using models::cla::ClaLayout;
using models::cla::ClaModel;
using models::cla::SharedKVCache;
using test::expect_error;
using test::two_path_bound;

TransformerConfig small_config(std::int64_t layers, std::int64_t kv_heads) {
  TransformerConfig c;
  c.architecture = "InferLabCLAForCausalLM";
  c.hidden_size = 48, c.intermediate_size = 96, c.num_layers = layers, c.num_heads = 6, c.num_kv_heads = kv_heads;
  c.head_dim = 8, c.vocab_size = 71, c.max_position_embeddings = 64, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  return c;
}

using test::random_tokens;

std::vector<double> as_double(const Tensor& t) { return t.to_double_vector(); }

TEST(ClaLayout, GroupsOfSConsecutiveLayersTheFirstOfEachStoring) {
  const ClaLayout a = ClaLayout::groups_of(5, 2);
  EXPECT_EQ(a.storage, (std::vector<std::int64_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(a.storage_layers(), 3);  // ceil(5/2)
  std::vector<bool> stores;
  for (std::int64_t i = 0; i < 5; ++i) stores.push_back(a.stores(i));
  EXPECT_EQ(stores, (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(a.describe(), "layers 0-1 read 0, layers 2-3 read 1, layer 4 read 2");
  EXPECT_EQ(ClaLayout::groups_of(4, 3).storage, (std::vector<std::int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(ClaLayout::groups_of(3, 1).storage, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(ClaLayout::groups_of(6, 6).storage_layers(), 1);
  expect_error([] { ClaLayout::groups_of(4, 0); }, {"sharing factor", "[1, 4]", "0"});
  expect_error([] { ClaLayout::groups_of(4, 5); }, {"sharing factor", "5"});
  expect_error([&] { a.stores(5); }, {"no layer 5"});
}

// With s = 1 every layer stores: the shared cache is chapter 02's, and the forward pass computes
// exactly chapter 02's arithmetic (the same ops in the same order), so the logits are equal bit
// for bit, prefill and decode.
TEST(ClaTwoPath, ShareFactorOneIsChapterTwoBitForBit) {
  auto rng = test::rng_for_test();
  for (std::int64_t K : {6, 2}) {
    const auto c = small_config(3, K);
    const ClaModel m = models::cla::random_cla(c, 1, rng());
    const auto tokens = random_tokens(rng, 12, c.vocab_size);
    models::ContiguousKVCache plain(c, 16);
    SharedKVCache shared(c, m.layout, 16);
    EXPECT_EQ(shared.bytes(), plain.bytes());
    const std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 9);
    EXPECT_EQ(as_double(models::cla::forward_cached(m, shared, prompt, true)),
              as_double(models::forward_cached(m.base, plain, prompt, true)));
    for (std::size_t i = 9; i < tokens.size(); ++i)
      EXPECT_EQ(as_double(models::cla::forward_cached(m, shared, {tokens[i]})),
                as_double(models::forward_cached(m.base, plain, {tokens[i]})))
          << "K = " << K << ", decode step at position " << i;
    for (std::int64_t l = 0; l < c.num_layers; ++l)
      EXPECT_EQ(as_double(shared.storage().k(l)), as_double(plain.k(l))) << "layer " << l;
  }
}

struct Shape {
  std::int64_t layers, kv_heads, share;
};

class ClaShapes : public ::testing::TestWithParam<Shape> {};

// The cached path (prefill, then one token per step, every sharing layer reading its group's rows
// from the cache) against the simple one: every position's logits recomputed from scratch.
TEST_P(ClaShapes, CachedDecodeEqualsRecomputingEveryPosition) {
  const Shape s = GetParam();
  auto rng = test::rng_for_test();
  const auto c = small_config(s.layers, s.kv_heads);
  const ClaModel m = models::cla::random_cla(c, s.share, rng());
  const auto tokens = random_tokens(rng, 20, c.vocab_size);
  const auto want = as_double(models::cla::forward_recomputed(m, tokens));
  SharedKVCache cache(c, m.layout, 20);
  auto got = as_double(models::cla::forward_cached(m, cache, {tokens.begin(), tokens.begin() + 7}, true));
  for (std::size_t i = 7; i < tokens.size(); ++i) {
    const auto row = as_double(models::cla::forward_cached(m, cache, {tokens[i]}));
    got.insert(got.end(), row.begin(), row.end());
  }
  ASSERT_EQ(got.size(), want.size());
  const double bound = two_path_bound(c, want), worst = test::max_diff(got, want);
  EXPECT_LE(worst, bound) << "max |Δ logit| over " << want.size() << " logits";
  RecordProperty("worst_over_bound", std::to_string(worst / bound));
  EXPECT_EQ(cache.length(), 20);
  EXPECT_EQ(cache.storage().layers(), (s.layers + s.share - 1) / s.share);
}

// Sharing changes the function: a model whose layer 1 reads layer 0's keys is not the model
// whose layer 1 computes its own. (A test that the two paths agree could pass with sharing
// switched off; this one could not.)
TEST_P(ClaShapes, SharingChangesWhatTheSharingLayersSee) {
  const Shape s = GetParam();
  auto rng = test::rng_for_test();
  const auto c = small_config(s.layers, s.kv_heads);
  const models::Llama base = models::random_llama(c, rng());
  const auto tokens = random_tokens(rng, 9, c.vocab_size);
  const ClaModel shared = models::cla::share_kv(base, s.share), own = models::cla::share_kv(base, 1);
  const auto a = as_double(models::cla::forward_recomputed(shared, tokens)),
             b = as_double(models::cla::forward_recomputed(own, tokens));
  EXPECT_GT(test::max_diff(a, b), 100 * two_path_bound(c, b));
}

// A batch of sequences at different lengths, mixing a prefill chunk and decode tokens, gives each
// what it gets alone.
TEST_P(ClaShapes, ABatchGivesEachSequenceWhatItGetsAlone) {
  const Shape s = GetParam();
  auto rng = test::rng_for_test();
  const auto c = small_config(s.layers, s.kv_heads);
  const ClaModel m = models::cla::random_cla(c, s.share, rng());
  const auto a = random_tokens(rng, 11, c.vocab_size), b = random_tokens(rng, 5, c.vocab_size);
  SharedKVCache ca(c, m.layout, 16), cb(c, m.layout, 16), alone_a(c, m.layout, 16), alone_b(c, m.layout, 16);
  models::cla::forward_cached(m, ca, {a.begin(), a.begin() + 8});
  models::cla::forward_cached(m, alone_a, {a.begin(), a.begin() + 8});
  models::cla::forward_cached(m, cb, {b[0]});
  models::cla::forward_cached(m, alone_b, {b[0]});
  std::vector<models::SequenceStep> steps{{{a[8]}, &ca}, {{b.begin() + 1, b.end()}, &cb, true}};
  const auto got = as_double(models::cla::forward(m, steps));
  auto want = as_double(models::cla::forward_cached(m, alone_a, {a[8]}));
  const auto want_b = as_double(models::cla::forward_cached(m, alone_b, {b.begin() + 1, b.end()}, true));
  want.insert(want.end(), want_b.begin(), want_b.end());
  EXPECT_LE(test::max_diff(got, want), two_path_bound(c, want));
  EXPECT_EQ(ca.length(), 9);
  EXPECT_EQ(cb.length(), 5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ClaShapes,
                         ::testing::Values(Shape{4, 6, 2}, Shape{4, 6, 3}, Shape{5, 2, 2}, Shape{6, 1, 3}, Shape{3, 3, 3}),
                         [](const auto& info) {
  return "L" + std::to_string(info.param.layers) + "_K" + std::to_string(info.param.kv_heads) + "_s" +
         std::to_string(info.param.share);
});

TEST(SharedKVCache, TruncateRollsBackExactlyAndReleaseFreesIt) {
  auto rng = test::rng_for_test();
  const auto c = small_config(4, 2);
  const ClaModel m = models::cla::random_cla(c, 2, rng());
  const auto tokens = random_tokens(rng, 10, c.vocab_size);
  SharedKVCache cache(c, m.layout, 12), fresh(c, m.layout, 12);
  models::cla::forward_cached(m, cache, {tokens.begin(), tokens.begin() + 6});
  models::cla::forward_cached(m, cache, {tokens[6], tokens[7], tokens[8]});  // a speculative step ...
  cache.truncate(6);                                                         // ... rejected
  EXPECT_EQ(cache.length(), 6);
  models::cla::forward_cached(m, fresh, {tokens.begin(), tokens.begin() + 6});
  EXPECT_EQ(as_double(models::cla::forward_cached(m, cache, {tokens[9]})),
            as_double(models::cla::forward_cached(m, fresh, {tokens[9]})));
  expect_error([&] { cache.truncate(8); }, {"cannot truncate 7", "to 8"});
  cache.release();
  EXPECT_EQ(cache.bytes(), 0);
  EXPECT_EQ(cache.length(), 0);
}

// The cache's bytes: S × K × H × ceil(L/s) × 2 × bytes per element, and what it really allocates.
TEST(SharedKVCache, BytesEqualTheFormulaAndTheAllocation) {
  for (const Shape s : {Shape{4, 6, 2}, Shape{5, 2, 2}, Shape{4, 1, 3}, Shape{7, 3, 7}}) {
    const auto c = small_config(s.layers, s.kv_heads);
    const ClaLayout layout = ClaLayout::groups_of(s.layers, s.share);
    const std::int64_t capacity = 37, storing = (s.layers + s.share - 1) / s.share;
    const std::int64_t want = capacity * s.kv_heads * c.head_dim * storing * 2 * 4;
    EXPECT_EQ(models::cla::kv_cache_bytes(c, layout, capacity, 4), want);
    EXPECT_EQ(models::cla::kv_cache_bytes(c, layout, capacity, 2), want / 2);
    const SharedKVCache cache(c, layout, capacity);
    EXPECT_EQ(cache.bytes(), want);
    std::int64_t allocated = 0;
    for (std::int64_t l = 0; l < cache.storage().layers(); ++l)
      allocated += static_cast<std::int64_t>(cache.storage().k(l).nbytes() + cache.storage().v(l).nbytes());
    EXPECT_EQ(allocated, want) << "L = " << s.layers << ", s = " << s.share;
  }
}

// Parameters: the config's count less the sharing layers' K and V projections, as counted in the
// model's own tensors (random and bundled).
TEST(Cla, ParameterCountEqualsTheModelsTensors) {
  auto count = [](const ClaModel& m) {
    std::int64_t n = m.base.embed.numel() + m.base.final_norm.numel() + (m.base.tied() ? 0 : m.base.lm_head.weight.numel());
    for (const auto& l : m.base.layers) {
      n += l.attn_norm.numel() + l.mlp_norm.numel();
      for (const Linear* w : l.linears())
        if (w->defined()) n += w->weight.numel();
    }
    return n;
  };
  for (const Shape s : {Shape{4, 6, 2}, Shape{5, 2, 3}, Shape{3, 1, 1}}) {
    const auto c = small_config(s.layers, s.kv_heads);
    const ClaModel m = models::cla::random_cla(c, s.share, 1);
    const std::int64_t sharing = s.layers - (s.layers + s.share - 1) / s.share;
    EXPECT_EQ(models::cla::num_parameters(c, m.layout), count(m));
    EXPECT_EQ(models::cla::num_parameters(c, m.layout),
              c.num_parameters() - sharing * 2 * c.hidden_size * s.kv_heads * c.head_dim);
  }
  const ClaModel tiny = models::cla::load_cla(kData + "/models/tiny-cla");
  EXPECT_EQ(models::cla::num_parameters(tiny.config(), tiny.layout), count(tiny));
  EXPECT_EQ(count(tiny), 820352);  // the model card's count
}

TEST(SharedKVCache, MisuseIsRefusedByName) {
  auto rng = test::rng_for_test();
  const auto c = small_config(4, 2);
  const ClaModel m = models::cla::random_cla(c, 2, rng());
  SharedKVCache cache(c, m.layout, 8);
  const Tensor q = Tensor::zeros({1, 6, 8}, DType::F32), kv = Tensor::zeros({1, 2, 8}, DType::F32);
  Tensor out = Tensor::empty({1, 6, 8}, DType::F32);
  expect_error([&] { cache.attend(1, q, {}, {}, out); },
               {"layer 1 reads storage layer 0", "before its group's first layer"});
  expect_error([&] { cache.attend(1, q, kv, kv, out); }, {"layer 1 shares its group's keys and values", "bring none"});
  expect_error([&] { cache.attend(0, q, {}, {}, out); }, {"layer 0 is the first of its group"});
  expect_error([&] { cache.attend(4, q, kv, kv, out); }, {"no layer 4"});
  // A cache laid out for another sharing factor, or chapter 02's cache, in a CLA forward pass.
  SharedKVCache other(c, ClaLayout::groups_of(4, 4), 8);
  expect_error([&] { models::cla::forward_cached(m, other, {1}); }, {"laid out as layers 0-3 read 0", "layers 0-1 read 0"});
  models::ContiguousKVCache plain(c, 8);
  std::vector<models::SequenceStep> steps{{{1}, &plain}};
  // (a cache that knows the layers, as chapter 12's pool makes from the model's layer specs, may
  // serve; one that does not is refused at the first sharing layer, by name)
  expect_error([&] { models::cla::forward(m, steps); }, {"layer 1 brings no keys and values", "SharedKVCache"});
  // Chapter 02's forward pass on a model with sharing layers: its cache has no keys to keep.
  models::ContiguousKVCache c2(c, 8);
  expect_error([&] { models::forward_cached(m.base, c2, {1}); }, {"has no weight"});
}

// --- loading --------------------------------------------------------------------------------
// A copy of tiny-cla with its config edited and, optionally, a tensor added from layer 0.
std::string edited_tiny_cla(const test::TempDir& dir, const std::function<void(nlohmann::json&)>& edit,
                            const std::string& add_tensor = "") {
  namespace fs = std::filesystem;
  const std::string src = kData + "/models/tiny-cla", dst = dir.file("tiny-cla");
  fs::create_directories(dst);
  for (const char* f : {"tokenizer.json", "model.safetensors"}) fs::copy_file(src + "/" + f, dst + "/" + f);
  nlohmann::json cfg = load_json(src + "/config.json");
  edit(cfg);
  test::write_file(dst + "/config.json", cfg.dump(2));
  if (!add_tensor.empty()) {
    const SafetensorsFile st(src + "/model.safetensors");
    std::vector<std::pair<std::string, Tensor>> all;
    for (const auto& name : st.names()) all.emplace_back(name, st.get(name));
    all.emplace_back(add_tensor, st.get("model.layers.0.self_attn.k_proj.weight"));
    std::filesystem::remove(dst + "/model.safetensors");
    save_safetensors(dst + "/model.safetensors", all);
  }
  return dst;
}

TEST(Loading, TinyClaAndItsRefusals) {
  const ClaModel m = models::cla::load_cla(kData + "/models/tiny-cla");
  EXPECT_EQ(m.layout.share_factor, 2);
  EXPECT_EQ(m.layout.describe(), "layers 0-1 read 0, layers 2-3 read 1");
  EXPECT_FALSE(m.base.layers[1].wk.defined());
  EXPECT_TRUE(m.base.layers[2].wk.defined());
  // A Llama-family folder loads as s = 1.
  const ClaModel mha = models::cla::load_cla(kData + "/models/tiny-mha");
  EXPECT_EQ(mha.layout.storage_layers(), 4);

  test::TempDir dir;
  expect_error([&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) {
                       j["kv_producer_layers"] = {0, 1};
                     })); },
               {"kv_producer_layers", "[0,2]"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  // 2.5 used to be read as 2, and a string to end in the JSON library's own type error.
  expect_error([&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) {
                       j["kv_producer_layers"] = {0, 2.5};
                     })); },
               {"field 'kv_producer_layers' entry 1 must be an integer, got 2.5"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error([&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) {
                       j["kv_producer_layers"] = {"0", "2"};
                     })); },
               {"field 'kv_producer_layers' entry 0 must be an integer, got \"0\""});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error(
      [&] {
    models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) { j["kv_share_factor"] = 1, j.erase("kv_producer_layers"); }));
      },
      {"model.layers.1.self_attn.k_proj.weight"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error([&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) { j["kv_share_factor"] = 9; })); },
               {"kv_share_factor", "[1, 4]", "9"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error(
      [&] {
    models::cla::load_cla(edited_tiny_cla(
        dir, [](auto&) {}, "model.layers.3.self_attn.v_proj.weight"));
      },
      {"layer 3 has a v_proj", "reads layer 2"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error([&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) { j["causal"] = false; })); }, {"causal"});
  std::filesystem::remove_all(dir.file("tiny-cla"));
  expect_error(
      [&] { models::cla::load_cla(edited_tiny_cla(dir, [](auto& j) { j["architectures"] = {"MambaForCausalLM"}; })); },
      {"MambaForCausalLM", "neither"});
  expect_error([&] { models::cla::load_cla(dir.file("nothing")); }, {"no such file"});
}

// --- Character.AI's recipe ------------------------------------------------------------------
// Worked by hand for a 12-layer model (N = 8, K = 8, H = 64, bf16) at 8192 tokens, window 1024,
// one global layer in 6 (layers 0 and 6), K/V shared by 2.
TEST(CharacterAiRecipe, EveryStepIsTheFormulaWorkedByHand) {
  TransformerConfig c = small_config(12, 8);
  c.num_heads = 8, c.head_dim = 64, c.hidden_size = 512;
  const auto steps = models::cla::character_ai_recipe(c, 8192, 1024, 6, 2, 2);
  ASSERT_EQ(steps.size(), 4u);
  const std::int64_t row = 64 * 2 * 2;  // one KV head's K and V per token and layer, bf16
  EXPECT_EQ(steps[0].bytes, 12 * 8 * 8192 * row);
  EXPECT_EQ(steps[1].bytes, 12 * 8192 * row);
  EXPECT_EQ(steps[2].bytes, 2 * 8192 * row + 10 * 1024 * row);
  // Globals 0 and 6 share one storage layer; the two runs of 5 local layers need 3 each.
  EXPECT_EQ(steps[3].bytes, 1 * 8192 * row + 6 * 1024 * row);
  // A window longer than the context caps at the context.
  EXPECT_EQ(models::cla::character_ai_recipe(c, 512, 1024, 6, 1, 2)[2].bytes, 12 * 512 * row);
  expect_error([&] { models::cla::character_ai_recipe(c, 512, 0, 6, 1, 2); }, {"must be positive"});
}

}  // namespace
}  // namespace inferlab
