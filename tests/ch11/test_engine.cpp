// Chapter 11: the engine on tiny-mha. Whatever the policy, the caps, the chunking and the
// preemptions, every request gets exactly what it gets alone: the same tokens (greedy and seeded
// sampling) and logits within the bound of two float32 paths that differ only in summation order
// (a batched step's GEMM against a lone step's GEMV).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "bundled_model.h"
#include "chapters/11_continuous_batching/trace.h"
#include "common/eval.h"
#include "golden_util.h"

using namespace inferlab;
using namespace inferlab::ch11;

namespace {

const std::string kData = INFERLAB_DATA_DIR;

const models::Llama& tiny_mha() { return test::bundled_llama("tiny-mha"); }

// Twelve requests of real text: different prompt lengths, output lengths and arrival steps; half
// greedy, half sampled (temperature 0.8 with top-k or top-p, each its own seed); EOS stops them.
std::vector<Request> mixed_requests() {
  const auto text = eval::validation_tokens(kData, 4000);
  std::vector<Request> out;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.id = 100 + i;
    const std::size_t p = 3 + static_cast<std::size_t>((i * 7) % 29), at = static_cast<std::size_t>(i) * 211;
    r.prompt.assign(text.begin() + static_cast<long>(at), text.begin() + static_cast<long>(at + p));
    r.max_new_tokens = 8 + (i * 13) % 41;
    if (i % 2) r.sampling.temperature = 0.8f, r.sampling.seed = 7 + static_cast<std::uint64_t>(i);
    if (i % 4 == 1) r.sampling.top_k = 40;
    if (i % 4 == 3) r.sampling.top_p = 0.9f;
    r.sampling.vocab = 988;  // tiny-mha's tokenizer
    r.stop_ids = tiny_mha().config.eos_token_ids;
    r.arrival = static_cast<double>((i * 5) % 17);
    r.keep_logits = true;
    out.push_back(std::move(r));
  }
  return out;
}

struct Case {
  const char* name;
  Policy policy;
  std::int64_t max_running, max_step_tokens;
  Allocation allocation;
  std::int64_t budget_tokens;  // the KV budget, in positions of tiny-mha
  bool preempts, chunks;       // what the setup must exercise
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class EngineAgrees : public ::testing::TestWithParam<Case> {};

// The two-path test of the chapter: the engine (selective batching of many sequences, chunked
// prefill, preemption and recomputation) against each request run alone.
TEST_P(EngineAgrees, EveryRequestGetsWhatItGetsAlone) {
  const Case& p = GetParam();
  const models::Llama& m = tiny_mha();
  ContiguousPool pool(m.config, m.config.kv_cache_bytes(p.budget_tokens, 4), p.allocation);
  EngineConfig c;
  c.scheduler = {p.policy, p.max_running, p.max_step_tokens};
  c.clock = Clock::Steps;
  Engine e(m, pool, c);
  const auto requests = mixed_requests();
  for (const Request& r : requests) e.add(r);
  e.run();
  ASSERT_EQ(e.finished().size(), requests.size());
  for (const auto& s : e.finished()) {
    const Sequence alone = run_alone(m, s->request);
    ASSERT_EQ(s->tokens, alone.tokens) << "request " << s->request.id << " (preempted " << s->preemptions << " times)";
    ASSERT_EQ(s->logits.size(), alone.logits.size());
    for (std::size_t t = 0; t < alone.logits.size(); ++t) {
      const std::vector<double> want(alone.logits[t].begin(), alone.logits[t].end());
      const double bound = test::two_path_bound(m.config, want);
      for (std::size_t v = 0; v < want.size(); ++v)
        ASSERT_NEAR(s->logits[t][v], want[v], bound) << "request " << s->request.id << ", token " << t;
    }
  }
  EXPECT_EQ(pool.used_bytes(), 0) << "a finished request kept its cache";
  // The setup did exercise what it is for.
  std::int64_t most = 0;
  bool chunked = false;
  for (const StepRecord& r : e.steps()) {
    most = std::max(most, r.sequences);
    EXPECT_LE(r.sequences, p.max_running);
    if (p.policy == Policy::Continuous) {
      EXPECT_LE(r.prefill_tokens + r.decode_tokens, p.max_step_tokens);
    }
    EXPECT_LE(r.kv_bytes, pool.budget_bytes());
    chunked = chunked || (r.prefill_tokens > 0 && r.decode_tokens > 0);
  }
  EXPECT_EQ(most, p.max_running) << "the batch never filled";
  if (p.preempts) {
    EXPECT_GE(e.scheduler().preemptions(), 3);
  }
  if (p.chunks) {
    EXPECT_TRUE(chunked) << "no step mixed prefill chunks with decode tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, EngineAgrees,
    ::testing::Values(Case{"continuous", Policy::Continuous, 6, 16, Allocation::MaxLength, 4096, false, true},
                      Case{"continuous_preempting", Policy::Continuous, 5, 12, Allocation::OnDemand, 160, true, true},
                      Case{"static", Policy::Static, 4, 4, Allocation::MaxLength, 4096, false, false}),
    [](const auto& info) { return std::string(info.param.name); });

// Chunked prefill with any chunk size gives the cache and the logits one-shot prefill gives.
TEST(ChunkedPrefill, AnyChunkSizeEqualsOneShot) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 200);
  const std::vector<std::int32_t> prompt(text.begin() + 50, text.begin() + 87);  // 37 tokens
  models::ContiguousKVCache whole(m.config, 40);
  const auto want = models::forward_cached(m, whole, prompt).to_double_vector();
  for (const std::int64_t chunk : {1, 3, 7, 16, 36}) {
    GrowingKVCache cache(m.config, Device::CPU);
    cache.grow(40);
    std::vector<float> got;
    for (std::size_t a = 0; a < prompt.size(); a += static_cast<std::size_t>(chunk)) {
      const auto b = std::min(prompt.size(), a + static_cast<std::size_t>(chunk));
      got = models::forward_cached(m, cache, {prompt.begin() + static_cast<long>(a), prompt.begin() + static_cast<long>(b)})
                .to_float_vector();
    }
    ASSERT_EQ(cache.length(), 37);
    const double bound = test::two_path_bound(m.config, want);
    for (std::size_t v = 0; v < want.size(); ++v) ASSERT_NEAR(got[v], want[v], bound) << "chunk " << chunk;
    // The cache: every layer's K and V rows, each within the two-path bound of its own scale
    // (a layer's rows pass through fewer stages than the logits the bound is made for).
    for (std::int64_t l = 0; l < m.config.num_layers; ++l)
      for (const bool is_k : {true, false}) {
        const auto rows = [&](const models::ContiguousKVCache& x) {
          return (is_k ? x.k(l) : x.v(l)).slice(0, 0, 37).to_double_vector();
        };
        const auto a = rows(*cache.rows()), b = rows(whole);
        const double kv_bound = test::two_path_bound(m.config, b);
        for (std::size_t i = 0; i < b.size(); ++i)
          ASSERT_NEAR(a[i], b[i], kv_bound) << "chunk " << chunk << ", layer " << l << (is_k ? " K" : " V");
      }
  }
}

