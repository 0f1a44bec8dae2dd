#pragma once
/// @file hf_weights.h
/// @brief The checked tensor reader every Hugging Face model loader assembles its model with.

#include <set>
#include <string>

#include "common/hf_config.h"
#include "common/models/llama.h"
#include "common/safetensors.h"

namespace inferlab::models {

/// A model folder's checkpoint, read tensor by tensor: each one checked for its shape, a dtype
/// the model can run (F32, F16, BF16) and finite values, its file named in every error; and
/// every name read remembered, so that a checkpoint holding tensors the config does not account
/// for is refused rather than run as part of a model.
class HfWeights {
 public:
  /// The checkpoint of `model_path` (a folder, or its config.json) described by `hf`; refuses an
  /// untied head without an lm_head tensor.
  HfWeights(const HfConfig& hf, const TransformerConfig& c, const std::string& model_path);
  Tensor operator()(const std::string& name, const Shape& shape);
  const Checkpoint& checkpoint() const { return ck_; }
  /// Throws naming the first tensor never read (RoPE's stored inv_freq, and a tied model's
  /// lm_head, which transformers ignores as well, excepted); `hint` ends the message.
  void check_all_used(const std::string& hint) const;

 private:
  std::string config_path_;
  bool tied_;
  Checkpoint ck_;
  std::set<std::string> used_;
};

/// A decoder under Hugging Face's tensor names, from a getter `get(name, shape)` (HfWeights, or
/// random draws): model.embed_tokens; per layer input_layernorm, the attention, post_attention_
/// layernorm and the SwiGLU MLP (with biases where the config's mlp_bias says); model.norm;
/// lm_head unless tied. The attention is the one part
/// that differs between families: `attention(prefix, i, layer)` reads layer i's (prefix
/// "model.layers.i."). RoPE frequencies are left to the caller.
template <class Get, class Attention>
Llama read_decoder(const TransformerConfig& c, Get&& get, Attention&& attention) {
  const std::int64_t D = c.hidden_size, F = c.intermediate_size;
  Llama m;
  m.config = c;
  m.embed = get("model.embed_tokens.weight", Shape{c.vocab_size, D});
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LlamaLayer l;
    l.attn_norm = get(p + "input_layernorm.weight", Shape{D});
    attention(p, i, l);
    l.mlp_norm = get(p + "post_attention_layernorm.weight", Shape{D});
    if (c.moe && c.moe->is_moe_layer(i)) {  // a mixture of experts in place of the MLP
      l.moe = read_moe(*c.moe, D, p, get);
      m.layers.push_back(l);
      continue;
    }
    l.w_gate = get(p + "mlp.gate_proj.weight", Shape{F, D});
    l.w_up = get(p + "mlp.up_proj.weight", Shape{F, D});
    l.w_down = get(p + "mlp.down_proj.weight", Shape{D, F});
    if (c.mlp_bias) {  // Llama's mlp_bias; kept in f32, as they are added to f32 activations
      l.w_gate.bias = get(p + "mlp.gate_proj.bias", Shape{F}).to(DType::F32);
      l.w_up.bias = get(p + "mlp.up_proj.bias", Shape{F}).to(DType::F32);
      l.w_down.bias = get(p + "mlp.down_proj.bias", Shape{D}).to(DType::F32);
    }
    m.layers.push_back(l);
  }
  m.final_norm = get("model.norm.weight", Shape{D});
  m.lm_head = c.tie_word_embeddings ? m.embed : get("lm_head.weight", Shape{c.vocab_size, D});
  return m;
}

}  // namespace inferlab::models
