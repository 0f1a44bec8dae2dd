#pragma once
/// @file engine_events.h
/// @brief Chapter 13: the engine as it works, step by step, for whoever watches (the serving page).
///
/// After each step the engine thread can say what it did: which sequences the step took and how
/// many tokens each (a chunk of a prompt, or one decode token), who waits behind the batch, and
/// what every KV block holds (free, one sequence's, shared by several, in the prefix cache, a
/// copy-on-write copy). Chapter 11's engine keeps its plan to itself, but every planned sequence
/// reserves its tokens in the pool first, so a pool that forwards to chapter 12's and notes each
/// reservation (PlanRecorder) reads the plan without changing either chapter.
///
/// Watchers are many and may be slow (a browser tab in the background) or gone (a closed tab);
/// the engine must never wait for one. So each watcher has a mailbox of one update: a step that
/// comes before the watcher took the last one is merged into it (the newest state, the sums of
/// tokens, the latencies in order), and the engine thread only ever holds a mailbox's lock for
/// that merge. With nobody watching, the engine thread's extra work is an atomic load per step.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "chapters/11_continuous_batching/engine.h"
#include "chapters/12_paged_attention/paged_cache.h"

namespace inferlab::ch13 {

/// One sequence's share of a step.
struct StepRow {
  std::int64_t id = 0, sample = 0;  ///< the request and which of its samples
  std::int64_t tokens = 0;          ///< tokens through the model this step
  bool prefill = false;             ///< a chunk of its prompt (or of a recomputation), else one decode token
  bool recompute = false;           ///< a prefill of what it had before a preemption took its blocks
  std::int64_t cached = 0;          ///< positions it found in the prefix cache as it started, this step
  std::int64_t position = 0;        ///< positions its cache holds after the step
  std::int64_t blocks = 0;          ///< blocks in its table
};

/// A sequence queued behind the batch.
struct WaitingRow {
  std::int64_t id = 0, sample = 0, tokens = 0;  ///< tokens: its prompt and what it generated so far
  bool preempted = false;                       ///< it ran, and gave its blocks back for an older one
};

/// A time to first token (of a request) or a time per output token (of a finished sample).
struct Latency {
  std::int64_t id = 0, sample = 0;
  double seconds = 0;
};

/// Every block's state, one character each: '.' free, 'c' free but still in the prefix cache,
/// 'u' one sequence's, 'p' one sequence's and in the prefix cache, 's' shared (more than one
/// reference), 'w' a copy-on-write copy.
struct BlockMap {
  std::string cells;
  std::int64_t free = 0, cached = 0, one = 0, shared = 0, copies = 0;
};

/// What the engine thread says after a step (or, idle, when a watcher arrives).
struct Snapshot {
  std::int64_t step = 0;  ///< steps run so far
  bool stepped = false;   ///< whether this snapshot follows a step
  bool busy = false;      ///< whether the engine has work left (false: it waits for requests)
  double step_seconds = 0;
  double time = 0;  ///< seconds since the server started
  std::vector<StepRow> batch;
  std::int64_t running = 0, waiting = 0;  ///< waiting: sequences and requests queued
  std::vector<WaitingRow> queue;          ///< the first of the waiting sequences, in order
  std::int64_t blocks_used = 0, blocks_total = 0, block_size = 0;
  std::int64_t slots_used = 0, slots_total = 0;  ///< fixed slots (windows' rings, recurrent states)
  std::vector<std::int64_t> bytes_by_kind;       ///< bytes held by the layers of each models::LayerKind
  std::int64_t prefix_hits = 0, cow_copies = 0, evictions = 0, preemptions = 0;  ///< so far
  std::shared_ptr<const BlockMap> map;                                           ///< null when not drawn again this step
  std::vector<Latency> ttft, tpot;                                               ///< what happened since the last snapshot
};

/// What a watcher takes: the latest snapshot, with everything since its last take merged in.
struct Update {
  std::shared_ptr<const Snapshot> latest;
  std::shared_ptr<const BlockMap> map;  ///< latest's map: null when that snapshot drew none (never an older one)
  std::int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0;
  double busy_seconds = 0;
  std::vector<Latency> ttft, tpot;
  std::int64_t merged = 0;  ///< snapshots folded into this one beyond the latest
};

/// The page's JSON for an update (see the README's "The serving page").
nlohmann::json to_json(const Update& u);

/// One watcher's mailbox.
class Subscription {
 public:
  explicit Subscription(std::shared_ptr<std::atomic<std::int64_t>> count) : count_(std::move(count)) { ++*count_; }
  ~Subscription() { --*count_; }
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  /// Waits up to `timeout` for an update whose latest snapshot draws the blocks, and takes it.
  /// The engine draws them at its next step for a watcher waiting here (and always as it goes
  /// idle), so the map a watcher gets is never older than the counts beside it. On a timeout
  /// (a step longer than `timeout`): whatever came, maybe nothing, and without a map if the
  /// latest snapshot drew none (the watcher keeps drawing the one it has).
  std::optional<Update> take(std::chrono::milliseconds timeout);
  /// From the engine thread: merges s into the mailbox. Never waits for the reader.
  void offer(const std::shared_ptr<const Snapshot>& s);
  /// Whether the watcher waits in take() for a snapshot that draws the blocks.
  bool wants_map() const { return wants_map_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Update> pending_;
  std::atomic<bool> wants_map_{false};
  std::shared_ptr<std::atomic<std::int64_t>> count_;
};

/// Chapter 12's pool, forwarded to, with each step's plan noted: the engine runs on it.
class PlanRecorder : public ch11::KVPool {
 public:
  explicit PlanRecorder(ch12::PagedPool& pool) : pool_(pool) {}
  /// Starts a step: the rows of the last one are forgotten; this one's are noted when `on`.
  void begin(bool on);
  const std::vector<StepRow>& rows() const { return rows_; }
  /// Whether block b is a copy-on-write copy made while watched (and still held).
  bool copied(std::int32_t b) const {
    return b < static_cast<std::int32_t>(cow_.size()) && cow_[static_cast<std::size_t>(b)];
  }