// The engine with one running sequence and a token budget of `chunk`: the first token's logits
// and every token equal the one-shot path, for chunk sizes 1 to the whole prompt.
TEST(ChunkedPrefill, TheEngineChunksAPromptAndGetsTheSameTokens) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 200);
  Request r;
  r.prompt.assign(text.begin() + 10, text.begin() + 43);  // 33 tokens
  r.max_new_tokens = 12;
  r.keep_logits = true;
  const Sequence alone = run_alone(m, r);
  for (const std::int64_t chunk : {1, 4, 16, 33}) {
    ContiguousPool pool(m.config, m.config.kv_cache_bytes(64, 4), Allocation::OnDemand);
    EngineConfig c;
    c.scheduler = {Policy::Continuous, 1, chunk};
    c.clock = Clock::Steps;
    Engine e(m, pool, c);
    e.add(r);
    e.run();
    ASSERT_EQ(e.finished().size(), 1u);
    EXPECT_EQ(e.finished()[0]->tokens, alone.tokens) << "chunk " << chunk;
    EXPECT_EQ(static_cast<std::int64_t>(e.steps().size()), (33 + chunk - 1) / chunk + 11) << "chunk " << chunk;
    const std::vector<double> want(alone.logits[0].begin(), alone.logits[0].end());
    const double bound = test::two_path_bound(m.config, want);
    for (std::size_t v = 0; v < want.size(); ++v) ASSERT_NEAR(e.finished()[0]->logits[0][v], want[v], bound);
  }
}

// The lecture's example on the engine, counted in steps: static batching of 10-, 50- and
// 100-token requests at batch 3 keeps (10 + 50 + 100) / (3 · 100) of its slots busy.
TEST(LectureExample, StaticBatchingUsesFiftyThreePercentOfItsSlots) {
  const models::Llama& m = tiny_mha();
  for (const Policy policy : {Policy::Static, Policy::Continuous}) {
    ContiguousPool pool(m.config, m.config.kv_cache_bytes(4096, 4), Allocation::MaxLength);
    EngineConfig c;
    c.scheduler = {policy, 3, 3};
    c.clock = Clock::Steps;
    Engine e(m, pool, c);
    for (const Request& r : lecture_example(policy == Policy::Static ? 0 : 9, 1)) e.add(r);
    e.run();
    const Report rep = report(e);
    if (policy == Policy::Static) {
      EXPECT_EQ(rep.steps, 100);
      EXPECT_DOUBLE_EQ(rep.slot_utilisation, 160.0 / 300.0);
    } else {  // 12 requests, 640 tokens: full batches until the queue runs dry
      EXPECT_EQ(rep.generated, 640);
      for (std::size_t i = 0; i < e.steps().size(); ++i)
        if (e.steps()[i].waiting > 0) {
          EXPECT_EQ(e.steps()[i].sequences, 3) << "step " << i;
        }
    }
  }
}

