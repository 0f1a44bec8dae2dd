#pragma once
/// @file ceiling.h
/// @brief What the machine can do (measured or datasheet ceilings) and the roofline against them.
///
/// roofline() takes the work counted in a CountScope (metrics.h) and the seconds it took, and
/// says how fast that was against this machine's measured bandwidth and FLOP/s: the lecture's
/// argument that decoding is memory-bound, as a number.

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/metrics.h"

namespace inferlab::metrics {

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

/// The ceilings of the device a run is on: measure_cuda_ceiling() or measure_cpu_ceiling().
Ceiling measure_ceiling(Device device);
/// Datasheet figures of common accelerators (dense bf16, HBM bandwidth), labelled as such.
std::vector<Ceiling> accelerator_presets();

}  // namespace inferlab::metrics
