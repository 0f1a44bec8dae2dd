#pragma once
/// @file trace.h
/// @brief Chapter 11: workloads to serve, and what serving them measured.
///
/// A trace is a list of requests with arrival times: Poisson arrivals at a given rate, prompt and
/// output lengths drawn from log-normal distributions (heavy right tails, as in logs of real chat
/// traffic: most answers are short, a few are very long). Prompts are real text from the bundled
/// corpus. Everything is drawn from one seed with std::mt19937_64 and arithmetic written here, so
/// a seed gives the same trace with every standard library.
///
/// The report gives, over a finished engine run, the latencies a user feels (time to first token,
/// time per output token, end to end; their percentiles) and what the server achieves
/// (throughput, how full its batches were).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "chapters/11_continuous_batching/engine.h"

namespace inferlab::ch11 {

struct TraceSpec {
  std::int64_t requests = 48;
  double rate = 0;                                ///< requests per second (Poisson); 0: all arrive at once
  double prompt_median = 24, prompt_sigma = 0.8;  ///< log-normal prompt lengths, in tokens
  double output_median = 40, output_sigma = 1.0;  ///< log-normal output lengths (max_new_tokens)
  std::int64_t context = 512;                     ///< prompt + output never exceed it
  std::uint64_t seed = 1;
  SamplingParams sampling;  ///< every request's, its seed made unique per request
};

/// The trace's requests, in arrival order (ids 0, 1, ...). Prompts are slices of `text` (which
/// must hold at least the longest prompt); outputs run to their length (no stop ids).
std::vector<Request> make_trace(const TraceSpec& spec, const std::vector<std::int32_t>& text);

/// The lecture's worked example: requests of 10, 50 and 100 tokens at batch 3, followed by
/// `queued` more whose lengths repeat 10, 50, 100 (the queue continuous batching draws on).
/// Prompts of one token; every request arrives at time 0.
std::vector<Request> lecture_example(std::int64_t queued, std::int32_t token);

/// Percentiles by linear interpolation between order statistics (numpy's default).
struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  std::int64_t n = 0;
};
Summary summarize(std::vector<double> values);

/// What serving a trace measured.
struct Report {
  std::int64_t requests = 0, generated = 0, steps = 0, preemptions = 0;
  double makespan = 0;          ///< first arrival to last finish, on the engine's clock
  double busy = 0;              ///< clock spent in steps
  double throughput = 0;        ///< generated tokens per clock unit (over the makespan)
  Summary ttft, tpot, e2e;      ///< time to first token, per output token after the first, end to end
  double slot_utilisation = 0;  ///< Σ sequences per step / (cap × steps)
  double mean_batch = 0;        ///< sequences per step
  double peak_kv_bytes = 0;
  double bytes_read = 0;  ///< Σ over steps of the fewest bytes each had to read
  double flops = 0;       ///< Σ over steps of their FLOPs
  /// A step's measured seconds fitted as fixed + per_token × its tokens (least squares over the
  /// steps): what a step costs whatever its batch, and what each row adds. The lecture's argument
  /// for batching is that the first dominates.
  double step_fixed = 0, step_per_token = 0;
  /// Kernel launches and host–device copies a step queued on the GPU: the mean, and the fewest
  /// and most of any step (all 0 on the CPU). The batched step's launches do not grow with the batch.
  double launches_per_step = 0, copies_per_step = 0;
  std::int64_t launches_min = 0, launches_max = 0;
};
Report report(const Engine& e);
/// "kernel launches per step: 87 (87 to 87; 17.4 per layer), copies per step: 4.0": a report's
/// GPU work per step, for a model of `layers` layers.
std::string launches_line(const Report& r, std::int64_t layers);

/// The share of the batch's slots in use over time, from 0 to `end` on the engine's clock, as one
/// line of `width` characters (▁ … █; a space where no step ran).
std::string utilisation_line(const std::vector<StepRecord>& steps, std::int64_t cap, double end, int width);

nlohmann::json to_json(const Summary& s);
nlohmann::json to_json(const Report& r);

}  // namespace inferlab::ch11
