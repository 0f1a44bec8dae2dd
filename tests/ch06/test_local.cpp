// Chapter 06: local attention. Two paths (the ring equals full attention when the window covers
// the sequence, the masked simple way once it wraps, and a per-query gather with sinks); an
// all-global stack is chapter 02 bit for bit; the cache bytes formula; rollback; loading.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/models/local.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
using models::local::LocalLayout;
using models::local::LocalModel;
using models::local::MaskedKVCache;
using models::local::RingKVCache;
using test::expect_error;
using test::random_tokens;
using test::two_path_bound;

TransformerConfig small_config(std::int64_t layers, std::int64_t kv_heads = 2) {
  TransformerConfig c;
  c.architecture = "MinistralForCausalLM";
  c.hidden_size = 48, c.intermediate_size = 96, c.num_layers = layers, c.num_heads = 6, c.num_kv_heads = kv_heads;
  c.head_dim = 8, c.vocab_size = 71, c.max_position_embeddings = 128, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  return c;
}

std::vector<double> as_double(const Tensor& t) { return t.to_double_vector(); }

// Feeds `chunks` (token counts) of `tokens` through a cache; the logits of every fed position.
std::vector<double> feed(const models::Llama& m, models::KVCache& cache, const std::vector<std::int32_t>& tokens,
                         const std::vector<std::size_t>& chunks) {
  std::vector<double> out;
  std::size_t at = 0;
  for (std::size_t n : chunks) {
    EXPECT_LE(at + n, tokens.size()) << "the chunks ask for more tokens than the test drew";
    if (at + n > tokens.size()) break;
    const std::vector<std::int32_t> part(tokens.begin() + static_cast<long>(at), tokens.begin() + static_cast<long>(at + n));
    const auto l = as_double(models::forward_cached(m, cache, part, true));
    out.insert(out.end(), l.begin(), l.end());
    at += n;
  }
  return out;
}

TEST(LocalLayout, WindowsRowsAndReach) {
  const LocalLayout h = LocalLayout::hybrid(8, 64, 4);
  EXPECT_EQ(h.window, (std::vector<std::int64_t>{64, 64, 64, 0, 64, 64, 64, 0}));
  EXPECT_EQ(h.locals(), 6);
  EXPECT_EQ(h.globals(), 2);
  EXPECT_EQ(h.rows(0, 1000), 64);
  EXPECT_EQ(h.rows(0, 10), 10);
  EXPECT_EQ(h.rows(3, 1000), 1000);
  EXPECT_EQ(h.describe(), "layers 0-2 local (W = 64), layer 3 global, layers 4-6 local (W = 64), layer 7 global");
  EXPECT_EQ(h.receptive_field(), -1);
  EXPECT_EQ(LocalLayout::local(4, 64).receptive_field(), 4 * 63 + 1);  // tiny-swa's 253
  LocalLayout s = LocalLayout::local(2, 8);
  s.sinks = 4;
  EXPECT_EQ(s.rows(0, 100), 12);
  EXPECT_EQ(s.describe(), "layers 0-1 local (W = 8), 4 sink positions");
  expect_error([] { LocalLayout::local(2, 0); }, {"window must be positive"});
}

// The lecture's "effective context grows linearly with the layers", exactly: the token d back
// reaches the last position through some chain of windows iff d < L × (W − 1) + 1.
TEST(LocalLayout, ATokenReachesTheLastPositionExactlyWithinTheReceptiveField) {
  auto rng = test::rng_for_test();
  const auto c = small_config(3);
  const models::Llama base = models::random_llama(c, rng());
  const auto tokens = random_tokens(rng, 24, 60);  // ids 60 .. 70 unused: room for the poisoned one
  for (const LocalLayout& l : {LocalLayout::local(3, 4), LocalLayout::local(3, 1), LocalLayout::hybrid(3, 4, 3)}) {
    const LocalModel m{base, l};
    const std::int64_t field = l.receptive_field();
    for (std::int64_t d = 0; d < 24; ++d)
      EXPECT_EQ(models::local::reaches(m, tokens, d), field < 0 || d < field) << l.describe() << ", d = " << d;
  }
}

TEST(RingKVCache, SlotsWrapAfterTheSinks) {
  LocalLayout l = LocalLayout::hybrid(2, 4, 2);
  l.sinks = 2;
  const RingKVCache cache(small_config(2), l, 100);
  std::vector<std::int64_t> slots;
  for (std::int64_t p = 0; p < 12; ++p) slots.push_back(cache.slot(0, p));
  EXPECT_EQ(slots, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3}));
  EXPECT_EQ(cache.slot(1, 57), 57);  // the global layer
  EXPECT_EQ(cache.k(0).size(0), 6);
  EXPECT_EQ(cache.k(1).size(0), 100);
}

