#pragma once
/// @file server.h
/// @brief Chapter 13: chapter 11's engine on chapter 12's paged pool, running on the wall clock
/// for requests that arrive from many threads at once.
///
/// One engine thread owns the engine. Request threads (one per HTTP connection) never touch it:
/// they check a request, hand it over through the inbox, and read what it produces from a
/// Channel of its own. Each iteration the engine thread takes in what arrived, drops what the
/// clients gave up on, runs one step of the batch, and turns each sample's new tokens into text
/// for its channel. This is the shape of vLLM's and TGI's servers: a scheduler loop that owns
/// the GPU (here the CPU), and front ends that only queue and stream.
///
/// Nothing accepted is lost: every request that submit() took ends with a finishing Event on its
/// channel for each of its samples (stop, length, abort or error), and submit() refuses, rather
/// than queues without bound, when the waiting queue is full or the server is draining.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chapters/11_continuous_batching/engine.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "chapters/13_serving/engine_events.h"
#include "chapters/13_serving/output_text.h"
#include "chapters/13_serving/prometheus.h"

namespace inferlab::ch13 {

struct ServerConfig {
  ch11::SchedulerConfig scheduler{ch11::Policy::Continuous, 16, 256};  ///< --max-num-seqs, --max-batched-tokens
  std::int64_t kv_budget_bytes = 64 << 20;                             ///< --kv-budget
  std::int64_t block_size = 16;                                        ///< --block-size
  bool prefix_caching = true;
  std::int64_t max_waiting = 64;  ///< requests accepted and not yet running, at most (then 429)
  /// Called on the engine thread after each step, once its events are out (left empty, nothing
  /// is called). A test holds the engine here until a watcher has seen a step, whatever the load.
  std::function<void(const ch11::Engine&)> after_step;
};

/// What a request's client receives from the engine thread, in order.
struct Event {
  std::int64_t index = 0;     ///< which sample
  std::string text;           ///< its new text
  std::int64_t tokens = 0;    ///< tokens it has generated so far
  std::string finish_reason;  ///< "" while it runs; then "stop", "length", "abort" or "error"
  std::string error;          ///< with "error": what went wrong
};

/// The way from the engine thread to one request's thread.
class Channel {
 public:
  void push(Event e);
  /// Waits up to `timeout` for events and takes every one that is there (none on a timeout).
  std::vector<Event> pop(std::chrono::milliseconds timeout);
  /// The client went away: the engine thread aborts the request at its next iteration.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

/// The server's gauges, as the engine thread last saw them.
struct Gauges {
  std::int64_t running = 0, waiting = 0;  ///< sequences running; requests queued (inbox and scheduler)
  std::int64_t blocks_used = 0, blocks_total = 0, prefix_hit_blocks = 0;
  std::int64_t slots_used = 0, slots_total = 0;  ///< fixed slots (a window's rings, a recurrent state)
  std::vector<std::int64_t> bytes_by_kind;       ///< KV bytes held by the layers of each models::LayerKind
  std::int64_t in_flight = 0;                    ///< requests accepted and not yet finished
};

class Server {
 public:
  /// Serves `m` (which must outlive it), any architecture the core loads, with `tok`; a sample
  /// ends at any of `eos` unless the request ignores it. The pool is chapter 12's for the model's
  /// layers (hybrid_cache.h); prefix caching, asked for by `c`, stays off for a model with a
  /// fixed slot (prefix_caching() says which). Starts the engine thread.
  Server(const models::Model& m, const Tokenizer& tok, std::vector<std::int64_t> eos, const ServerConfig& c);
  /// A Llama-family decoder (kept by reference: it must outlive the server).
  Server(const models::Llama& m, const Tokenizer& tok, std::vector<std::int64_t> eos, const ServerConfig& c);
  /// Drains (see drain()) with no time to wait, then stops the engine thread.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// A request as the engine takes it: checks what depends on the model (ApiError 400 naming
  /// the field: a prompt beyond the context, token ids outside the vocabulary, more KV memory
  /// than the whole pool, more samples than running slots) and gives it an id. `prompt_field`
  /// names the prompt in errors ("prompt" or "messages").
  ch11::Request make_request(std::vector<std::int32_t> prompt, const std::string& prompt_field,
                             std::optional<std::int64_t> max_tokens, std::int64_t default_max_tokens,
                             const SamplingParams& sampling, std::int64_t n, bool ignore_eos) const;
  /// Queues a request made by make_request, from any thread; its text ends before any of `stop`.
  /// Throws ApiError 429 when the waiting queue is full, 503 while draining.
  std::shared_ptr<Channel> submit(ch11::Request r, std::vector<std::string> stop);
  /// Stops taking requests (submit() answers 503), lets those in flight finish for up to
  /// `seconds`, then aborts what is left; returns when nothing is in flight.
  void drain(double seconds);
  bool draining() const { return draining_; }

