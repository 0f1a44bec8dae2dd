#include "chapters/11_continuous_batching/scheduler.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/lab.h"

namespace inferlab::ch11 {

void SchedulerConfig::validate() const {
  IL_CHECK(max_running >= 1, "scheduler: the cap on running sequences must be at least 1, got ", max_running);
  IL_CHECK(policy == Policy::Static || max_step_tokens >= max_running, "scheduler: the token budget per step (",
           max_step_tokens, ") must be at least the cap on running sequences (", max_running,
           "), so that every running sequence can advance every step");
}

Scheduler::Scheduler(const SchedulerConfig& c, KVPool& pool) : c_(c), pool_(pool) { c_.validate(); }

void Scheduler::add(std::unique_ptr<Sequence> s) { waiting_.push_back(std::move(s)); }

std::vector<Scheduled> Scheduler::schedule() {
  std::vector<Scheduled> plan;
  const bool is_static = c_.policy == Policy::Static;
  // Tokens this step may still take beyond the one every running sequence is owed.
  std::int64_t spare = is_static ? std::numeric_limits<std::int64_t>::max() / 2
                                 : c_.max_step_tokens - static_cast<std::int64_t>(running_.size());
  bool preempted = false;

  // 1. The running sequences, oldest first: a decode token each, or the next chunk of a prefill.
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    // EXERCISE 11.1 BEGIN: a running sequence's share of the step
    const std::int64_t extra = std::min(s.pending() - 1, spare);
    const std::int64_t n = 1 + extra;
    // EXERCISE 11.1 STUB
    // lab::not_done("11.1", "set extra (the tokens s takes beyond the one it is owed: the rest of its pending "
    //                       "tokens, at most `spare`) and n = 1 + extra");
    // std::int64_t extra = 0, n = 0;
    // EXERCISE 11.1 END
    while (!pool_.reserve(s, n)) {  // out of KV memory: the newest goes, never an older one for it
      preempt_newest();
      preempted = true;
      if (i >= running_.size()) return plan;  // s itself was the newest
    }
    spare -= extra;
    plan.push_back({&s, n});
  }

  // 2. Admissions, in arrival order, while the cap, the token budget and the pool allow. Static
  //    batching admits only into an empty batch; no admission follows a preemption (it would
  //    take back the memory just freed).
  if (is_static && !running_.empty()) return plan;
  while (!preempted && !waiting_.empty() && static_cast<std::int64_t>(running_.size()) < c_.max_running && spare > 0) {
    Sequence& s = *waiting_.front();
    std::int64_t n = std::min(s.pending(), spare);
    if (!pool_.reserve(s, n)) break;  // it waits for memory; nobody behind it overtakes
    n = std::min(n, s.pending());     // a pool that caches prefixes may have found some already computed
    spare -= n;
    plan.push_back({&s, n});
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return plan;
}

// Preemption by recomputation: the newest running sequence gives its cache back and returns to
// the front of the queue with all its tokens pending; its K and V are recomputed when it is
// admitted again. Its sampler keeps its state, so it continues exactly as it would have.
void Scheduler::preempt_newest() {
  // EXERCISE 11.2 BEGIN: preempt the newest running sequence by recomputation
  pool_.free(*running_.back());
  running_.back()->preemptions++;
  waiting_.push_front(std::move(running_.back()));
  running_.pop_back();
  // EXERCISE 11.2 STUB
  // lab::not_done("11.2", "give the newest running sequence's cache back to the pool (pool_.free), count the "
  //                       "preemption on it, and move it from the back of running_ to the front of waiting_");
  // EXERCISE 11.2 END
  ++preemptions_;
}

std::unique_ptr<Sequence> Scheduler::finish(Sequence* s) {
  const auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
  IL_CHECK(it != running_.end(), "scheduler: request ", s->request.id, " is not running");
  std::unique_ptr<Sequence> done = std::move(*it);
  running_.erase(it);
  pool_.free(*done);
  return done;
}

}  // namespace inferlab::ch11
