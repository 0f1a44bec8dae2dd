// Chapter 11: the scheduler on its own, driven by random events without a model. A fake cache
// only counts positions; a fake pool charges one unit per position under a budget. After every
// iteration the invariants a serving system relies on are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "chapters/11_continuous_batching/scheduler.h"
#include "test_util.h"

using namespace inferlab;
using namespace inferlab::ch11;

namespace {

// A cache that stores nothing: it counts positions, as the scheduler sees a cache.
class CountingCache : public models::KVCache {
 public:
  std::int64_t length() const override { return n_; }
  void commit(std::int64_t T) override { n_ += T; }
  void truncate(std::int64_t n) override { n_ = n; }
  std::int64_t bytes() const override { return reserved; }
  void release() override { n_ = 0; }
  void attend(std::int64_t, const Tensor&, const Tensor&, const Tensor&, Tensor&) override {
    FAIL() << "the scheduler test runs no attention";
  }
  std::int64_t reserved = 0;  // positions the pool has charged for

 private:
  std::int64_t n_ = 0;
};

// One unit of budget per position, charged as the cache grows (on-demand allocation).
class CountingPool : public KVPool {
 public:
  explicit CountingPool(std::int64_t budget) : budget_(budget) {}
  bool reserve(Sequence& s, std::int64_t n) override {
    auto* c = static_cast<CountingCache*>(s.cache.get());
    const std::int64_t have = c ? c->reserved : 0, need = s.computed() + n;
    if (need <= have) return true;
    if (used_ + need - have > budget_) return false;
    if (!c) s.cache = std::make_unique<CountingCache>(), c = static_cast<CountingCache*>(s.cache.get());
    used_ += need - have;
    c->reserved = need;
    return true;
  }
  void free(Sequence& s) override {
    if (s.cache) used_ -= static_cast<CountingCache*>(s.cache.get())->reserved;
    s.cache.reset();
    frees++;
  }
  std::int64_t used_bytes() const override { return used_; }
  std::int64_t budget_bytes() const override { return budget_; }
  std::int64_t bytes_for(std::int64_t tokens) const override { return tokens; }
  std::string describe() const override { return "one unit per position"; }
  std::int64_t frees = 0;

 private:
  std::int64_t budget_, used_ = 0;
};

std::unique_ptr<Sequence> sequence(std::int64_t id, std::int64_t prompt, int max_new) {
  Request r;
  r.id = id;
  r.prompt.assign(static_cast<std::size_t>(prompt), 1);
  r.max_new_tokens = max_new;
  return std::make_unique<Sequence>(std::move(r));
}

// What the engine does with a plan, without a model: the tokens go into the caches, and a
// sequence whose pending tokens are all through gets a token (it "samples" token 2).
std::vector<Sequence*> execute(const std::vector<Scheduled>& plan) {
  std::vector<Sequence*> sampled;
  for (const Scheduled& p : plan) {
    p.seq->cache->commit(p.tokens);
    if (p.seq->pending() == 0) p.seq->tokens.push_back(2), sampled.push_back(p.seq);
  }
  return sampled;
}

SchedulerConfig continuous(std::int64_t cap, std::int64_t step_tokens) {
  SchedulerConfig c;
  c.max_running = cap, c.max_step_tokens = step_tokens;
  return c;
}

}  // namespace

