#pragma once
/// @file workload.h
/// @brief Chapter 00: the lecture's arithmetic of inference, as functions.
///
/// Notation follows the lecture (and the Scaling Book): B batch, S context (prompt) length,
/// T tokens processed in this pass, D model width, F MLP width, N query heads, K KV heads,
/// H head dimension, L layers, V vocabulary. `w` is bytes per element (2 for bf16).

#include <cstdint>
#include <string>
#include <vector>

#include "common/ceiling.h"
#include "common/hf_config.h"

namespace inferlab::ch00 {

/// FLOPs and bytes moved by one piece of work.
struct Cost {
  double flops = 0, bytes = 0;
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }
  Cost& operator+=(const Cost& o) {
    flops += o.flops, bytes += o.bytes;
    return *this;
  }
};

/// Y = X·W with X (B×D), W (D×F): 2BDF FLOPs; read X and W, write Y, each once.
Cost matmul_cost(double B, double D, double F, double w = 2);

/// The gated MLP (up, gate, down) over B·T tokens, in the lecture's accounting:
/// 6BTDF FLOPs; bytes 2w·BTD (read x, write y) + 2w·BTF (write and read the gated hidden
/// state) + 3w·DF (the three weights). With w = 2: 4BTD + 4BTF + 6DF.
Cost mlp_cost(double B, double T, double D, double F, double w = 2);

/// Attention with FlashAttention (scores never leave the chip): T queries against S keys for
/// each of B sequences; N query heads, K KV heads of size H. FLOPs 4·B·S·T·N·H (QKᵀ and PV);
/// bytes w·(2·B·T·N·H + 2·B·S·K·H) (read Q, write O; read K and V). With K = N and NH = D:
/// 4BSTD FLOPs and 4BTD + 4BSD bytes, the lecture's numbers.
Cost attention_cost(double B, double S, double T, double N, double K, double H, double w = 2);

/// One forward pass of a Llama-family model over T new tokens per sequence with S tokens of
/// context (S ≥ T; prefill is T = S, a decode step is T = 1): every weight read once, the
/// KV cache read once, activations written and read once between layers.
Cost forward_cost(const TransformerConfig& c, double B, double S, double T, double w = 2);

// KV-cache bytes per sequence: TransformerConfig::kv_cache_bytes(S, w), the one formula.
/// Parameter bytes.
std::int64_t param_bytes(const TransformerConfig& c, std::int64_t w = 2);
/// Largest batch whose KV caches fit beside the weights in `memory` bytes; -1 when the weights
/// alone do not fit.
std::int64_t max_batch(const TransformerConfig& c, std::int64_t S, double memory, std::int64_t w = 2);

/// The lecture's memory-bound model of one decode step at batch B: every parameter and every
/// sequence's KV cache is read once per generated token.
struct LatencyPoint {
  std::int64_t batch = 0;
  double memory_bytes = 0;  ///< params + B · KV(S)
  double latency_s = 0;     ///< memory / bandwidth
  double throughput = 0;    ///< B / latency, tokens per second
  double compute_s = 0;     ///< forward FLOPs / peak: the other roof, for comparison
  bool fits = true;         ///< memory_bytes ≤ the accelerator's capacity
};
LatencyPoint memory_bound_latency(const TransformerConfig& c, std::int64_t S, std::int64_t B, const metrics::Ceiling& acc,
                                  std::int64_t w = 2);

/// A named model with its published dimensions.
struct NamedModel {
  std::string name;
  TransformerConfig config;
  std::string source;  ///< where the dimensions come from
};
/// Llama-2 7B/13B/70B, Llama-3 8B/70B, Llama-3.1 405B (their config.json values).
const std::vector<NamedModel>& named_models();
/// A named model (case-insensitive; "llama-2-13b", "llama3-8b" ...) or, failing that, a path
/// to a config.json or a model folder. Throws listing the known names.
TransformerConfig find_model(const std::string& name_or_path);
/// The accelerator presets by short name: "h100", "h200", "a100".
metrics::Ceiling find_accelerator(const std::string& name);

}  // namespace inferlab::ch00