// A window at least as long as the sequence: nothing is ever overwritten, and the ring computes
// exactly chapter 02's attention, prefill and decode, bit for bit.
TEST(LocalTwoPath, AWindowCoveringTheSequenceIsChapterTwoBitForBit) {
  auto rng = test::rng_for_test();
  const auto c = small_config(3);
  const models::Llama m = models::random_llama(c, rng());
  const auto tokens = random_tokens(rng, 20, c.vocab_size);
  models::ContiguousKVCache plain(c, 20);
  RingKVCache ring(c, LocalLayout::local(3, 20), 20), global(c, LocalLayout::global(3), 20);
  const std::vector<std::size_t> chunks = {7, 1, 1, 5, 1, 1, 1, 1, 1, 1};
  const auto want = feed(m, plain, tokens, chunks);
  EXPECT_EQ(feed(m, ring, tokens, chunks), want);
  EXPECT_EQ(feed(m, global, tokens, chunks), want) << "an all-global stack is the dense model";
}

struct Case {
  std::vector<std::int64_t> windows;
  std::vector<std::size_t> chunks;  // prefill, then decode steps or chunks
  std::string name;
};

class RingShapes : public ::testing::TestWithParam<Case> {};

// Past the window the ring wraps (several times here); its logits must equal the simple way's,
// which keeps every position and masks the window in the attention op.
TEST_P(RingShapes, RingEqualsMaskedFullAttentionPastTheWindow) {
  const Case& cs = GetParam();
  auto rng = test::rng_for_test();
  const auto c = small_config(static_cast<std::int64_t>(cs.windows.size()));
  const models::Llama m = models::random_llama(c, rng());
  LocalLayout layout;
  layout.window = cs.windows;
  std::size_t n = 0;
  for (std::size_t k : cs.chunks) n += k;
  const auto tokens = random_tokens(rng, n, c.vocab_size);
  RingKVCache ring(c, layout, static_cast<std::int64_t>(n));
  MaskedKVCache masked(c, layout, static_cast<std::int64_t>(n));
  const auto want = feed(m, masked, tokens, cs.chunks), got = feed(m, ring, tokens, cs.chunks);
  const double bound = two_path_bound(c, want), worst = test::max_diff(got, want);
  EXPECT_LE(worst, bound) << "max |Δ logit| over " << want.size() << " logits";
  RecordProperty("worst_over_bound", std::to_string(worst / bound));
  EXPECT_LT(ring.bytes(), masked.bytes());
  // And the windows matter: the dense model differs.
  models::ContiguousKVCache dense(c, static_cast<std::int64_t>(n));
  EXPECT_GT(test::max_diff(feed(m, dense, tokens, cs.chunks), want), 100 * bound);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RingShapes,
                         ::testing::Values(Case{{5, 5},
                                                {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                "decode_wraps_four_times"},
                                           Case{{4, 0, 4}, {2, 9, 1, 1, 7, 1, 1}, "hybrid_chunks_that_wrap"},
                                           Case{{7, 3}, {30}, "one_prefill_far_past_both_windows"},
                                           Case{{1, 6}, {5, 1, 1, 4, 1}, "a_window_of_one"}),
                         [](const auto& info) { return info.param.name; });

// Sinks (StreamingLLM): a query sees positions 0 .. sinks-1 and its window. The simple way for
// them: every position kept, each query's visible rows gathered and attended over.
class GatheredSinkCache : public models::ContiguousKVCache {
 public:
  GatheredSinkCache(const TransformerConfig& c, std::int64_t W, std::int64_t sinks, std::int64_t capacity)
      : ContiguousKVCache(c, capacity), W_(W), sinks_(sinks) {}
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override {
    const std::int64_t start = length_, end = end_of_step(k.size(0));
    Tensor K = ContiguousKVCache::k(layer), V = ContiguousKVCache::v(layer);
    K.slice(0, start, end).copy_from(k);
    V.slice(0, start, end).copy_from(v);
    for (std::int64_t t = 0; t < q.size(0); ++t) {
      const std::int64_t p = start + t;
      std::vector<std::int64_t> rows;
      for (std::int64_t j = 0; j <= p; ++j)
        if (j < sinks_ || j > p - W_) rows.push_back(j);
      Tensor gk = Tensor::empty({static_cast<std::int64_t>(rows.size()), K.size(1), K.size(2)}, DType::F32), gv = gk.clone();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto r = static_cast<std::int64_t>(i);
        gk.slice(0, r, r + 1).copy_from(K.slice(0, rows[i], rows[i] + 1));
        gv.slice(0, r, r + 1).copy_from(V.slice(0, rows[i], rows[i] + 1));
      }
      AttentionParams prm;
      prm.causal = false;
      Tensor o = out.slice(0, t, t + 1);
      ops::attention(q.slice(0, t, t + 1), gk, gv, o, prm);
    }
  }

 private:
  std::int64_t W_, sinks_;
};

