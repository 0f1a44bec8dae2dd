// Chapter 12's pool for every architecture the core loads (chapters/12_paged_attention/
// hybrid_cache.h): each request served by chapter 11's engine on the paged pool, under a budget
// tight enough to preempt, with parallel samples and a shared prefix, gets what it gets alone on
// the model's own contiguous cache (the same tokens; the logits within the two-path bound), and
// the pool is empty afterwards. Beside it: what each kind of layer costs in the pool.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "chapters/11_continuous_batching/engine.h"
#include "chapters/12_paged_attention/hybrid_cache.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/json_file.h"
#include "golden_util.h"
#include "test_util.h"

using namespace inferlab;
using namespace inferlab::ch12;
using models::LayerKind;

namespace {

const std::string kData = INFERLAB_DATA_DIR;

struct Arch {
  std::string name, path;  // the model file or folder
  std::string config;      // the folder whose config.json sizes the two-path bound
};

void PrintTo(const Arch& a, std::ostream* os) { *os << a.name; }

std::vector<Arch> archs() {
  std::vector<Arch> a;
  for (const char* z :
       {"tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-mla", "tiny-cla", "tiny-swa", "tiny-hybrid", "tiny-mamba", "tiny-lti"})
    a.push_back({z, kData + "/models/" + z, kData + "/models/" + z});
  const auto golden = [&](const std::string& name, const std::string& dir, bool gguf) {
    a.push_back({name, dir + (gguf ? "/model.gguf" : ""), dir});
  };
  const std::string family = kData + "/golden/family-random", moe = kData + "/golden/moe-random",
                    window = kData + "/golden/window-random";
  golden("qwen3_gqa", family + "/qwen3-gqa", false);
  golden("qwen3_gqa_gguf", family + "/qwen3-gqa", true);
  golden("gemma2_alternating", family + "/gemma2-alternating", false);
  golden("gemma3_pattern", family + "/gemma3-pattern", false);
  golden("gemma3_gguf", family + "/gemma3-gguf", true);
  golden("ministral_hybrid", window + "/ministral-hybrid", false);
  golden("mixtral", moe + "/mixtral", false);
  golden("qwen2_moe", moe + "/qwen2-moe", false);
  golden("deepseek_v2", moe + "/deepseek-v2-greedy", false);
  golden("deepseek_v3_gguf", moe + "/deepseek-v3-shared", true);
  return a;
}

// The two-path bound's sizes from a config.json (a Mamba config names them its own way).
TransformerConfig bound_config(const std::string& dir, std::int64_t positions) {
  const nlohmann::json j = load_json(dir + "/config.json");
  const auto get = [&](std::initializer_list<const char*> keys, std::int64_t otherwise) {
    for (const char* k : keys)
      if (j.contains(k) && j[k].is_number_integer()) return j[k].get<std::int64_t>();
    return otherwise;
  };
  TransformerConfig c;
  c.num_layers = get({"num_hidden_layers", "n_layer"}, 1);
  c.hidden_size = get({"hidden_size", "d_model"}, 1);
  c.intermediate_size = get({"intermediate_size", "moe_intermediate_size"}, 2 * c.hidden_size);
  c.max_position_embeddings = positions;
  return c;
}

struct Served {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// Sixteen requests of random tokens: 3 to 40 prompt tokens, four of them opening with the same 24
// (a prefix the pool can share), the odd ones sampled with their own seeds, two with n = 3; within
// the model's context (the random golden models have 64 positions: a third of it each).
std::vector<ch11::Request> requests_for(const models::Model& m) {
  std::mt19937_64 rng(20261207);
  const std::int64_t room = std::min<std::int64_t>(90, m.context().value_or(90)) - 1, third = room / 3;
  const auto prefix = test::random_tokens(rng, static_cast<std::size_t>(std::min<std::int64_t>(24, third)), m.vocab_size());
  std::vector<ch11::Request> out;
  for (int i = 0; i < 16; ++i) {
    ch11::Request r;
    r.id = i;
    r.prompt =
        test::random_tokens(rng, 3 + static_cast<std::size_t>((i * 13) % std::min<std::int64_t>(38, third)), m.vocab_size());
    if (i % 4 == 1) r.prompt.insert(r.prompt.begin(), prefix.begin(), prefix.end());
    r.max_new_tokens =
        static_cast<int>(std::min<std::int64_t>(6 + (i * 7) % 19, room - static_cast<std::int64_t>(r.prompt.size())));
    if (i % 2) r.sampling.temperature = 0.8f, r.sampling.seed = 100 + static_cast<std::uint64_t>(i);
    if (i == 3 || i == 6) r.samples = 3;
    r.sampling.vocab = m.vocab_size();
    r.arrival = static_cast<double>((i * 3) % 5);
    r.keep_logits = true;
    out.push_back(std::move(r));
  }
  return out;
}

class HybridPoolServes : public ::testing::TestWithParam<Arch> {};

TEST_P(HybridPoolServes, EveryRequestGetsWhatItGetsAloneAndThePoolEmpties) {
  const Arch& a = GetParam();
  if (!std::filesystem::exists(a.path)) GTEST_SKIP() << a.path << " is missing (tools/make_family_goldens.py)";
  const auto m = models::load_model(a.path);
  const auto requests = requests_for(*m);
  const PagedLayout layout = PagedLayout::of(*m);
  const std::int64_t B = 4, running = 8;
  // Room for about two of the longest requests' blocks besides the slots: a tight pool.
  std::int64_t longest = 0;
  for (const auto& r : requests)
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens);
  const std::int64_t blocks = layout.blocks.empty() ? 0 : 2 * ((longest + B - 1) / B) + 2;
  const std::int64_t slots = layout.fixed ? (layout.blocks.empty() ? 4 : running) : 0;
  PagedPool pool(*m, blocks * layout.block_bytes(B) + slots * layout.slot_bytes, B, !layout.fixed, running);
  EXPECT_EQ(pool.prefix_caching(), !layout.fixed);

