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

std::int64_t step_share(std::int64_t pending, std::int64_t spare) {
  std::int64_t n = 0;
  // EXERCISE 11.1 BEGIN: a running sequence's share of the step
  n = 1 + std::min(pending - 1, spare);
  // EXERCISE 11.1 STUB
  // lab::not_done("11.1", "set n: the one token a running sequence is owed, plus as many more of its pending "
  //                       "tokens as the step's spare budget allows (at most pending in all)");
  // EXERCISE 11.1 END
  return n;
}

// Preemption by recomputation: the newest running sequence gives its cache back and returns to
// the front of the queue with all its tokens pending; its K and V are recomputed when it is
// admitted again. Its sampler keeps its state, so it continues exactly as it would have.
void preempt_newest(std::vector<std::unique_ptr<Sequence>>& running, std::deque<std::unique_ptr<Sequence>>& waiting,
                    KVPool& pool) {
  IL_CHECK(!running.empty(), "scheduler: preemption with no running sequence");
  // EXERCISE 11.2 BEGIN: preempt the newest running sequence by recomputation
  pool.free(*running.back());
  running.back()->preemptions++;
  waiting.push_front(std::move(running.back()));
  running.pop_back();
  // EXERCISE 11.2 STUB
  // lab::not_done("11.2", "give the newest running sequence's cache back to the pool (pool.free), count the "
  //                       "preemption on it, and move it from the back of running to the front of waiting");
  // EXERCISE 11.2 END
}

bool Scheduler::has_room_for(const Sequence& s) const {
  std::int64_t taken = 0;
  for (const auto& r : running_) taken += r->slots();
  return taken + s.slots() <= c_.max_running;
}

void Scheduler::add_fork(std::unique_ptr<Sequence> s) {
  waiting_.insert(waiting_.begin() + static_cast<long>(std::min(forks_queued_, waiting_.size())), std::move(s));
  ++forks_queued_;
}

std::unique_ptr<Sequence> Scheduler::remove(const Sequence* s) {
  std::unique_ptr<Sequence> gone;
  if (auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
      it != running_.end()) {
    gone = std::move(*it);
    running_.erase(it);
  } else if (auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& r) { return r.get() == s; });
             w != waiting_.end()) {
    gone = std::move(*w);
    waiting_.erase(w);
  }
  if (gone) pool_.free(*gone);
  return gone;
}

std::vector<Scheduled> Scheduler::schedule() {
  forks_queued_ = 0;
  std::vector<Scheduled> plan;
  // EXERCISE 11.3 BEGIN: one iteration's plan: the running sequences, preemption, admissions
  const bool is_static = c_.policy == Policy::Static;
  // Tokens this step may still take beyond the one every running sequence is owed.
  std::int64_t spare = is_static ? std::numeric_limits<std::int64_t>::max() / 2
                                 : c_.max_step_tokens - static_cast<std::int64_t>(running_.size());
  bool preempted = false;

  // 1. The running sequences, oldest first: a decode token each, or the next chunk of a prefill.
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    const std::int64_t n = step_share(s.pending(), spare);
    while (!pool_.reserve(s, n)) {  // out of KV memory: the newest goes, never an older one for it
      preempt_newest(running_, waiting_, pool_);
      ++preemptions_;
      preempted = true;
      if (i >= running_.size()) return plan;  // s itself was the newest
    }
    spare -= n - 1;
    plan.push_back({&s, n});
  }

  // 2. Admissions, in arrival order, while the cap, the token budget and the pool allow. Static
  //    batching admits only into an empty batch; no admission follows a preemption (it would
  //    take back the memory just freed).
  if (is_static && !running_.empty()) return plan;
  while (!preempted && !waiting_.empty() && has_room_for(*waiting_.front()) && spare > 0) {
    Sequence& s = *waiting_.front();
    std::int64_t n = std::min(s.pending(), spare);
    if (!pool_.reserve(s, n)) break;  // it waits for memory; nobody behind it overtakes
    n = std::min(n, s.pending());     // a pool that caches prefixes may have found some already computed
    spare -= n;
    plan.push_back({&s, n});
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // EXERCISE 11.3 STUB
  // lab::not_done("11.3", "plan the step: each running sequence, oldest first, gets step_share(pending, spare) "
  //                       "tokens, reserved in the pool (while that fails, preempt_newest and count it; stop if "
  //                       "the sequence itself went); then, unless a preemption happened, admit waiting "
  //                       "sequences in order while the cap (has_room_for), the spare budget and the pool "
  //                       "allow (static batching: only into an empty batch)");
  // EXERCISE 11.3 END
  return plan;
}

}  // namespace inferlab::ch11