  Gauges gauges() const;
  /// Everything, in Prometheus' text format.
  std::string metrics() const;
  /// Counts a request refused before it was queued (a 4xx or 5xx answer).
  void count_rejected() { ++rejected_; }
  /// From any thread: the engine's snapshots, the first at once, then one after every step
  /// (engine_events.h). Dropping the pointer ends the subscription.
  std::shared_ptr<Subscription> watch();
  std::int64_t watchers() const { return watch_.watchers(); }

  const models::Model& model() const { return m_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const ServerConfig& config() const { return c_; }
  /// Positions a sequence may reach (a model without a limit, Mamba: as many as an int holds).
  std::int64_t context() const;
  const ch12::PagedPool& pool() const { return pool_; }
  /// Whether prefix caching is on: asked for, and possible for this model's layers.
  bool prefix_caching() const { return pool_.prefix_caching(); }

 private:
  Server(std::unique_ptr<models::Model> owned, const models::Model* m, const Tokenizer& tok, std::vector<std::int64_t> eos,
         const ServerConfig& c);
  struct Job {
    ch11::Request request;
    std::vector<std::string> stop;
    std::shared_ptr<Channel> channel;
    std::chrono::steady_clock::time_point received;
  };
  struct Sample {
    std::unique_ptr<OutputText> text;
    std::int64_t delivered = 0;  // generated tokens turned into text so far
    bool done = false;
    std::chrono::steady_clock::time_point first_token;
  };
  struct Live {
    Job job;
    std::vector<Sample> samples;
    std::int64_t finished = 0;
    bool first_token_seen = false;
    std::string error;  // set when the engine failed under it
  };

  void loop();
  void take_inbox();
  // Turns s's new tokens into text for its client; true when a stop string ended it.
  bool deliver(ch11::Sequence& s, bool last);
  void finish(ch11::Sequence& s);
  void end_sample(Live& l, std::int64_t index, const std::string& reason, const std::string& error = "");
  void fail_everything(const std::string& why);
  void publish_gauges();

  std::unique_ptr<models::Model> owned_;  // the Llama constructor's wrapper
  const models::Model& m_;
  const Tokenizer& tok_;
  std::vector<std::int64_t> eos_;
  ServerConfig c_;
  ch12::PagedPool pool_;
  EngineWatch watch_{pool_};  // the engine runs on its pool: chapter 12's, with each step's plan noted
  ch11::Engine engine_;
  std::map<std::int64_t, Live> live_;  // engine thread only

  mutable std::mutex mu_;  // guards inbox_, gauges_ and the histograms
  std::condition_variable wake_;
  std::vector<Job> inbox_;
  Gauges gauges_;
  Histogram ttft_{latency_buckets()}, tpot_{latency_buckets()};
  std::map<std::string, std::int64_t> finished_by_reason_;

  mutable std::atomic<std::int64_t> next_id_{1};
  std::atomic<std::int64_t> accepted_{0}, rejected_{0}, prompt_tokens_{0}, generated_tokens_{0};
  std::atomic<std::int64_t> in_flight_{0};
  std::atomic<bool> draining_{false}, stopping_{false}, abort_all_{false};
  std::thread thread_;
};

}  // namespace inferlab::ch13