  ch11::EngineConfig c;
  c.scheduler = {ch11::Policy::Continuous, running, 24};
  c.clock = ch11::Clock::Steps;
  ch11::Engine e(*m, pool, c);
  for (const auto& r : requests) e.add(r);
  std::int64_t most = 0;
  while (e.step()) {
    most = std::max(most, pool.used_bytes());
    ASSERT_LE(pool.used_bytes(), pool.budget_bytes());
    const auto by = pool.used_by_kind();
    ASSERT_EQ(std::accumulate(by.begin(), by.end(), std::int64_t{0}), pool.used_bytes()) << "the bytes of each kind add up";
  }
  if (!layout.blocks.empty()) {
    EXPECT_GT(e.scheduler().preemptions(), 0) << pool.describe() << ": the budget never ran out";
  }
  if (pool.prefix_caching()) {
    EXPECT_GT(pool.prefix_hits(), 0) << "the shared prefix was never found";
  }
  EXPECT_EQ(pool.used_bytes(), 0) << pool.describe();
  EXPECT_EQ(pool.slots_used(), 0);
  EXPECT_GT(most, 0);

  std::size_t seen = 0;
  for (const auto& s : e.finished()) {
    ch11::Request alone = requests[static_cast<std::size_t>(s->request.id)];
    alone.samples = 1, alone.sampling.seed += static_cast<std::uint64_t>(s->index);
    const ch11::Sequence want = ch11::run_alone(*m, alone);
    ASSERT_EQ(s->tokens, want.tokens) << a.name << ", request " << s->request.id << " sample " << s->index;
    ASSERT_EQ(s->logits.size(), want.logits.size());
    for (std::size_t t = 0; t < want.logits.size(); ++t) {
      const std::vector<double> w(want.logits[t].begin(), want.logits[t].end());
      const double bound = test::two_path_bound(bound_config(a.config, static_cast<std::int64_t>(want.tokens.size())), w);
      for (std::size_t v = 0; v < w.size(); ++v)
        ASSERT_NEAR(s->logits[t][v], w[v], bound) << a.name << ", request " << s->request.id << ", token " << t;
    }
    ++seen;
  }
  EXPECT_EQ(seen, 16u + 2 * 2) << "every request and every parallel sample finished";
}

INSTANTIATE_TEST_SUITE_P(EveryArchitecture, HybridPoolServes, ::testing::ValuesIn(archs()), [](const auto& info) {
  std::string n = info.param.name;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

const models::Model& bundled(const std::string& name) {
  static std::map<std::string, std::unique_ptr<models::Model>> loaded;
  auto& m = loaded[name];
  if (!m) m = models::load_model(kData + "/models/" + name);
  return *m;
}

std::int64_t count(const models::Model& m, LayerKind k) {
  std::int64_t n = 0;
  for (const auto& s : m.layers()) n += s.kind == k;
  return n;
}

}  // namespace

// What a sequence costs in the pool, kind by kind: attention K and V rows per position; an MLA
// position its latent row alone; a CLA layer that reads another's nothing; a window its ring,
// once, whatever the length; a Mamba sequence one slot.
TEST(HybridPool, EachKindOfLayerCostsWhatItKeeps) {
  const std::int64_t B = 16, n = 1000;
  const auto blocks_for = [&](std::int64_t positions) { return (positions + B - 1) / B; };
  {
    const auto& m = bundled("tiny-mha");
    const PagedLayout L = PagedLayout::of(m);
    EXPECT_TRUE(L.plain);
    EXPECT_EQ(L.block_bytes(B), B * 4 * 2 * 8 * 16 * 4) << "4 layers of 8 KV heads of 16, K and V, f32";
  }
  {
    const auto& m = bundled("tiny-mla");
    const PagedLayout L = PagedLayout::of(m);
    const std::int64_t R = m.layers()[0].rows[0][1];  // r + dr
    EXPECT_EQ(R, 32 + 8) << "kv_lora_rank 32 and a rotary part of 8";
    EXPECT_EQ(L.block_bytes(B), B * 4 * R * 4) << "one latent row a position and layer: no heads, no V";
    const PagedPool pool(m, 64 << 20, B);
    EXPECT_EQ(pool.bytes_for(n), blocks_for(n) * B * 4 * R * 4);
  }
  {
    const auto& m = bundled("tiny-cla");
    const PagedLayout L = PagedLayout::of(m);
    const std::int64_t storing = count(m, LayerKind::Attention);
    EXPECT_EQ(storing + count(m, LayerKind::Shared), 4);
    EXPECT_GT(count(m, LayerKind::Shared), 0);
    EXPECT_EQ(L.block_bytes(B), B * storing * 2 * 8 * 16 * 4) << "a sharing layer keeps no rows";
  }
  {
    const auto& m = bundled("tiny-hybrid");  // 3 window layers (W = 64), 1 global
    const PagedLayout L = PagedLayout::of(m);
    EXPECT_EQ(L.slot_bytes, 3 * 2 * 64 * 8 * 16 * 4) << "a ring of W rows, K and V, per window layer";
    EXPECT_EQ(L.block_bytes(B), B * 1 * 2 * 8 * 16 * 4) << "only the global layer's rows in blocks";
    const PagedPool pool(m, 64 << 20, B, false, 8);
    EXPECT_EQ(pool.bytes_for(10 * 64) - pool.bytes_for(64), (blocks_for(640) - blocks_for(64)) * L.block_bytes(B))
        << "past the window only the global layer grows";
    EXPECT_THROW(PagedPool(m, 64 << 20, B, true, 8), Error) << "prefix caching with rings is refused";
    try {
      PagedPool(m, 64 << 20, B, true, 8);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("prefix caching"), std::string::npos) << e.what();
    }
  }
  {
    const auto& m = bundled("tiny-swa");  // every layer a window: slots alone
    const PagedPool pool(m, 4 << 20, B);
    EXPECT_FALSE(pool.has_blocks());
    EXPECT_EQ(pool.bytes_for(1), pool.bytes_for(100000)) << "a window's cost stops at the window";
  }
  {
    const auto& m = bundled("tiny-mamba");
    const PagedPool pool(m, 1 << 20, B);
    EXPECT_FALSE(pool.has_blocks());
    EXPECT_EQ(pool.bytes_for(1), pool.bytes_for(1000000)) << "a state's cost is constant";
    EXPECT_EQ(pool.slots_total(), (1 << 20) / pool.slot_bytes()) << "a pool of states: as many slots as the budget holds";
    EXPECT_EQ(pool.slot_bytes(), m.cache_bytes(0));
  }
}

// Parallel samples share the prompt on every kind of model: its positions go through the model once
// (the forks share its blocks and copy the slot), not once a sample.
TEST(HybridPool, ParallelSamplesComputeThePromptOnce) {
  for (const char* name : {"tiny-mha", "tiny-mla", "tiny-cla", "tiny-hybrid", "tiny-mamba"}) {
    const auto& m = bundled(name);
    ch12::PagedPool pool(m, 16 << 20, 16, false, 8);
    ch11::EngineConfig c;
    c.scheduler = {ch11::Policy::Continuous, 8, 64};
    c.clock = ch11::Clock::Steps;
    ch11::Engine e(m, pool, c);
    ch11::Request r;
    r.prompt.assign(37, 5);
    r.max_new_tokens = 4, r.samples = 3;
    r.sampling.temperature = 0.8f, r.sampling.seed = 9, r.sampling.vocab = m.vocab_size();
    e.add(r);
    e.run();
    std::int64_t prefill = 0;
    for (const auto& s : e.steps()) prefill += s.prefill_tokens;
    EXPECT_EQ(prefill, 37) << name << ": a fork computed the prompt again";
    EXPECT_EQ(e.finished().size(), 3u) << name;
    EXPECT_EQ(pool.used_bytes(), 0) << name;
  }
}

// A budget that cannot hold the slots the running sequences need is refused by name, as is one
// that leaves no block beside them.
TEST(HybridPool, ABudgetTooSmallForItsSlotsIsRefused) {
  const auto& m = bundled("tiny-hybrid");
  const PagedLayout L = PagedLayout::of(m);
  try {
    PagedPool(m, 3 * L.slot_bytes, 16, false, 8);
    FAIL() << "8 slots in the room of 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slots of"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PagedPool(m, 8 * L.slot_bytes, 16, false, 8), Error) << "no room left for a block";
}