  bool reserve(ch11::Sequence& s, std::int64_t n) override;
  void free(ch11::Sequence& s) override { pool_.free(s); }
  std::int64_t used_bytes() const override { return pool_.used_bytes(); }
  std::int64_t budget_bytes() const override { return pool_.budget_bytes(); }
  std::int64_t bytes_for(std::int64_t tokens) const override { return pool_.bytes_for(tokens); }
  std::unique_ptr<models::Cache> fork(const ch11::Sequence& s) override { return pool_.fork(s); }
  std::string describe() const override { return pool_.describe(); }

 private:
  ch12::PagedPool& pool_;
  bool on_ = false;
  std::vector<StepRow> rows_;
  std::vector<bool> cow_;  // by block: a copy-on-write copy (only kept while watched)
};

/// The engine's watchers, and the snapshots they get.
class EngineWatch {
 public:
  explicit EngineWatch(ch12::PagedPool& pool);
  /// The pool the engine should run on.
  ch11::KVPool& pool() { return recorder_; }

  /// From any thread: a new watcher. It gets a snapshot at once (the engine thread is woken by
  /// the caller) and then one after every step; dropping the pointer ends the subscription.
  std::shared_ptr<Subscription> subscribe();
  std::int64_t watchers() const { return *count_; }
  /// Whether a new watcher waits for its first snapshot.
  bool wanted() const { return wanted_ && *count_ > 0; }

  // The engine thread's side.
  /// Before a step: notes its plan when someone watches.
  void begin_step() { recorder_.begin(*count_ > 0); }
  /// A request's first token came `seconds` after it arrived; a sample finished at `seconds` per token.
  void ttft(std::int64_t id, double seconds);
  void tpot(std::int64_t id, std::int64_t sample, double seconds);
  /// After an iteration of the loop: hands a snapshot to every watcher (nothing when none).
  /// `stepped`: the iteration ran a step; `waiting()`: sequences and requests queued (asked only
  /// when someone watches).
  void publish(const ch11::Engine& e, bool stepped, const std::function<std::int64_t()>& waiting);

 private:
  std::shared_ptr<const BlockMap> draw() const;

  ch12::PagedPool& blocks_;
  PlanRecorder recorder_;
  std::shared_ptr<std::atomic<std::int64_t>> count_ = std::make_shared<std::atomic<std::int64_t>>(0);
  std::atomic<bool> wanted_{false};
  mutable std::mutex mu_;  // guards subs_
  std::vector<std::weak_ptr<Subscription>> subs_;
  // The engine thread's own.
  std::int64_t steps_ = 0;
  std::vector<Latency> ttft_, tpot_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace inferlab::ch13
