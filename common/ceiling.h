#pragma once
/// @file ceiling.h
/// @brief What the machine can do (measured or datasheet ceilings) and the roofline against them.
///
/// roofline() takes the work counted in a CountScope (metrics.h) and the seconds it took, and
/// says how fast that was against this machine's measured bandwidth and FLOP/s: the lecture's
/// argument that decoding is memory-bound, as a number.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/metrics.h"

namespace inferlab::metrics {

/// A rate measured over repetitions: the best, the median and the worst run. A ceiling is its
/// best run; the spread says how much the machine moved while it was measured (on a busy
/// machine, a lot), so that a figure and its ceiling can be read together.
struct Spread {
  double best = 0, median = 0, worst = 0;
  int runs = 0;
};
/// The spread of `rates` (higher is better).
Spread spread_of(std::vector<double> rates);
/// "17.3 GB/s (best of 5; median 16.0, worst 12.1)".
std::string describe(const Spread& s, const char* unit);

/// A machine's two ceilings: memory read bandwidth and arithmetic throughput.
struct Ceiling {
  std::string name;         ///< "cpu (2 threads)", "NVIDIA H200", "H100 SXM"
  double bytes_per_s = 0;   ///< memory bandwidth (read from memory: a working set beyond every cache)
  double flops_per_s = 0;   ///< peak arithmetic rate for the dtype in `flops_dtype`
  std::string flops_dtype;  ///< "f32", "bf16"
  std::string source;       ///< how it was obtained: "measured: ..." or "datasheet"
  double memory_bytes = 0;  ///< memory capacity (0 when not known)
  Spread read{};            ///< the runs behind bytes_per_s (empty for datasheet figures)
  Spread compute{};         ///< the runs behind flops_per_s (empty for datasheet figures)
  bool cpu = false;         ///< measured on this CPU: read_ceiling_for() can measure cache-sized ceilings
  /// FLOPs per byte where the two roofs meet (the lecture's "accelerator intensity").
  double ridge() const { return bytes_per_s > 0 ? flops_per_s / bytes_per_s : 0; }
};

/// The read ceiling a figure is compared with: the streaming read rate over as many bytes as the
/// figure's working set. A decode step whose weights fit in the last-level cache reads them from
/// the cache after the first step, so it is compared with what a plain sum reaches over an array
/// of its size in cache, never with the rate from memory (which it can exceed).
struct ReadCeiling {
  double working_set_bytes = 0;  ///< the figure's working set
  double measured_bytes = 0;     ///< the array the ceiling was measured over (within 10% of it)
  Spread rate;                   ///< bytes/s
  std::string kind;              ///< "in cache", "partly in cache" or "from memory"
  double bytes_per_s() const { return rate.best; }
  /// kind in a table cell: "cache", "part" or "mem".
  const char* abbrev() const { return kind == "in cache" ? "cache" : kind == "from memory" ? "mem" : "part"; }
};

/// One measured run placed on the roofline.
struct RooflinePoint {
  std::string label;
  Work work;
  double seconds = 0;
  Ceiling ceiling;
  /// The read roof of the point's own kind (read_ceiling_for its bytes): a working set in cache
  /// sits under the cache's roof, not the memory's.
  ReadCeiling read{};
  /// read's rate, or the device's memory bandwidth when read is not set.
  double read_bytes_per_s() const;
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

/// Places `work` done in `seconds` on the roofline of `ceiling`, with the read roof of its kind
/// (read_ceiling_for `working_set_bytes`; by default the work's bytes, as for one pass that reads
/// each byte once; a run of n passes over the same data passes one pass's bytes).
RooflinePoint roofline(std::string label, const Work& work, double seconds, const Ceiling& ceiling,
                       double working_set_bytes = -1);

/// One line for humans: "12.1 GB/s = 70% of 17.3 GB/s (measured: ...); 0.4 GFLOP/s; memory-bound".
std::string describe(const RooflinePoint& p);
/// "1.50 GB/s", "512 MB/s", "3.2 TB/s" (decimal units, as bandwidths are quoted).
std::string human_rate(double per_s, const char* unit);
/// "1.00 GiB", "640 MiB" (binary units, as memory sizes are quoted).
std::string human_bytes(double bytes);

nlohmann::json to_json(const Ceiling& c);
nlohmann::json to_json(const RooflinePoint& p);

/// The last-level cache of this CPU in bytes (sysfs, then sysconf; 32 MiB when neither says).
double last_level_cache_bytes();
/// "in cache" (at most half the last-level cache), "from memory" (at least twice it) or
/// "partly in cache" between the two.
std::string cache_kind(double working_set_bytes);

/// The read ceiling of the same kind as a figure with this working set on the machine of
/// `device`: for a CPU ceiling, the streaming read rate measured over an array of that size
/// (memoised per size, within 10%); for a GPU or datasheet ceiling, its memory bandwidth.
ReadCeiling read_ceiling_for(const Ceiling& device, double working_set_bytes);
/// read_ceiling_for() on this CPU, for a program that has not measured its ceilings otherwise.
ReadCeiling cpu_read_ceiling(double working_set_bytes);

/// "12.1 GB/s = 70% of 17.3 GB/s in cache (best of 5, worst 15.0)". A figure above its ceiling
/// is printed with the reason it can be (never silently above 100%): within the ceiling's spread
/// (the machine moved between the two measurements), or a working set that is only partly in
/// cache.
std::string against(double achieved_bytes_per_s, const ReadCeiling& c);
/// Achieved over the ceiling, in percent.
double percent_of(double achieved_bytes_per_s, const ReadCeiling& c);
/// A figure timed over many runs against a ceiling measured in turns with them (ReadPasses), like
/// against like: its median run over the ceiling's median, its best over the ceiling's best. "29.4
/// GB/s median of 64 = 85% of the sums' median 34.4 (best 30.8 = 87% of 35.5), from memory".
std::string against_in_turns(const Spread& achieved_bytes_per_s, const ReadCeiling& c);
/// The note against() appends for a figure above its ceiling ("" when at or below it).
std::string above_ceiling_note(double achieved_bytes_per_s, const ReadCeiling& c);
nlohmann::json to_json(const ReadCeiling& c);
nlohmann::json to_json(const Spread& s);

/// What a table's figures were compared with, printed under it: each distinct read ceiling with
/// its spread, and the reason for every figure above its ceiling.
class CeilingLegend {
 public:
  /// The figure's percent of `c`; remembers `c`, and the note of a figure above it under `label`.
  double percent(const std::string& label, double achieved_bytes_per_s, const ReadCeiling& c);
  /// "ceilings: in cache over 24 MiB 61.2 GB/s (best of 5; median 58.0, worst 40.1); ..." and the
  /// notes, each line after `pad`; nothing when the table used no ceiling.
  void print(const char* pad) const;