// Random arrivals over 10,000 iterations (and until they are served) under random caps, budgets and KV pressure, for both
// policies. Checked after every iteration: no request is lost or duplicated, the cap, the token
// budget and the KV budget hold, every sequence running before the step and not preempted
// advanced, admissions follow arrival order, and every request finishes (no starvation).
TEST(Scheduler, InvariantsHoldUnderTenThousandRandomEvents) {
  auto rng = test::rng_for_test();
  std::int64_t preempted_total = 0;
  // Per policy, a tight setup (a cap of 8 sequences, KV memory for about 3 of them) and three random ones.
  for (int config = 0; config < 8; ++config) {
    const Policy policy = config % 2 ? Policy::Static : Policy::Continuous;
    const bool tight = config < 2;
    std::uniform_int_distribution<int> coin(0, 99);
    SchedulerConfig c;
    c.policy = policy;
    c.max_running = tight ? 8 : 1 + static_cast<std::int64_t>(rng() % 8);
    c.max_step_tokens = c.max_running + (tight ? 8 : static_cast<std::int64_t>(rng() % 40));
    const std::int64_t longest = 60;  // prompt + max_new of any request
    CountingPool pool(longest + (tight ? 40 : static_cast<std::int64_t>(rng() % 160)));
    Scheduler s(c, pool);
    std::int64_t next_id = 0, next_admission = 0, finished = 0;
    std::map<std::int64_t, std::int64_t> admitted_as;  // id → order of first admission
    std::set<std::int64_t> done;
    int it = 0;
    for (; it < 10000 || !s.waiting().empty() || !s.running().empty(); ++it) {
      ASSERT_LT(it, 200000) << "requests left long after the arrivals stopped: starvation or a livelock";
      // Arrivals during the first 10,000 iterations: a single one sometimes, a burst now and then.
      const int roll = coin(rng), arrivals = it >= 10000 ? 0 : roll < 2 ? 1 : roll < 3 ? 2 + coin(rng) % 4 : 0;
      for (int a = 0; a < arrivals; ++a) {
        const std::int64_t p = 1 + static_cast<std::int64_t>(rng() % 30);
        s.add(sequence(next_id++, p, 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(longest - p))));
      }
      // Before the step: who runs, and how far along each is.
      std::map<Sequence*, std::int64_t> before;
      for (const auto& r : s.running()) before[r.get()] = r->computed() + r->generated();
      const std::int64_t preemptions_before = s.preemptions();
      const bool work = !s.waiting().empty() || !s.running().empty();
      const auto plan = s.schedule();
      ASSERT_TRUE(plan.empty() != work) << "work waiting and nothing planned, or a plan with nothing to do";

      std::int64_t tokens = 0;
      std::set<const Sequence*> in_plan;
      for (const Scheduled& p : plan) {
        ASSERT_GE(p.tokens, 1);
        ASSERT_LE(p.tokens, p.seq->pending()) << "more tokens than it has pending";
        ASSERT_TRUE(in_plan.insert(p.seq).second) << "a sequence twice in one step";
        tokens += p.tokens;
      }
      ASSERT_LE(static_cast<std::int64_t>(plan.size()), c.max_running);
      ASSERT_LE(static_cast<std::int64_t>(s.running().size()), c.max_running);
      if (policy == Policy::Continuous) {
        ASSERT_LE(tokens, c.max_step_tokens);
      }
      ASSERT_LE(pool.used_bytes(), pool.budget_bytes());
      for (const Scheduled& p : plan)  // the pool has made room for the step
        ASSERT_GE(static_cast<CountingCache*>(p.seq->cache.get())->reserved, p.seq->computed() + p.tokens);
      // Everyone who ran before and is still running is in the plan: it advances.
      std::set<const Sequence*> running;
      for (const auto& r : s.running()) running.insert(r.get());
      for (const auto& [seq, progress] : before)
        if (running.count(seq)) {
          ASSERT_TRUE(in_plan.count(seq)) << "request " << seq->request.id << " did not advance";
        }
      ASSERT_EQ(in_plan.size(), running.size()) << "a running sequence outside the plan, or a planned one not running";
      preempted_total += s.preemptions() - preemptions_before;
      // Admissions in arrival order (a preempted sequence is admitted again ahead of newer ones).
      for (const auto& r : s.running())
        if (!admitted_as.count(r->request.id)) {
          ASSERT_EQ(r->request.id, next_admission) << "admitted out of arrival order";
          admitted_as[r->request.id] = next_admission++;
        }

      for (Sequence* q : execute(plan))
        if (q->generated() >= q->request.max_new_tokens || coin(rng) < 3) {  // its length, or a stop id
          const auto out = s.remove(q);
          ASSERT_NE(out, nullptr);
          ASSERT_TRUE(done.insert(out->request.id).second) << "finished twice";
          ASSERT_EQ(out->cache, nullptr);
          ++finished;
        }
      // Conservation: every request is waiting, running or finished, exactly once.
      std::set<std::int64_t> seen(done);
      for (const auto& w : s.waiting()) ASSERT_TRUE(seen.insert(w->request.id).second) << "duplicated";
      for (const auto& r : s.running()) ASSERT_TRUE(seen.insert(r->request.id).second) << "duplicated";
      ASSERT_EQ(static_cast<std::int64_t>(seen.size()), next_id) << "a request was lost";
      for (const auto& w : s.waiting()) ASSERT_EQ(w->cache, nullptr) << "a waiting sequence holds KV memory";
    }
    // No starvation: once the arrivals stop, everything finishes.
    EXPECT_EQ(finished, next_id);
    EXPECT_GT(next_id, 300) << "too few requests to exercise anything";
    EXPECT_EQ(pool.used_bytes(), 0);
  }
  EXPECT_GT(preempted_total, 0) << "the budgets never forced a preemption";
}