TEST(RingKVCache, SinksAreKeptBesideTheWindow) {
  auto rng = test::rng_for_test();
  const auto c = small_config(2);
  const models::Llama m = models::random_llama(c, rng());
  std::vector<std::size_t> chunks = {4, 1, 1, 1, 8};  // then 18 decode steps: the ring of 6 wraps three times
  chunks.resize(chunks.size() + 18, 1);
  const auto tokens = random_tokens(rng, 33, c.vocab_size);
  LocalLayout layout = LocalLayout::local(2, 6);
  layout.sinks = 3;
  RingKVCache ring(c, layout, 33);
  GatheredSinkCache gathered(c, 6, 3, 33);
  const auto want = feed(m, gathered, tokens, chunks), got = feed(m, ring, tokens, chunks);
  EXPECT_LE(test::max_diff(got, want), two_path_bound(c, want));
  EXPECT_EQ(ring.k(0).size(0), 9);  // 3 sinks + a window of 6
  expect_error([&] { MaskedKVCache(c, layout, 8); }, {"sink positions"});
}

// The cache's bytes: n_global × T + n_local × min(T, sinks + W) rows of K × H × 2 × b, and what
// it allocates.
TEST(RingKVCache, BytesEqualTheFormulaAndTheAllocation) {
  const auto c = small_config(8, 2);
  for (std::int64_t T : {1, 10, 64, 65, 300}) {
    LocalLayout l = LocalLayout::hybrid(8, 64, 4);
    const std::int64_t row = 2 * 8 * 2 * 4;  // K × H × {K, V} × f32
    EXPECT_EQ(models::local::kv_cache_bytes(c, l, T, 4), (2 * T + 6 * std::min<std::int64_t>(T, 64)) * row) << "T = " << T;
    l.sinks = 4;
    EXPECT_EQ(models::local::kv_cache_bytes(c, l, T, 4), (2 * T + 6 * std::min<std::int64_t>(T, 68)) * row) << "T = " << T;
    const RingKVCache cache(c, l, T);
    std::int64_t allocated = 0;
    for (std::int64_t i = 0; i < 8; ++i) allocated += static_cast<std::int64_t>(cache.k(i).nbytes() + cache.v(i).nbytes());
    EXPECT_EQ(cache.bytes(), allocated);
    EXPECT_EQ(cache.bytes(), models::local::kv_cache_bytes(c, l, T, 4));
  }
}

// A full ring has overwritten what lies before its window: one position can be rolled back
// (its slot held the position the query no longer sees), two cannot.
TEST(RingKVCache, RollbackOfAFullRingIsOnePositionAtMost) {
  auto rng = test::rng_for_test();
  const auto c = small_config(2);
  const models::Llama m = models::random_llama(c, rng());
  const auto tokens = random_tokens(rng, 20, c.vocab_size);
  const LocalLayout layout = LocalLayout::local(2, 5);
  RingKVCache ring(c, layout, 20), fresh(c, layout, 20);
  feed(m, ring, tokens, {12, 1});  // 13 positions: wrapped
  ring.truncate(12);
  feed(m, fresh, tokens, {12});
  const std::vector<std::int32_t> next{tokens[15]};
  EXPECT_EQ(as_double(models::forward_cached(m, ring, next)), as_double(models::forward_cached(m, fresh, next)));
  expect_error([&] { ring.truncate(11); }, {"layer 0 keeps only its last 5 positions", "rolling back from 13 to 11",
                                            "needs positions 7 .. 7", "already overwritten"});
  // Before the ring wraps, any rollback is fine.
  RingKVCache young(c, layout, 20);
  feed(m, young, tokens, {5});
  EXPECT_NO_THROW(young.truncate(1));
  young.release();
  EXPECT_EQ(young.bytes(), 0);
}

// --- loading --------------------------------------------------------------------------------
HfConfig config_with(const std::string& arch, const nlohmann::json& fields) {
  HfConfig hf;
  hf.path = "config.json";
  hf.json = {{"architectures", {arch}}};
  if (!fields.is_null()) hf.json.update(fields);
  return hf;
}

