#pragma once
/// @file prometheus.h
/// @brief Chapter 13: the server's counters and histograms, in Prometheus' text format.
///
/// `GET /metrics` is how a server is watched: a scraper reads it every few seconds and plots
/// rates and quantiles. The lecture's three figures of merit are all here: time to first token
/// and time per output token as histograms (their quantiles are the latency a user feels), and
/// the generated-token counter, whose rate is the throughput.

#include <cstdint>
#include <string>
#include <vector>

namespace inferlab::ch13 {

/// A Prometheus histogram: counts of observations at most each bound, their sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// The `name_bucket{le=...}`, `name_sum` and `name_count` lines, with HELP and TYPE.
  std::string text(const std::string& name, const std::string& help) const;
  std::int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::int64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  std::int64_t count_ = 0;
};

/// `# HELP`, `# TYPE` and one sample line of a counter or gauge: "counter" or "gauge".
std::string metric_text(const std::string& name, const std::string& type, const std::string& help, double value);

/// Buckets for latencies from 1 ms to a minute, about ×2.5 apart.
std::vector<double> latency_buckets();

}  // namespace inferlab::ch13
