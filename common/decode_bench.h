#pragma once
/// @file decode_bench.h
/// @brief Measuring decode steps: the bytes a batched step must read, random cache contents, the
/// timing of a step and its figures against the roofline.
///
/// The chapters that compare a technique's decode speed with its prediction (03 GQA, 05 CLA,
/// 06 local attention, 07 Mamba) and the engine that reports its own (11, 13) share these:
/// whatever the model and its cache, a step is timed the same way and judged against the same
/// memory-bound model and roofline. The model-specific part, a batch of chapter 02 caches filled
/// and decoded, is chapter 02's `measure_decode` (common/models/batch_decode.h).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/ceiling.h"
#include "common/hf_config.h"
#include "common/tensor.h"

namespace inferlab {

/// Bytes one decode step of a batch must read: the weights once (`weight_bytes`, the model's
/// step_weight_bytes()), every sequence's cache so far and the new position's keys and values
/// (`lengths`: each sequence's cached positions; `c` the model's shape).
double decode_step_bytes(double weight_bytes, const TransformerConfig& c, const std::vector<std::int64_t>& lengths,
                         DType cache_dtype = DType::F32);

/// Fills f32 rows (a cache's storage, on any device) with pseudo-random values in [-1, 1), so a
/// benchmark can decode at a long context without paying for the prefill.
void fill_random(Tensor& rows, std::uint64_t seed);

/// A measured batch size against the roofline's prediction.
struct ThroughputPoint {
  std::int64_t batch = 0;
  double seconds_per_step = 0;
  double bytes_per_step = 0;  ///< weights once + every sequence's cache
  double flops_per_step = 0;  ///< as the ops counted them
  double tokens_per_s() const { return static_cast<double>(batch) / seconds_per_step; }
  double achieved_bytes_per_s() const { return bytes_per_step / seconds_per_step; }
  /// B / (bytes per step / bandwidth): the lecture's memory-bound model.
  double memory_bound_tokens_per_s(double bandwidth) const {
    return static_cast<double>(batch) * bandwidth / bytes_per_step;
  }
  /// B / max(bytes / bandwidth, FLOPs / peak): the roofline, which also knows that a large
  /// enough batch turns the matmuls compute-bound (on a CPU, whose ridge is a few FLOP per byte,
  /// already at a handful of sequences).
  double roofline_tokens_per_s(double bandwidth, double peak) const {
    return static_cast<double>(batch) / std::max(bytes_per_step / bandwidth, flops_per_step / peak);
  }
};

/// A point's figures for --json: tokens/s measured and by both models against the read ceiling
/// of its kind (`read`) and the FLOP peak, the bytes, FLOPs and seconds of a step, the ceiling.
nlohmann::json to_json(const ThroughputPoint& p, const metrics::ReadCeiling& read, double peak_flops);

/// Times a decode step of any model and cache: one warm-up `step()` whose FLOPs the ops count,
/// then the best of `steps` timed ones (`device`'s queue drained before each clock stops).
ThroughputPoint time_decode(std::int64_t batch, double bytes_per_step, int steps, Device device,
                            const std::function<void()>& step);

}  // namespace inferlab