TEST(Loading, WindowsAsTransformersReadsThem) {
  auto windows = [](const HfConfig& hf, std::int64_t L) { return models::local::parse_local_layout(hf, L).window; };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(windows(config_with("MistralForCausalLM", {{"sliding_window", 4096}}), 2), (V{4096, 4096}));
  EXPECT_EQ(windows(config_with("MistralForCausalLM", {{"sliding_window", nullptr}}), 2), (V{0, 0}));
  EXPECT_EQ(windows(config_with("MistralForCausalLM",
                                {{"sliding_window", 8}, {"layer_types", {"full_attention", "full_attention"}}}),
                    2),
            (V{8, 8}))
      << "transformers' Mistral ignores layer_types";
  EXPECT_EQ(windows(config_with("MinistralForCausalLM", {{"sliding_window", 8}}), 2), (V{8, 8}));
  EXPECT_EQ(windows(config_with("MinistralForCausalLM",
                                {{"sliding_window", 8}, {"layer_types", {"sliding_attention", "full_attention"}}}),
                    2),
            (V{8, 0}));
  EXPECT_EQ(windows(config_with("Qwen2ForCausalLM", {{"sliding_window", 8}, {"use_sliding_window", false}}), 3),
            (V{0, 0, 0}));
  EXPECT_EQ(windows(config_with("Qwen2ForCausalLM",
                                {{"sliding_window", 8}, {"use_sliding_window", true}, {"max_window_layers", 1}}),
                    3),
            (V{0, 8, 8}));
  EXPECT_EQ(windows(config_with("Qwen2ForCausalLM", {{"sliding_window", 8}, {"use_sliding_window", true}}), 3), (V{0, 0, 0}))
      << "max_window_layers defaults to 28: the first 28 layers are global";
  EXPECT_EQ(windows(config_with("LlamaForCausalLM", {{"sliding_window", 8}}), 2), (V{0, 0}));
  expect_error(
      [&] {
    windows(config_with("MinistralForCausalLM", {{"sliding_window", 8}, {"layer_types", {"sliding_attention"}}}), 2);
      },
      {"'layer_types' has 1 entries for 2 layers"});
  expect_error(
      [&] {
    windows(config_with("MinistralForCausalLM", {{"sliding_window", 8}, {"layer_types", {"local", "full_attention"}}}), 2);
      },
      {"entry 0 is 'local'"});
  expect_error(
      [&] {
    windows(
        config_with("Qwen2ForCausalLM", {{"sliding_window", 8}, {"layer_types", {"sliding_attention", "full_attention"}}}),
        2);
      },
      {"layer 0 is 'sliding_attention' but the config sets no sliding_window", "use_sliding_window"});
  expect_error(
      [&] {
    windows(config_with("MistralForCausalLM", {{"sliding_window", 0}}), 2);
      },
      {"'sliding_window' must be a positive"});
  expect_error([&] { windows(config_with("MistralForCausalLM", {{"sliding_window", "64"}}), 2); }, {"sliding_window"});
  // Entries of the wrong type are named, not left to the JSON library's own type error.
  expect_error(
      [&] {
    windows(config_with("MinistralForCausalLM", {{"sliding_window", 8}, {"layer_types", {1, 0}}}), 2);
      },
      {"field 'layer_types' entry 0 must be a string, got 1"});
  expect_error(
      [&] {
    windows(config_with("MinistralForCausalLM", {{"sliding_window", 8}, {"layer_types", 5}}), 2);
      },
      {"field 'layer_types' must be a list, got 5"});
  expect_error([&] { windows(config_with("MambaForCausalLM", {}), 2); }, {"MambaForCausalLM", "not one chapter 06 runs"});
}

TEST(Loading, TheZoosWindowModels) {
  const LocalModel swa = models::local::load_local(kData + "/models/tiny-swa");
  EXPECT_EQ(swa.layout.describe(), "layers 0-3 local (W = 64)");
  EXPECT_EQ(swa.layout.receptive_field(), 253);
  const LocalModel hybrid = models::local::load_local(kData + "/models/tiny-hybrid");
  EXPECT_EQ(hybrid.layout.describe(), "layers 0-2 local (W = 64), layer 3 global");
  EXPECT_EQ(models::local::load_local(kData + "/models/tiny-mha").layout.locals(), 0);
  // Chapter 01 refuses what it would run wrongly, and says where it runs.
  expect_error([&] { models::load_llama(kData + "/golden/window-random/mistral-w7"); }, {"sliding window", "chapter 06"});
  expect_error([&] { models::load_llama(kData + "/golden/window-random/qwen2-window"); },
               {"use_sliding_window", "chapter 06"});
  EXPECT_NO_THROW(models::load_llama(kData + "/golden/window-random/mistral-null"));
  expect_error([&] { models::local::load_local(kData + "/nothing"); }, {"no such file"});
}

}  // namespace
}  // namespace inferlab
