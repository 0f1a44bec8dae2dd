#pragma once
/// @file hf_weights.h
/// @brief The checked tensor reader every Hugging Face model loader assembles its model with.

#include <set>
#include <string>

#include "common/hf_config.h"
#include "common/safetensors.h"

namespace inferlab::ch01 {

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

}  // namespace inferlab::ch01
