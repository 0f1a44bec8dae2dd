#pragma once
/// @file cuda_decode.h
/// @brief Chapter 02 on the GPU: the decode step the way fast engines run it.
///
/// Decoding one token reads every weight once, so its speed is the memory bandwidth. This
/// decoder keeps the weights in bf16 (half the bytes of f32) and does its arithmetic in f32, and
/// cuts everything that is not weight reading:
/// - one GEMV family streams each weight row in 16-byte loads, several in flight per lane;
///   q, k and v come from one launch, gate and up from one launch with SwiGLU applied in it,
///   and the output projections add straight into the residual stream; its version 3 (the
///   default, cuda::gemv_version() when the decoder is constructed) folds each RMSNorm into the
///   product after it;
/// - RoPE on q and k and the write of k and v into the cache are one kernel;
/// - attention over the cache is split into chunks of 256 positions computed in parallel
///   and merged with their softmax statistics (flash-decoding), so a long context still fills
///   the GPU;
/// - the whole step (all layers, the head, the argmax) is captured once into a CUDA graph and
///   replayed per token; the token and the position live in device memory.
/// Prefill runs chapter 02's forward_cached on the GPU (cuBLAS GEMMs) into the same cache.

#include <memory>
#include <vector>

#include "common/models/kv_cache.h"

namespace inferlab::ch02 {

class CudaDecoder {
 public:
  /// `m` must live on the GPU with bf16 matrices (models::Llama::to(Device::CUDA, DType::BF16)),
  /// and outlive the decoder. `capacity` is the longest sequence it will hold.
  CudaDecoder(const models::Llama& m, std::int64_t capacity, bool use_graph = true);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  /// Runs the prompt through forward_cached; returns the last position's logits [1, V] (GPU).
  Tensor prefill(const std::vector<std::int32_t>& tokens);
  /// One decode step for `token` at the next position; returns its logits [1, V] (GPU).
  Tensor step(std::int32_t token);
  /// `n` greedy steps starting from `token` without leaving the GPU between them; returns
  /// the n tokens chosen.
  std::vector<std::int32_t> greedy(std::int32_t token, int n);

  std::int64_t length() const;
  const models::ContiguousKVCache& cache() const;
  /// Bytes a decode step must read at the current length: weights plus the cache so far.
  double step_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Chapter 02's split-K decode attention on its own (for chapter 03's comparison): one query row
/// q [1, N, H] against the first `len` positions of a cache k, v [S, K, H] (CUDA, f32), one block
/// per query head and chunk of 256 positions; out [1, N, H]. Query head h reads KV head h/(N/K),
/// so a group's KV head is fetched once per query head.
void decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out);

}  // namespace inferlab::ch02
