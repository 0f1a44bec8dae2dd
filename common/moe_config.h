#pragma once
/// @file moe_config.h
/// @brief The hyper-parameters of a mixture-of-experts FFN (Mixtral, Qwen2-MoE, DeepSeek-V2/V3):
/// how many experts, how a token picks k of them, which layers have them. The block itself is
/// common/moe.h; TransformerConfig::moe holds one of these when the config has MoE layers.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace inferlab {

struct HfConfig;
struct TransformerConfig;

/// Where a family keeps its MoE tensors (Hugging Face names under "model.layers.i.").
enum class MoeNames {
  Mixtral,   ///< block_sparse_moe.gate, block_sparse_moe.experts.j.{w1, w3, w2} (gate, up, down)
  Qwen2Moe,  ///< mlp.gate, mlp.experts.j.{gate,up,down}_proj, mlp.shared_expert.*, mlp.shared_expert_gate
  DeepSeek,  ///< mlp.gate (+ e_score_correction_bias in V3), mlp.experts.j.*, mlp.shared_experts.*
};

/// How a router's logits become the scores experts are chosen by and weighted with.
enum class MoeScoring {
  Softmax,  ///< softmax over all E experts (Mixtral, Qwen2-MoE, DeepSeek-V2)
  Sigmoid,  ///< sigmoid of each logit on its own (DeepSeek-V3)
};

/// Which experts a token may choose from before its top k are taken.
enum class MoeGrouping {
  None,          ///< all E (Mixtral, Qwen2-MoE, DeepSeek-V2's topk_method "greedy")
  GroupMax,      ///< E split into n_group groups ranked by their best score; the topk_group best groups
                 ///< (DeepSeek-V2's "group_limited_greedy")
  GroupTop2Sum,  ///< groups ranked by the sum of their two best biased scores (DeepSeek-V3's "noaux_tc")
};

struct MoeConfig {
  MoeNames names = MoeNames::Mixtral;
  std::int64_t num_experts = 0;  ///< E: routed experts per MoE layer
  std::int64_t top_k = 0;        ///< k: experts each token runs
  std::int64_t expert_size = 0;  ///< Fe: each routed expert's SwiGLU width
  std::int64_t shared_size = 0;  ///< Fs: the shared expert(s)' total width, run by every token; 0 = none
  bool shared_gate = false;      ///< Qwen2-MoE: the shared expert's output times sigmoid(w · h)
  MoeScoring scoring = MoeScoring::Softmax;
  MoeGrouping grouping = MoeGrouping::None;
  std::int64_t n_group = 1;     ///< groups of E / n_group experts (grouped routing only)
  std::int64_t topk_group = 1;  ///< groups a token may pick from
  /// DeepSeek-V3: a per-expert bias added to the scores for choosing only (the weights are the
  /// unbiased scores): e_score_correction_bias.
  bool score_bias = false;
  /// Divide the k chosen weights by their sum (Mixtral always; Qwen2-MoE and V3 by config).
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1;  ///< the chosen weights times this (DeepSeek)
  /// Which layers are MoE: layer i is when i >= first_dense and (i + 1) % sparse_step == 0 and
  /// i is not listed in dense_layers (DeepSeek: first_k_dense_replace; Qwen2-MoE:
  /// decoder_sparse_step, mlp_only_layers; Mixtral: all). The others run the dense MLP of
  /// width intermediate_size.
  std::int64_t first_dense = 0;
  std::int64_t sparse_step = 1;
  std::vector<std::int64_t> dense_layers;

  bool is_moe_layer(std::int64_t layer) const;
  /// Parameters of one MoE FFN in a model of width D: router (+ shared gate), every expert, shared.
  std::int64_t layer_parameters(std::int64_t D) const;
  /// Parameters one token's pass through it reads: router (+ shared gate), k experts, shared.
  std::int64_t active_parameters(std::int64_t D) const;
  /// The router's parameters (+ Qwen2-MoE's shared gate, V3's score bias): read by every token.
  std::int64_t router_parameters(std::int64_t D) const;
  /// Throws naming `where` and the field when a count is out of range or the fields disagree
  /// (k ≤ E, n_group divides E, topk_group ≤ n_group, ...).
  void validate(const std::string& where, std::int64_t num_layers) const;
};

/// The MoE fields of a config.json, or nothing when the model has no MoE layer (a Llama, a
/// DeepSeek whose first_k_dense_replace covers every layer). `c` is the config parsed so far
/// (its architecture and num_layers). Fields transformers ignores but the model's own code
/// would honour (DeepSeek-V2's norm_topk_prob, V3's scoring_func) are refused by name rather
/// than run one way or the other.
std::optional<MoeConfig> parse_moe_config(const HfConfig& hf, const TransformerConfig& c);

/// Whether `arch` is a mixture-of-experts architecture whose attention is Llama's, so chapters
/// 01 and 02 run it (MixtralForCausalLM, Qwen2MoeForCausalLM).
bool moe_llama_family(const std::string& arch);

}  // namespace inferlab
