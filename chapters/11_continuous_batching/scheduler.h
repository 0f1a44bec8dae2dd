#pragma once
/// @file scheduler.h
/// @brief Chapter 11: iteration-level scheduling (Orca), chunked prefill, preemption.
///
/// Static batching forms a batch, runs it until its longest request ends, then forms the next.
/// Continuous batching decides again at every iteration (every forward pass): a request that
/// finished leaves at once, and a waiting one joins at once. Three limits shape each iteration:
/// a cap on running sequences, a token budget per step (a long prompt enters in chunks, between
/// the decode tokens of the others, instead of stalling them), and the KV pool's bytes. When the
/// pool runs out, the newest running sequence is preempted: its cache is freed and it waits again
/// at the front of the queue, to recompute its K and V when it returns.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "chapters/11_continuous_batching/sequence.h"

namespace inferlab::ch11 {

enum class Policy {
  Static,      ///< admit only when the whole batch has finished; whole prompts
  Continuous,  ///< admit every iteration; prompts in chunks within the token budget
};

struct SchedulerConfig {
  Policy policy = Policy::Continuous;
  std::int64_t max_running = 8;       ///< sequences in one step at most
  std::int64_t max_step_tokens = 64;  ///< tokens in one step at most (continuous; at least max_running)
  /// Throws naming a bad value.
  void validate() const;
};

/// One sequence's share of an iteration: its next `tokens` pending tokens go through the model.
struct Scheduled {
  Sequence* seq = nullptr;
  std::int64_t tokens = 0;
};

/// The tokens a running sequence with `pending` tokens not yet through the model takes this step,
/// when the step has `spare` tokens of budget left beyond the one each running sequence is owed:
/// that one, plus as many more of its pending tokens as the spare allows. A decoding sequence
/// (one pending token) takes one whatever the budget; a prefill takes a chunk.
std::int64_t step_share(std::int64_t pending, std::int64_t spare);

/// Preemption by recomputation: the newest running sequence (the back of `running`) gives its
/// cache back to `pool`, counts the preemption, and waits at the front of `waiting` with all its
/// tokens pending again.
void preempt_newest(std::vector<std::unique_ptr<Sequence>>& running, std::deque<std::unique_ptr<Sequence>>& waiting,
                    KVPool& pool);

/// First come, first served: sequences leave the queue in arrival order, and an older sequence
/// is never preempted for a younger one.
class Scheduler {
 public:
  Scheduler(const SchedulerConfig& c, KVPool& pool);
  /// An arrived request joins the back of the queue.
  void add(std::unique_ptr<Sequence> s);
  /// This iteration's work. Every running sequence advances, unless it is preempted.
  std::vector<Scheduled> schedule();
  /// A sequence that leaves, running or waiting: one that finished, or one that leaves early (a
  /// client went away, a stop string hit). Its cache goes back to the pool. Null when it is neither.
  std::unique_ptr<Sequence> remove(const Sequence* s);
  /// A sequence forked from a running one: it waits at the front of the queue, holding its cache,
  /// after any forks queued before it (admitted in the slots its parent kept for it).
  void add_fork(std::unique_ptr<Sequence> s);
  /// Whether s fits the cap on running sequences beside those running (their slots() in all).
  bool has_room_for(const Sequence& s) const;

  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const SchedulerConfig& config() const { return c_; }
  std::int64_t preemptions() const { return preemptions_; }

 private:
  SchedulerConfig c_;
  KVPool& pool_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // arrival order
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: oldest first
  std::int64_t preemptions_ = 0;
  std::size_t forks_queued_ = 0;  // forks at the front of waiting_ since the last step
};

}  // namespace inferlab::ch11