 private:
  std::vector<ReadCeiling> used_;
  std::vector<std::string> notes_;
};

/// STREAM-style read bandwidth of this CPU: the best of `reps` passes summing a `bytes`-sized
/// float array with `threads` OpenMP threads (0: all). Use an array well beyond the caches.
double measure_cpu_read_bandwidth(std::size_t bytes = std::size_t(1) << 30, int threads = 0, int reps = 5);
/// The same, every run kept: each run reads the array at least once and, for an array in cache,
/// often enough to last about 20 ms (the passes inside one parallel region, so that waking the
/// threads is not what is measured).
Spread measure_cpu_read_spread(std::size_t bytes, int threads = 0, int reps = 5);
/// A read ceiling taken in turns with the figure it is the ceiling of: one streaming pass at a time
/// over an array of a working set's size (first touched by the reading threads), run between the
/// figure's own runs (a step, a pass, a step, …). Both then see the same moments of a shared
/// machine and the same cache: where the two do not fit in it together, each pass evicts what the
/// last step left and each step what the last pass left, so a working set beyond the cache is read
/// from memory by both; where they fit, both read from the cache. The array is at most
/// memory_ceiling_bytes() (four times the last-level cache, at least 1 GiB, at most an eighth of
/// the memory), so that a large model's passes do not allocate its size again.
class ReadPasses {
 public:
  explicit ReadPasses(double working_set_bytes, int threads = 0);
  /// One pass over the array; its rate is kept.
  void run();
  /// The ceiling of the passes run so far: their spread, and its kind: in cache where the working
  /// set and the array fit in the last-level cache together, from memory where the working set
  /// alone fills it, else partly in cache.
  ReadCeiling ceiling() const;

 private:
  double working_set_;
  std::unique_ptr<float[]> a_;
  std::size_t n_;
  int threads_;
  std::vector<double> rates_;
};

/// The array size for a read ceiling "from memory": 4 × the last-level cache, at least 1 GiB,
/// at most an eighth of physical memory.
std::size_t memory_ceiling_bytes();
/// f32 GEMM FLOP/s of this CPU through Eigen, n×n×n, best of `reps`.
double measure_cpu_matmul_flops(int n = 2048, int reps = 5);
Spread measure_cpu_matmul_spread(int n = 2048, int reps = 5);
/// Both, with a source string that says how they were measured. `gemm_n` and `reps` trade time
/// for steadiness (a bare chapter run uses a 1024³ GEMM and 3 runs).
Ceiling measure_cpu_ceiling(int threads = 0, int gemm_n = 2048, int reps = 5);
/// The CUDA device's ceilings: read bandwidth of a streaming kernel and cuBLAS bf16 GEMM.
/// Throws "no CUDA device available: ..." without one.
Ceiling measure_cuda_ceiling();

/// The ceilings of the device a run is on: measure_cuda_ceiling() or measure_cpu_ceiling().
Ceiling measure_ceiling(Device device);
/// Datasheet figures of common accelerators (dense bf16, HBM bandwidth), labelled as such.
std::vector<Ceiling> accelerator_presets();

}  // namespace inferlab::metrics
