#pragma once
/// @file metrics.h
/// @brief Timers, counted work (FLOPs and bytes moved), and the roofline against measured ceilings.
///
/// Every op in ops.h reports its FLOPs and the fewest bytes it must move (each input read once,
/// each output written once) to the innermost CountScope on the calling thread. A chapter
/// wraps one forward pass in a CountScope, times it, and hands both to roofline(), which says
/// how fast that was against this machine's measured bandwidth and FLOP/s: the lecture's
/// argument that decoding is memory-bound, as a number.

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

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
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double ms() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// A machine's two ceilings: memory read bandwidth and arithmetic throughput.
struct Ceiling {
  std::string name;        ///< "cpu (2 threads)", "NVIDIA H200", "H100 SXM"
  double bytes_per_s = 0;  ///< memory bandwidth
  double flops_per_s = 0;  ///< peak arithmetic rate for the dtype in `flops_dtype`
  std::string flops_dtype; ///< "f32", "bf16"
  std::string source;      ///< how it was obtained: "measured: ..." or "datasheet"
  double memory_bytes = 0; ///< memory capacity (0 when not known)
  /// FLOPs per byte where the two roofs meet (the lecture's "accelerator intensity").
  double ridge() const { return bytes_per_s > 0 ? flops_per_s / bytes_per_s : 0; }
};

/// One measured run placed on the roofline.
struct RooflinePoint {
  std::string label;
  Work work;
  double seconds = 0;
  Ceiling ceiling;
  double intensity() const { return work.bytes > 0 ? work.flops / work.bytes : 0; }
  double achieved_bytes_per_s() const { return seconds > 0 ? work.bytes / seconds : 0; }
  double achieved_flops_per_s() const { return seconds > 0 ? work.flops / seconds : 0; }
  /// The roofline's bound at this intensity: min(peak FLOP/s, bandwidth · intensity).
  double attainable_flops_per_s() const;
  /// "memory" when the intensity is below the ridge, else "compute".
  std::string bound() const;
  /// Achieved FLOP/s over attainable FLOP/s (1.0 means on the roof).
  double fraction_of_roof() const;
};

RooflinePoint roofline(std::string label, const Work& work, double seconds, const Ceiling& ceiling);

/// One line for humans: "12.1 GB/s = 70% of 17.3 GB/s (measured: ...); 0.4 GFLOP/s; memory-bound".
std::string describe(const RooflinePoint& p);
/// "1.50 GB/s", "512 MB/s", "3.2 TB/s" (decimal units, as bandwidths are quoted).
std::string human_rate(double per_s, const char* unit);
/// "1.00 GiB", "640 MiB" (binary units, as memory sizes are quoted).
std::string human_bytes(double bytes);

nlohmann::json to_json(const Work& w);
nlohmann::json to_json(const Ceiling& c);
nlohmann::json to_json(const RooflinePoint& p);

/// STREAM-style read bandwidth of this CPU: the best of `reps` passes summing a `bytes`-sized
/// float array with `threads` OpenMP threads (0: all). Use an array well beyond the caches.
double measure_cpu_read_bandwidth(std::size_t bytes = std::size_t(1) << 30, int threads = 0, int reps = 5);
/// f32 GEMM FLOP/s of this CPU through Eigen, n×n×n, best of `reps`.
double measure_cpu_matmul_flops(int n = 2048, int reps = 5);
/// Both, with a source string that says how they were measured.
Ceiling measure_cpu_ceiling(int threads = 0);
/// The CUDA device's ceilings: read bandwidth of a streaming kernel and cuBLAS bf16 GEMM.
/// Throws "no CUDA device available: ..." without one.
Ceiling measure_cuda_ceiling();

/// Datasheet figures of common accelerators (dense bf16, HBM bandwidth), labelled as such.
std::vector<Ceiling> accelerator_presets();

}  // namespace inferlab::metrics