// Stop conditions and the clock: a stop id ends a request right after it is sampled; a request
// arriving at an idle engine gets its first token one step later; max_new_tokens is respected.
TEST(Engine, StopsAndTheClock) {
  const models::Llama& m = tiny_mha();
  Request r;
  r.prompt = {0, 523, 524, 278};
  r.max_new_tokens = 20;
  const Sequence greedy = run_alone(m, r);
  ASSERT_EQ(greedy.generated(), 20);
  Request stopping = r;
  stopping.id = 1;
  stopping.stop_ids = {greedy.tokens[r.prompt.size() + 4]};
  stopping.arrival = 5;
  const auto first = std::find(greedy.tokens.begin() + 4, greedy.tokens.end(), greedy.tokens[r.prompt.size() + 4]);
  const std::int64_t stop_at = (first - greedy.tokens.begin()) - 4 + 1;
  ContiguousPool pool(m.config, m.config.kv_cache_bytes(1024, 4), Allocation::MaxLength);
  EngineConfig c;
  c.clock = Clock::Steps;
  Engine e(m, pool, c);
  e.add(r);
  e.add(stopping);
  e.run();
  ASSERT_EQ(e.finished().size(), 2u);
  for (const auto& s : e.finished()) {
    if (s->request.id == 0) {
      EXPECT_EQ(s->tokens, greedy.tokens);
      EXPECT_EQ(s->first_token_time, 1);  // arrived at 0, prefilled in step 1
      EXPECT_EQ(s->finish_time, 20);
    } else {
      EXPECT_EQ(s->generated(), stop_at);
      EXPECT_EQ(s->first_token_time, 6);
      EXPECT_EQ(s->tokens.back(), stopping.stop_ids[0]);
    }
  }
}

// More sequences fit a budget when caches grow on demand than when each takes its maximum length
// at admission: the memory that chapter 12 then stops wasting.
TEST(Engine, OnDemandAllocationRunsMoreSequencesThanMaxLength) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 4000);
  TraceSpec t;
  t.requests = 16;
  t.context = 256;
  const auto trace = make_trace(t, text);
  std::int64_t most[2] = {0, 0};
  for (const Allocation a : {Allocation::MaxLength, Allocation::OnDemand}) {
    ContiguousPool pool(m.config, m.config.kv_cache_bytes(512, 4), a);
    EngineConfig c;
    c.scheduler = {Policy::Continuous, 16, 64};
    c.clock = Clock::Steps;
    Engine e(m, pool, c);
    for (const Request& r : trace) e.add(r);
    e.run();
    for (const StepRecord& r : e.steps())
      most[a == Allocation::OnDemand] = std::max(most[a == Allocation::OnDemand], r.sequences);
  }
  EXPECT_GT(most[1], most[0]);
}

TEST(Engine, RefusesWhatItCannotServe) {
  const models::Llama& m = tiny_mha();
  ContiguousPool pool(m.config, m.config.kv_cache_bytes(100, 4), Allocation::MaxLength);
  EngineConfig c;
  Engine e(m, pool, c);
  Request r;
  r.id = 4;
  test::expect_error([&] { e.add(r); }, {"request 4", "prompt is empty"});
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 0;
  test::expect_error([&] { e.add(r); }, {"request 4", "max_new_tokens must be at least 1"});
  r.max_new_tokens = 510;
  test::expect_error([&] { e.add(r); }, {"request 4", "513 positions", "context of 512"});
  r.max_new_tokens = 98;
  test::expect_error([&] { e.add(r); }, {"request 4", "101 positions", "more than the pool's whole budget"});
  r.max_new_tokens = 8;
  r.prompt = {1, 5000};
  test::expect_error([&] { e.add(r); }, {"request 4", "token 5000", "vocabulary of 1024"});
  r.prompt = {1, 2};
  r.sampling.temperature = -1;
  test::expect_error([&] { e.add(r); }, {"temperature"});
  r.sampling.temperature = 0;
  e.add(r);
  test::expect_error([&] { e.add(r); }, {"request 4", "id is already taken"});
  test::expect_error([&] { ContiguousPool p(m.config, 0, Allocation::OnDemand); }, {"budget must be positive"});
}

}  // namespace
