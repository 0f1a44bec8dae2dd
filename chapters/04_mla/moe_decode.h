#pragma once
/// @file moe_decode.h
/// @brief Chapter 04's decode arithmetic of mixture-of-experts layers: the weight bytes a step
/// reads with k of E experts per token, against a dense FFN of the same active size and against
/// every expert, and how many experts a batch of B tokens touches (common/moe.h).

#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/moe_config.h"

namespace inferlab::ch04 {

/// The FFN weights of a model's MoE layers as one decode step reads them.
struct MoeShape {
  std::string name;
  std::int64_t hidden = 0;      ///< D
  std::int64_t moe_layers = 0;  ///< layers with experts (the dense ones before them are left out)
  MoeConfig moe;
  std::int64_t bytes_per_value = 2;  ///< bf16 weights
};

/// One row of the batch table: B tokens in one decode step.
struct MoeStep {
  std::int64_t batch = 0;       ///< B
  double experts_touched = 0;   ///< per layer: E·(1 − (1 − k/E)^B) expected under uniform routing
  double moe_bytes = 0;         ///< router + touched experts + shared, every MoE layer
  double dense_bytes = 0;       ///< a dense FFN of the same active width (k·Fe + Fs), every layer
  double all_expert_bytes = 0;  ///< router + all E experts + shared: the most a step can read
  double moe_flops = 0;         ///< 2 · B · active parameters: the same for the dense FFN
  double rows_per_expert = 0;   ///< B·k / experts touched: each read expert's reuse (dense: B)
};

/// The step at batch B of `s` (the expected number of experts touched).
MoeStep moe_step(const MoeShape& s, std::int64_t batch);

/// The bytes of the MoE layers' weights one decode step reads when `touched` distinct experts
/// run per layer.
double moe_step_bytes(const MoeShape& s, double touched);

/// The distinct experts a batch of B tokens touches on a model's recorded routing: `layers` holds
/// per MoE layer the experts each of T tokens chose ([T·k], token by token); a batch is B of the T
/// positions drawn without replacement (B sequences at one step are different tokens), and the
/// count is averaged over `draws` batches (seeded) and the layers.
double measured_experts_touched(const std::vector<std::vector<std::int32_t>>& layers, std::int64_t k, std::int64_t batch,
                                int draws = 200);

/// What the bare run prints: per model (DeepSeek-V2-Lite, DeepSeek-V3, Mixtral 8x7B by their
/// configs' numbers) the bytes per token at batch 1 against a dense FFN of the same active size
/// and against all experts, and the batch table; then experts touched measured on the routing of
/// a model with DeepSeek-V2-Lite's router (E = 64, k = 6; random weights) over a prompt, against
/// the uniform formula. Returned as JSON.
nlohmann::json moe_decode_table();

}  // namespace inferlab::ch04
