#include "common/models/hf_weights.h"

#include <filesystem>

#include "common/json_file.h"

namespace inferlab::models {

namespace fs = std::filesystem;

HfWeights::HfWeights(const HfConfig& hf, const TransformerConfig& c, const std::string& path)
    : config_path_(hf.path),
      tied_(c.tie_word_embeddings),
      ck_(fs::is_directory(path) ? path : fs::path(path).parent_path().string()) {
  // Said by the config, missing from the checkpoint: refused by field rather than run without.
  IL_CHECK(c.tie_word_embeddings || ck_.contains("lm_head.weight"), hf.path, ": field 'tie_word_embeddings' is false",
           JsonFields(hf.json, hf.path).has("tie_word_embeddings") ? "" : " (its default)", " but ", ck_.path(),
           " has no tensor 'lm_head.weight'");
}

Tensor HfWeights::operator()(const std::string& n, const Shape& s) {
  used_.insert(n);
  Tensor t = ck_.get(n, s);
  IL_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16, ck_.file(n), ": tensor '", n,
           "' is ", safetensors_dtype_name(t.dtype()), "; model weights must be F32, F16 or BF16");
  return check_finite(t, ck_.file(n) + ": tensor '" + n + "'");
}

void HfWeights::check_all_used(const std::string& hint) const {
  // A tensor the config does not account for means the two disagree (e.g. num_hidden_layers
  // smaller than the checkpoint's layers): running would silently use part of the model.
  // A stray bias is a different disagreement: the config leaves out a bias the checkpoint has.
  for (const std::string& n : ck_.names()) {
    const bool bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    IL_CHECK(used_.count(n) || n.find("rotary_emb.inv_freq") != std::string::npos ||
                 (n == "lm_head.weight" && tied_),  // tied: transformers ignores it too
             ck_.file(n), ": tensor '", n, "' is not part of the model that ", config_path_, " describes (",
             bias ? "a bias the config's architecture and its attention_bias / mlp_bias fields do not declare" : hint, ")");
  }
}

}  // namespace inferlab::models