// The lecture's three requests, by hand: static batching holds the batch until the longest
// ends; continuous batching refills a slot in the iteration after it frees.
TEST(Scheduler, StaticHoldsTheBatchContinuousRefillsIt) {
  for (const Policy policy : {Policy::Static, Policy::Continuous}) {
    SchedulerConfig c;
    c.policy = policy;
    c.max_running = 3;
    c.max_step_tokens = 16;
    CountingPool pool(1000);
    Scheduler s(c, pool);
    const int lengths[] = {10, 50, 100, 10};
    for (int i = 0; i < 4; ++i) s.add(sequence(i, 1, lengths[i]));
    std::int64_t step = 0, fourth_admitted = -1;
    while (!s.running().empty() || !s.waiting().empty()) {
      const auto plan = s.schedule();
      ++step;
      for (const Scheduled& p : plan)
        if (p.seq->request.id == 3 && fourth_admitted < 0) fourth_admitted = step;
      for (Sequence* q : execute(plan))
        if (q->generated() >= q->request.max_new_tokens) s.remove(q);
    }
    if (policy == Policy::Static) {
      EXPECT_EQ(fourth_admitted, 101);  // after the 100-token request's 100 steps
      EXPECT_EQ(step, 110);
    } else {
      EXPECT_EQ(fourth_admitted, 11);  // the step after the 10-token request's last
      EXPECT_EQ(step, 100);
    }
  }
}

// Chunked prefill: a long prompt enters in chunks within the token budget while the others keep
// decoding; the budget is never exceeded and every chunk but the last leaves tokens pending.
TEST(Scheduler, ChunkedPrefillSharesTheStepWithDecodes) {
  CountingPool pool(1000);
  Scheduler s(continuous(4, 8), pool);
  s.add(sequence(0, 2, 40));
  execute(s.schedule());  // request 0 prefilled, decoding from now on
  s.add(sequence(1, 21, 5));
  std::vector<std::int64_t> chunks;
  for (int i = 0; i < 4; ++i) {
    const auto plan = s.schedule();
    ASSERT_EQ(plan.size(), 2u);
    EXPECT_EQ(plan[0].seq->request.id, 0);
    EXPECT_EQ(plan[0].tokens, 1);  // the decode token is never squeezed out
    chunks.push_back(plan[1].tokens);
    execute(plan);
  }
  EXPECT_EQ(chunks, (std::vector<std::int64_t>{7, 7, 7, 1}));  // 21 prompt tokens, then its first decode
}

