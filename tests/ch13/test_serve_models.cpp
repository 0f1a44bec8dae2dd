// Chapter 13's server on every kind of model the core loads: the zoo's CLA, MLA, window, hybrid
// and Mamba models, and GGUF files of Gemma 3 (local and global layers, Gemma's scale), DeepSeek-V3
// (MLA with MoE) and Qwen3. Sixteen clients at once, streamed and not, greedy and seeded, parallel
// samples and a shared prefix, in a pool tight enough to preempt: each gets the text it gets
// alone, and the pool's blocks and slots come back. /metrics counts the bytes each kind of layer
// holds, as the pool does.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "chapters/12_paged_attention/hybrid_cache.h"
#include "chapters/13_serving/client.h"
#include "chapters/13_serving/demo.h"
#include "chapters/13_serving/server.h"
#include "common/json_file.h"
#include "golden_util.h"
#include "test_util.h"

using namespace inferlab;
using namespace inferlab::ch13;
using nlohmann::json;

namespace {

const std::string kData = INFERLAB_DATA_DIR;

struct Served {
  std::string name, path;
};

void PrintTo(const Served& s, std::ostream* os) { *os << s.name; }

std::vector<Served> served_models() {
  std::vector<Served> a;
  for (const char* z : {"tiny-cla", "tiny-mla", "tiny-swa", "tiny-hybrid", "tiny-mamba"})
    a.push_back({z, kData + "/models/" + z});
  a.push_back({"gemma3_gguf", kData + "/golden/family-random/gemma3-gguf/model.gguf"});
  a.push_back({"deepseek_v3_gguf", kData + "/golden/moe-random/deepseek-v3-shared/model.gguf"});
  a.push_back({"qwen3_gguf", kData + "/golden/family-random/qwen3-gqa/model.gguf"});
  return a;
}

// The random golden models ship no tokenizer: tiny-mha's byte-level one, cut to their vocabulary
// (its first ids are the two specials and single bytes, so every id still decodes).
std::unique_ptr<Tokenizer> tokenizer_for(const models::Model& m) {
  if (std::filesystem::exists(std::filesystem::path(m.source()) / "tokenizer.json")) return Tokenizer::load(m.source());
  json j = load_json(kData + "/models/tiny-mha/tokenizer.json");
  const std::int64_t V = m.vocab_size();
  json vocab = json::object();
  for (const auto& [k, v] : j["model"]["vocab"].items())
    if (v.get<std::int64_t>() < V) vocab[k] = v;
  json merges = json::array();
  for (const auto& mg : j["model"]["merges"]) {
    const std::string a =
        mg.is_array() ? mg[0].get<std::string>() : mg.get<std::string>().substr(0, mg.get<std::string>().find(' '));
    const std::string b =
        mg.is_array() ? mg[1].get<std::string>() : mg.get<std::string>().substr(mg.get<std::string>().find(' ') + 1);
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(mg);
  }
  j["model"]["vocab"] = vocab, j["model"]["merges"] = merges;
  return std::make_unique<HfTokenizer>(HfTokenizer::from_json(j, "tiny-mha's, cut to " + std::to_string(V)));
}

class ServedModel : public ::testing::TestWithParam<Served> {};

TEST_P(ServedModel, SixteenClientsGetWhatTheyGetAloneAndThePoolEmpties) {
  const Served& p = GetParam();
  if (!std::filesystem::exists(p.path)) GTEST_SKIP() << p.path << " is missing (tools/make_family_goldens.py)";
  const auto m = models::load_model(p.path);
  const auto tok = tokenizer_for(*m);
  const std::vector<std::int64_t> eos = models::stop_ids(*m);
  const ch12::PagedLayout layout = ch12::PagedLayout::of(*m);
  ServerConfig c;
  c.scheduler = {ch11::Policy::Continuous, 6, 32};
  c.block_size = 4;
  c.kv_budget_bytes = 6 * layout.slot_bytes + 24 * layout.block_bytes(c.block_size);  // tight where blocks grow
  Server server(*m, *tok, eos, c);
  EXPECT_EQ(server.prefix_caching(), !layout.fixed) << "prefix caching off exactly where a slot cannot share one";
  FrontEnd f;
  f.model_name = p.name;
  f.chat_template_problem = p.name + " ships none";
  const Listening live(server, f);

  std::mt19937_64 rng(7);
  const std::int64_t vocab = std::min<std::int64_t>(tok->vocab_size(), m->vocab_size());  // ids both know
  const std::int64_t room = std::min<std::int64_t>(80, m->context().value_or(80)) - 1;
  const auto prefix = test::random_tokens(rng, 12, vocab);
  struct Ask {
    std::vector<std::int32_t> prompt;
    int max_tokens, n;
    double temperature;
    std::uint64_t seed;
    bool stream;
  };
  std::vector<Ask> asks;
  for (int i = 0; i < 16; ++i) {
    auto prompt = test::random_tokens(rng, 2 + static_cast<std::size_t>((i * 7) % 20), vocab);
    if (i % 4 == 0) prompt.insert(prompt.begin(), prefix.begin(), prefix.end());
    const int max_tokens =
        static_cast<int>(std::min<std::int64_t>(4 + (i * 5) % 17, room - static_cast<std::int64_t>(prompt.size())));
    asks.push_back(
        {prompt, max_tokens, i == 5 ? 3 : 1, i % 3 == 0 ? 0.0 : 0.8, static_cast<std::uint64_t>(40 + i), i % 2 == 0});
  }
  std::vector<std::vector<std::string>> got(asks.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < asks.size(); ++i)
    clients.emplace_back([&, i] {
      const Ask& a = asks[i];
      const json body = {
          {"prompt", a.prompt}, {"max_tokens", a.max_tokens}, {"temperature", a.temperature}, {"seed", a.seed}, {"n", a.n}};
      if (a.stream) {
        const Streamed s = stream("127.0.0.1", live.port(), "/v1/completions", body);
        ASSERT_EQ(s.status, 200) << s.body;
        got[i] = s.text;
      } else {
        const auto [status, r] = post("127.0.0.1", live.port(), "/v1/completions", body);
        ASSERT_EQ(status, 200) << r.dump();
        for (const json& ch : r["choices"]) got[i].push_back(ch["text"]);
      }
    });
  for (auto& t : clients) t.join();
  for (std::size_t i = 0; i < asks.size(); ++i) {
    const Ask& a = asks[i];
    ASSERT_EQ(got[i].size(), static_cast<std::size_t>(a.n)) << "request " << i;
    for (int k = 0; k < a.n; ++k) {
      ch11::Request r;
      r.prompt = a.prompt, r.max_new_tokens = a.max_tokens;
      r.sampling.temperature = static_cast<float>(a.temperature), r.sampling.seed = a.seed + static_cast<std::uint64_t>(k);
      r.sampling.vocab = vocab;
      r.stop_ids = eos;
      const ch11::Sequence s = ch11::run_alone(*m, r);
      OutputText out(*tok, a.prompt, {});
      EXPECT_EQ(got[i][static_cast<std::size_t>(k)], out.update(s.tokens, true))
          << p.name << ", request " << i << ", sample " << k;
    }
  }
  EXPECT_TRUE(test::eventually([&] {
    const Gauges g = server.gauges();
    return g.blocks_used == 0 && g.slots_used == 0 && g.in_flight == 0;
  })) << server.metrics();
}

INSTANTIATE_TEST_SUITE_P(EveryKindOfModel, ServedModel, ::testing::ValuesIn(served_models()), [](const auto& info) {
  std::string n = info.param.name;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

// /metrics gives the bytes each kind of layer holds, as the pool counts them: a hybrid model's
// global layer in blocks, its window layers' rings in one slot, while a long request runs.
TEST(ServedModel, TheMetricsCountTheBytesOfEachKindOfLayer) {
  const auto m = models::load_model(kData + "/models/tiny-hybrid");
  const auto tok = Tokenizer::load(kData + "/models/tiny-hybrid");
  ServerConfig c;
  c.scheduler = {ch11::Policy::Continuous, 4, 32};
  std::atomic<const Server*> srv{nullptr};
  std::string mid;
  std::vector<std::int64_t> by;
  std::int64_t slots = -1, blocks = -1;
  c.after_step = [&](const ch11::Engine&) {  // on the engine thread, the gauges just published
    const Server* s = srv.load();
    if (!mid.empty() || !s || s->pool().blocks_used() < 4) return;
    mid = s->metrics(), by = s->pool().used_by_kind(), slots = s->pool().slots_used(), blocks = s->pool().blocks_used();
  };
  Server server(*m, *tok, {}, c);  // no EOS: it runs to max_tokens
  srv = &server;
  FrontEnd f;
  f.model_name = "tiny-hybrid";
  f.chat_template_problem = "none";
  const Listening live(server, f);
  const auto [status, r] =
      post("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 120}});
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_FALSE(mid.empty()) << "the request never held 4 blocks";
  const auto value = [&](const std::string& name) {
    const auto at = mid.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(mid.substr(at + name.size() + 2));
  };
  const ch12::PagedLayout L = ch12::PagedLayout::of(*m);
  const auto kind = [](models::LayerKind k) { return static_cast<std::size_t>(k); };
  EXPECT_EQ(slots, 1);
  EXPECT_EQ(value("inferlab_kv_slots_used"), 1) << mid;
  EXPECT_EQ(value("inferlab_kv_slots_total"), 4) << mid;
  EXPECT_EQ(value("inferlab_kv_blocks_used"), static_cast<double>(blocks)) << mid;
  EXPECT_EQ(by[kind(models::LayerKind::Window)], L.slot_bytes) << "one slot: the three window layers' rings";
  EXPECT_EQ(by[kind(models::LayerKind::Attention)], blocks * L.block_bytes(c.block_size)) << "the global layer's blocks";
  EXPECT_EQ(value("inferlab_kv_bytes_used{kind=\"window\"}"), static_cast<double>(L.slot_bytes)) << mid;
  EXPECT_EQ(value("inferlab_kv_bytes_used{kind=\"attention\"}"), static_cast<double>(blocks * L.block_bytes(c.block_size)))
      << mid;
  EXPECT_EQ(value("inferlab_kv_bytes_used{kind=\"latent\"}"), 0) << mid;
  EXPECT_EQ(value("inferlab_kv_bytes_used{kind=\"recurrent\"}"), 0) << mid;
  EXPECT_TRUE(test::eventually([&] { return server.gauges().slots_used == 0 && server.gauges().blocks_used == 0; }));
}

}  // namespace
