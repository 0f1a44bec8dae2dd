#pragma once
/// @file sequence.h
/// @brief Chapter 11: a request, the sequence it becomes, and the KV memory sequences share.
///
/// A server does not see a batch; it sees requests arriving one by one, each with its own prompt,
/// its own sampling parameters and its own idea of when to stop. Each becomes a Sequence: its
/// tokens so far, its sampler, and (while it runs) a KV cache taken from a KVPool, the budget of
/// KV memory every running sequence draws on. The scheduler (scheduler.h) decides every
/// iteration which sequences advance and by how many tokens; the engine (engine.h) runs them
/// through chapter 02's batched forward pass.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/models/model.h"
#include "common/sampling.h"

namespace inferlab::ch11 {

/// What a client sends: a prompt, how much to generate, how to sample, when to stop.
struct Request {
  std::int64_t id = 0;
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 32;
  SamplingParams sampling;             ///< its own temperature, top-k, top-p and seed
  std::vector<std::int64_t> stop_ids;  ///< it ends after sampling any of these (an EOS id)
  double arrival = 0;                  ///< when it arrives, on the engine's clock
  bool keep_logits = false;            ///< keep the logits of every sampled token (tests compare them)
  /// Parallel samples of the prompt (OpenAI's `n`): the prompt is computed once, and when its first
  /// token is sampled the sequence forks into `samples` sequences that share its cache (chapter
  /// 12's copy-on-write), sample i drawing with seed + i.
  int samples = 1;
};

/// A request inside the engine: everything it has so far, and where it stands.
struct Sequence {
  explicit Sequence(Request r);

  Request request;
  std::vector<std::int32_t> tokens;      ///< the prompt, then every generated token
  std::unique_ptr<models::Cache> cache;  ///< null while it waits (and after a preemption)
  Sampler sampler;
  int index = 0;  ///< which of the request's samples it is (0 for the one that computed the prompt)

  // What happened to it, on the engine's clock.
  double first_token_time = -1, finish_time = -1;
  std::vector<double> token_times;         ///< when each generated token was sampled
  std::vector<std::vector<float>> logits;  ///< with Request::keep_logits: the row each token was sampled from
  int preemptions = 0;

  std::int64_t prompt_tokens() const { return static_cast<std::int64_t>(request.prompt.size()); }
  std::int64_t generated() const { return static_cast<std::int64_t>(tokens.size()) - prompt_tokens(); }
  /// Positions its cache holds (0 without one).
  std::int64_t computed() const { return cache ? cache->length() : 0; }
  /// Tokens not yet through the model: the whole prompt before the first step, the rest of it
  /// during a chunked prefill, 1 (the last sampled token) while decoding, and after a preemption
  /// the prompt and everything generated (recomputation).
  std::int64_t pending() const { return static_cast<std::int64_t>(tokens.size()) - computed(); }
  /// The most positions it can ever hold: prompt + max_new_tokens.
  std::int64_t max_tokens() const { return prompt_tokens() + request.max_new_tokens; }
  bool done() const { return finish_time >= 0; }
  /// Whether it will fork into its request's other samples when its first token is sampled.
  bool forks_ahead() const { return index == 0 && request.samples > 1 && generated() == 0; }
  /// The running slots it takes once admitted: its own, and its forks' to come.
  std::int64_t slots() const { return forks_ahead() ? request.samples : 1; }
};

/// The KV memory the running sequences share, with a budget in bytes. It makes each sequence's
/// cache and charges for it; chapter 11 keeps each cache contiguous (engine.h's ContiguousPool),
/// chapter 12 pages them.
class KVPool {
 public:
  virtual ~KVPool() = default;
  /// Makes room for `n` more positions in s's cache (opening one if s has none) and charges the
  /// budget for it; returns false, charging and changing nothing, when the budget cannot. A pool
  /// that caches prefixes (chapter 12) may open the cache with some of s's tokens already in it.
  virtual bool reserve(Sequence& s, std::int64_t n) = 0;
  /// Takes s's cache back (it finished or was preempted): s.cache is null afterwards.
  virtual void free(Sequence& s) = 0;
  /// Bytes charged now, and the budget.
  virtual std::int64_t used_bytes() const = 0;
  virtual std::int64_t budget_bytes() const = 0;
  /// What one sequence of `tokens` positions costs alone: a request that could not fit even in
  /// an empty pool is refused when it is added.
  virtual std::int64_t bytes_for(std::int64_t tokens) const = 0;
  /// A cache holding the same positions as s's, for a parallel sample forked from it; null when
  /// this pool cannot share one (the fork then computes the prompt again). Chapter 12's pool
  /// shares every block, copying only the partly filled one when it is written.
  virtual std::unique_ptr<models::Cache> fork(const Sequence& s) { return nullptr; }
  /// "contiguous, max-length allocation, 8.00 MiB budget".
  virtual std::string describe() const = 0;
};

}  // namespace inferlab::ch11