// The out-of-memory path: the newest sequence is preempted, loses its cache, and is admitted
// again first, with everything it had to recompute.
TEST(Scheduler, PreemptionFreesTheNewestAndRequeuesItFirst) {
  CountingPool pool(20);
  Scheduler s(continuous(4, 64), pool);
  s.add(sequence(0, 8, 10));
  s.add(sequence(1, 8, 10));
  execute(s.schedule());  // both prefilled: 16 of 20 units
  s.add(sequence(2, 1, 3));
  execute(s.schedule());  // 0 and 1 decode (18), 2 is admitted (19)
  execute(s.schedule());  // 21 would be needed: 2 is preempted
  EXPECT_EQ(s.preemptions(), 1);
  ASSERT_EQ(s.waiting().size(), 1u);
  EXPECT_EQ(s.waiting().front()->request.id, 2);
  EXPECT_EQ(s.waiting().front()->cache, nullptr);
  EXPECT_EQ(s.waiting().front()->pending(), 2) << "its prompt and its one generated token, to recompute";
  EXPECT_EQ(s.waiting().front()->preemptions, 1);
}

// A running sequence's share of a step, alone: one decode token whatever the budget; a prefill
// takes the rest of its prompt or as much of it as the spare budget allows.
TEST(Scheduler, AStepShareIsTheOwedTokenPlusWhatTheSpareBudgetAllows) {
  EXPECT_EQ(step_share(1, 0), 1);
  EXPECT_EQ(step_share(1, 100), 1);  // decoding: one pending token
  EXPECT_EQ(step_share(21, 6), 7);   // a prefill chunk: the owed token and 6 spare
  EXPECT_EQ(step_share(21, 0), 1);   // no spare: it still advances by one
  EXPECT_EQ(step_share(5, 100), 5);  // the whole rest of its prompt, never more
  EXPECT_EQ(step_share(5, 4), 5);
  EXPECT_EQ(step_share(5, 3), 4);
}

// Preemption alone, without a schedule: the newest running sequence loses its cache, counts the
// preemption and waits first; the others keep theirs.
TEST(Scheduler, PreemptingTheNewestFreesItsCacheAndQueuesItFirst) {
  CountingPool pool(100);
  std::vector<std::unique_ptr<Sequence>> running;
  std::deque<std::unique_ptr<Sequence>> waiting;
  for (std::int64_t id = 0; id < 3; ++id) {
    running.push_back(sequence(id, 4, 8));
    ASSERT_TRUE(pool.reserve(*running.back(), 4));
    running.back()->cache->commit(4);
  }
  waiting.push_back(sequence(3, 2, 8));
  preempt_newest(running, waiting, pool);
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0]->request.id, 0);
  EXPECT_EQ(running[1]->request.id, 1);
  ASSERT_EQ(waiting.size(), 2u);
  EXPECT_EQ(waiting[0]->request.id, 2) << "the preempted sequence is admitted again first";
  EXPECT_EQ(waiting[1]->request.id, 3);
  EXPECT_EQ(waiting[0]->cache, nullptr);
  EXPECT_EQ(waiting[0]->preemptions, 1);
  EXPECT_EQ(waiting[0]->pending(), 4) << "its whole prompt, to recompute";
  EXPECT_EQ(pool.used_bytes(), 8) << "the two older sequences keep their 4 positions each";
  EXPECT_NE(running[1]->cache, nullptr);
  preempt_newest(running, waiting, pool);
  EXPECT_EQ(waiting[0]->request.id, 1);
  EXPECT_EQ(pool.used_bytes(), 4);
  running.clear();
  test::expect_error([&] { preempt_newest(running, waiting, pool); }, {"no running sequence"});
}

TEST(Scheduler, ConfigurationErrors) {
  CountingPool pool(10);
  SchedulerConfig c;
  c.max_running = 0;
  test::expect_error([&] { Scheduler s(c, pool); }, {"cap on running sequences", "at least 1"});
  c.max_running = 8, c.max_step_tokens = 4;
  test::expect_error([&] { Scheduler s(c, pool); }, {"token budget per step (4)", "cap on running sequences (8)"});
  c.policy = Policy::Static;
  EXPECT_NO_THROW(Scheduler(c, pool));  // static batching has no token budget
}
