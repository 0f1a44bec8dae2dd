#pragma once
/// @file moe.h
/// @brief The mixture-of-experts FFN: a router picks k of E SwiGLU experts per token, their
/// outputs are summed with the router's weights, plus shared experts every token runs.
///
/// Per token (h the normed residual row, D wide):
///
///     logits = W_r h                       [E]  (the router, "gate")
///     s      = softmax(logits) or sigmoid(logits)
///     chosen = top k of s (+ bias, among the best groups: MoeGrouping)
///     w_j    = s_j for j in chosen, divided by their sum (norm_topk_prob), times routed_scaling_factor
///     out    = Σ_j w_j · down_j(silu(gate_j h) ⊙ up_j h)  +  [σ(g · h)] · shared(h)
///
/// A token reads k of the E experts' weights: a dense model of the same active width at batch 1.
/// A batch of B tokens reads every expert any of them chose, about E·(1 − (1 − k/E)^B) under
/// uniform routing: at batch, MoE decode reads nearly all experts for little arithmetic.
///
/// Two implementations behind one routing: `ref::moe_block` runs each token through its k
/// experts one row at a time (the formula above as a loop); `moe_block` groups the batch's rows by
/// expert, so each touched expert's weights are read once per call whatever the batch size.
/// Both run on the CPU; a model with MoE layers is refused on CUDA (models::Llama::to).

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/linear.h"
#include "common/moe_config.h"
#include "common/tensor.h"

namespace inferlab {

/// One SwiGLU FFN: down(silu(gate(h)) ⊙ up(h)).
struct Expert {
  Linear gate, up, down;  ///< [F, D], [F, D], [D, F]
  bool defined() const { return gate.defined(); }
};

/// One layer's MoE weights and its hyper-parameters. Undefined (no router) in a dense layer.
struct MoeFfn {
  MoeConfig config;
  Linear router;                ///< [E, D]
  Tensor score_bias;            ///< [E] f32 (DeepSeek-V3's e_score_correction_bias), or undefined
  std::vector<Expert> experts;  ///< E routed experts, [Fe, D] / [D, Fe]
  Expert shared;                ///< the shared experts as one SwiGLU of width Fs, or undefined
  Linear shared_gate;           ///< [1, D] (Qwen2-MoE), or undefined

  bool defined() const { return router.defined(); }
  /// Every matrix, for loops over all of them (dtype conversion, byte counts).
  std::vector<Linear*> linears();
  std::vector<const Linear*> linears() const;
};

/// The experts each row chose and their weights: row t's j-th choice is expert[t·k + j] with
/// weight[t·k + j] (in the order top-k returns them: best first).
struct MoeRouting {
  std::int64_t k = 0;
  std::vector<std::int32_t> expert;
  std::vector<float> weight;
  std::int64_t rows() const { return k == 0 ? 0 : static_cast<std::int64_t>(expert.size()) / k; }
};

/// The routing of the rows of h [T, D]: the router's logits, then per row its scores, choice
/// and weights (MoeConfig's rules, as transformers computes them).
MoeRouting route(const MoeFfn& f, const Tensor& h);

/// One row's choice from its router logits [E]: the pure function both paths share.
void route_row(const MoeConfig& c, const float* logits, const float* score_bias, std::int32_t* expert, float* weight);

/// The MoE FFN over the rows of h [T, D] -> [T, D], rows grouped by expert: each expert the batch
/// touched runs once over all of its rows.
Tensor moe_block(const MoeFfn& f, const Tensor& h);

namespace ref {
/// The same, token by token and expert by expert (one row at a time): what moe_block must equal.
Tensor moe_block(const MoeFfn& f, const Tensor& h);
}  // namespace ref

/// While alive, every moe_block / ref::moe_block on this thread first calls fn(f, routing): how
/// chapter 04 measures which experts a batch touches on a model's real routing.
class MoeRoutingHook {
 public:
  using Fn = std::function<void(const MoeFfn& f, const MoeRouting& routing)>;
  explicit MoeRoutingHook(Fn fn);
  ~MoeRoutingHook();
  MoeRoutingHook(const MoeRoutingHook&) = delete;
  MoeRoutingHook& operator=(const MoeRoutingHook&) = delete;

 private:
  friend MoeRouting route(const MoeFfn&, const Tensor&);
  Fn fn_;
  MoeRoutingHook* parent_;
};

/// The number of distinct experts B tokens touch in expectation when each picks k of E
/// uniformly at random: E·(1 − (1 − k/E)^B).
double expected_experts_touched(std::int64_t E, std::int64_t k, std::int64_t B);

/// The MoE weights of one layer under Hugging Face's names (`prefix` "model.layers.i."), from a
/// getter get(name, shape) as models::read_decoder takes (the checkpoint, or random draws).
template <class Get>
MoeFfn read_moe(const MoeConfig& c, std::int64_t D, const std::string& prefix, Get&& get) {
  MoeFfn f;
  f.config = c;
  const std::int64_t E = c.num_experts, Fe = c.expert_size, Fs = c.shared_size;
  const bool mixtral = c.names == MoeNames::Mixtral;
  const std::string p = prefix + (mixtral ? "block_sparse_moe." : "mlp.");
  f.router = get(p + "gate.weight", Shape{E, D});
  if (c.score_bias) f.score_bias = get(p + "gate.e_score_correction_bias", Shape{E}).to(DType::F32);
  // Mixtral's experts name their matrices w1 (gate), w3 (up) and w2 (down).
  const std::array<const char*, 3> n = mixtral ? std::array<const char*, 3>{"w1", "w3", "w2"}
                                               : std::array<const char*, 3>{"gate_proj", "up_proj", "down_proj"};
  auto expert = [&](const std::string& e, std::int64_t F) {
    return Expert{get(e + n[0] + ".weight", Shape{F, D}), get(e + n[1] + ".weight", Shape{F, D}),
                  get(e + n[2] + ".weight", Shape{D, F})};
  };
  for (std::int64_t j = 0; j < E; ++j) f.experts.push_back(expert(p + "experts." + std::to_string(j) + ".", Fe));
  if (Fs > 0) f.shared = expert(p + (c.names == MoeNames::Qwen2Moe ? "shared_expert." : "shared_experts."), Fs);
  if (c.shared_gate) f.shared_gate = get(p + "shared_expert_gate.weight", Shape{1, D});
  return f;
}

}  // namespace inferlab
