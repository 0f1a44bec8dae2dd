#pragma once
/// @file gqa.h
/// @brief Chapter 03: grouped-query attention. N query heads share K key/value heads.
///
/// Nothing in the attention op changes: query head h reads KV head h / (N/K) (ops.h). What
/// changes is what has to be stored and read: the KV cache shrinks by K/N, while every weight
/// (except the small k and v projections) stays. So the speed-up of a decode step is K/N only
/// where the cache dominates the bytes read: long contexts and large batches.

#include <algorithm>
#include <functional>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include "chapters/02_kv_cache/kv_cache.h"

#include "common/ceiling.h"
#include "common/metrics.h"

namespace inferlab::ch03 {

/// MHA (or GQA) -> GQA with `kv_heads` KV heads, without retraining: the K and V projection heads
/// of each group are averaged (mean pooling, the starting point of GQA uptraining in Ainslie et
/// al. 2023, section 2.1). Query heads keep their order: group g holds heads g·N/K .. (g+1)·N/K − 1.
ch01::Llama mean_pool_kv_heads(const ch01::Llama& m, std::int64_t kv_heads);

/// The inverse view: every KV head's projection rows repeated for each query head of its
/// group. The result is an MHA model computing exactly the same function.
ch01::Llama repeat_kv_heads(const ch01::Llama& m);

/// One decode step for a batch: sequence b feeds tokens[b] and owns *caches[b] (lengths may
/// differ). Chapter 02's batched forward pass: the rows share every matmul (one weight read for
/// the whole batch); attention reads each sequence's own cache. Returns logits [B, V].
Tensor decode_step(const ch01::Llama& m, const std::vector<ch02::KVCache*>& caches, const std::vector<std::int32_t>& tokens);

/// Fills positions [0, length) of an empty cache with pseudo-random values and commits them, so
/// a benchmark can decode at a long context without paying for the prefill.
void fill_cache(ch02::ContiguousKVCache& cache, std::int64_t length, std::uint64_t seed);

/// Fills f32 rows (a cache's storage, on any device) with pseudo-random values in [-1, 1).
void fill_random(Tensor& rows, std::uint64_t seed);

/// Bytes one decode step of a batch must read: the weights once, every sequence's cache so far
/// and the new position's keys and values (`lengths`: each sequence's cached positions).
double decode_step_bytes(const ch01::Llama& m, const std::vector<std::int64_t>& lengths, DType cache_dtype = DType::F32);

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

/// Times `steps` decode steps of a batch of `batch` sequences at `context` cached positions
/// (best of the steps, after one warm-up step).
ThroughputPoint measure_decode(const ch01::Llama& m, std::int64_t batch, std::int64_t context, int steps);

/// The timing itself, for any model and cache (chapter 05's shared caches too): one warm-up
/// `step()` whose FLOPs the ops count, then the best of `steps` timed ones.
ThroughputPoint time_decode(std::int64_t batch, double bytes_per_step, int steps, Device device,
                            const std::function<void()>& step);

}  // namespace inferlab::ch03
