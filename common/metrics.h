#pragma once
/// @file metrics.h
/// @brief Counting work: FLOPs and bytes moved per op, and a stopwatch.
///
/// Every op in ops.h reports its FLOPs and the fewest bytes it must move (each input read once,
/// each output written once) to the innermost CountScope on the calling thread. A chapter
/// wraps one forward pass in a CountScope and times it; ceiling.h places the result against
/// what the machine can do.

#include <chrono>
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace inferlab::metrics {

/// Work done: floating-point operations (a multiply-add is 2) and bytes moved through memory.
struct Work {
  double flops = 0;
  double bytes = 0;
  Work& operator+=(const Work& o) {
    flops += o.flops;
    bytes += o.bytes;
    return *this;
  }
};

/// Adds work, under the name of the op that did it ("matmul", "attention", ...), to the
/// innermost active CountScope of this thread (no-op when there is none).
void count(const char* op, double flops, double bytes);

/// Collects the work of every op called on this thread while it is alive. Scopes nest: an
/// inner scope's work is added to the outer one when the inner one ends.
class CountScope {
 public:
  CountScope();
  ~CountScope();
  CountScope(const CountScope&) = delete;
  CountScope& operator=(const CountScope&) = delete;
  const Work& work() const { return work_; }
  /// The same work split by op name.
  const std::map<std::string, Work>& by_op() const { return by_op_; }

 private:
  friend void count(const char*, double, double);
  Work work_;
  std::map<std::string, Work> by_op_;
  CountScope* parent_;
};

/// Wall-clock stopwatch (steady clock).
class Timer {
 public:
  Timer() { reset(); }
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  double ms() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// {"flops": ..., "bytes": ...}
nlohmann::json to_json(const Work& w);

}  // namespace inferlab::metrics
