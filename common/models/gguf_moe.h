#pragma once
/// @file gguf_moe.h
/// @brief Mixture-of-experts layers in llama.cpp's GGUF files: Mixtral (architecture llama with
/// expert tensors) and qwen2moe. llama.cpp stacks a layer's experts into one 3-D tensor per
/// matrix (ffn_gate_exps [E, Fe, D], ffn_up_exps [E, Fe, D], ffn_down_exps [E, D, Fe], outermost
/// first); the router is ffn_gate_inp [E, D]; qwen2moe's shared expert is ffn_{gate,up,down}_shexp
/// behind the gate ffn_gate_inp_shexp [D].

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.h"
#include "common/moe.h"

namespace inferlab::models {

/// The MoE hyper-parameters of a llama or qwen2moe GGUF (`<arch>.expert_count`,
/// `.expert_used_count`, `.expert_feed_forward_length`, `.expert_shared_feed_forward_length`),
/// or nothing when it has no experts. The layers with a router (ffn_gate_inp) are the MoE ones;
/// llama.cpp renormalises the k weights for llama (Mixtral) and not for qwen2moe. Throws naming
/// the key.
std::optional<MoeConfig> gguf_moe_config(const gguf::File& f, const std::string& arch, std::int64_t layers,
                                         std::int64_t intermediate_size);

/// Layer `layer`'s experts ("blk.<layer>."), each expert's matrices sliced out of the stacked
/// tensors in their stored type (plain, or packed for chapter 09's block types); the names read
/// are added to `used`.
MoeFfn read_gguf_moe(const gguf::File& f, const MoeConfig& c, std::int64_t D, std::int64_t layer,
                     std::set<std::string>& used);

/// One tensor of llama.cpp's stacked experts ([E, rows, cols], outermost first) from the E
/// experts' own outputs, which must agree in type and shape: their bytes one after another.
gguf::Output stack_experts(const std::string& name, const std::vector<gguf::Output>& experts);

/// The GGUF architecture an MoE model is written as, and the metadata of its experts: Mixtral
/// (no shared expert, renormalised weights, no biases) as llama; Qwen2-MoE (a gated shared
/// expert, weights not renormalised, q/k/v biases) as qwen2moe. Any other MoE model is refused
/// naming what llama.cpp's two architectures would compute differently.
std::string gguf_moe_architecture(const MoeConfig& c, bool qkv_bias);
std::vector<std::pair<std::string, gguf::Value>> gguf_moe_metadata(const MoeConfig& c, const std::string& arch);

}  // namespace inferlab::models
