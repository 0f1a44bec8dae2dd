#pragma once
/// @file metrics.h
/// @brief Counting work: FLOPs and bytes moved per op, and a stopwatch.
///
/// Every op in ops.h reports its FLOPs and the fewest bytes it must move (each input read once,
/// each output written once) to the innermost CountScope on the calling thread. A chapter
/// wraps one forward pass in a CountScope and times it; ceiling.h places the result against
/// what the machine can do.

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

/// What a Timer counts: the time on the wall, or the time the measured work ran.
enum class Clock {
  Wall,  ///< steady clock: what a user waits
  Work,  ///< the wall clock, except where the work runs on the calling thread alone (OpenMP on one
         ///< thread, on the CPU): then that thread's CPU time, so that other programs taking turns
         ///< on its core are not counted as the work's time (INFERLAB_CLOCK=wall: always the wall)
};

/// A stopwatch. A speed set against a ceiling times its work with Clock::Work: on a machine that
/// other work keeps busy, cli's wait_passively runs a program on one thread, and a thread that
/// shares its core runs in turns; its CPU time is the time its work took, and the ceiling,
/// measured the same way, stays comparable. Latencies a client sees (serving) keep Clock::Wall.
class Timer {
 public:
  explicit Timer(Clock clock = Clock::Wall) : cpu_(clock == Clock::Work && work_runs_alone()) { reset(); }
  /// Clock::Work for work on `on_cpu`'s device: the wall clock when the work runs on a GPU.
  static Timer work(bool on_cpu = true) { return Timer(on_cpu ? Clock::Work : Clock::Wall); }
  void reset() { start_ = now(); }
  double seconds() const { return now() - start_; }
  double ms() const { return seconds() * 1e3; }
  /// True when this Timer counts the calling thread's CPU time.
  bool counts_cpu_time() const { return cpu_; }
  /// OpenMP runs parallel regions on the calling thread alone (one thread).
  static bool work_runs_alone();

 private:
  double now() const;
  bool cpu_;
  double start_ = 0;
};

/// {"flops": ..., "bytes": ...}
nlohmann::json to_json(const Work& w);

}  // namespace inferlab::metrics
