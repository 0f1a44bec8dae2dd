#pragma once
/// @file batch_decode.h
/// @brief Chapter 02's batch step as a decode benchmark: B sequences, each with its own cache
/// filled to a given context, decoding one token each, timed against the bytes they must read.
///
/// The throughput tables of later chapters (03's MHA/GQA/MQA sweep, 07's Llama baseline) run
/// this; chapter 05 fills its shared caches' storage with `fill_cache`. The timing and the
/// roofline figures are common/decode_bench.h's.

#include <cstdint>
#include <vector>

#include "common/decode_bench.h"
#include "common/models/kv_cache.h"

namespace inferlab::models {

/// One decode step for a batch: sequence b feeds tokens[b] and owns *caches[b] (lengths may
/// differ). The batched forward pass with one token per sequence: the rows share every matmul
/// (one weight read for the whole batch); attention reads each sequence's own cache. Returns
/// logits [B, V].
Tensor decode_step(const models::Llama& m, const std::vector<models::KVCache*>& caches,
                   const std::vector<std::int32_t>& tokens);

/// Fills positions [0, length) of an empty cache with pseudo-random values and commits them, so
/// a benchmark can decode at a long context without paying for the prefill.
void fill_cache(models::ContiguousKVCache& cache, std::int64_t length, std::uint64_t seed);

/// Times `steps` decode steps of a batch of `batch` sequences at `context` cached positions
/// (best of the steps, after one warm-up step), with the bytes decode_step_bytes counts.
ThroughputPoint measure_decode(const models::Llama& m, std::int64_t batch, std::int64_t context, int steps);

}  // namespace inferlab::models
