#pragma once
/// @file llama2c.h
/// @brief Karpathy's llama2.c checkpoint and tokenizer files.
///
/// Checkpoints (`model.bin`): float32 weights behind a small header, in three versions.
/// - v0 ("legacy", what run.c reads): seven int32 (dim, hidden_dim, n_layers, n_heads,
///   n_kv_heads, vocab_size, seq_len). A positive vocab_size means the output classifier shares
///   the token embedding; a negative one means a separate classifier follows the weights. The
///   weights are: token embedding, attention norms, wq, wk, wv, wo, MLP norms, w1 (gate), w2
///   (down), w3 (up), final norm, two RoPE tables of seq_len × head_dim/2 floats (unused), and
///   the classifier if it is not shared.
/// - v1: a 256-byte header (magic "ak42", version 1, the seven ints, a shared-classifier byte),
///   then norms first: attention norms, MLP norms, final norm, embedding, wq, wk, wv, wo, w1,
///   w2, w3, classifier if not shared.
/// - v2: the same header plus an int32 group size; the norms in float32, then each other tensor
///   in llama2.c's Q8_0 (int8 values, then one float32 scale per group). Loaded dequantised.
/// RoPE in these files rotates adjacent pairs (2j, 2j+1); their q/k rows are in that order.
///
/// Tokenizers (`tokenizer.bin`): int32 max_token_length, then per token a float32 score, an
/// int32 length and the bytes. Encoding is SentencePiece-style BPE driven by the scores.

#include <map>
#include <string>

#include "common/hf_config.h"
#include "common/tensor.h"
#include "common/tokenizer.h"

namespace inferlab {

struct Llama2cCheckpoint {
  std::string path;
  int version = 0;
  TransformerConfig config;  ///< from the header (eps 1e-5, theta 10000 as llama2.c uses)
  /// Tensors under Hugging Face Llama names (model.layers.0.self_attn.q_proj.weight, ...),
  /// float32, shaped [out, in] like torch.nn.Linear; q/k rows in adjacent-pair order.
  std::map<std::string, Tensor> tensors;
};

/// Reads a llama2.c checkpoint of any version; throws naming the file for a bad header or a
/// size that does not match it.
Llama2cCheckpoint load_llama2c(const std::string& path);

/// Writes a v0 ("legacy") checkpoint from tensors under Hugging Face names whose q/k rows are in
/// adjacent-pair order (the classifier is shared when config.tie_word_embeddings).
void save_llama2c(const std::string& path, const TransformerConfig& config, const std::map<std::string, Tensor>& tensors);

/// Reorders the rows of a q or k projection [heads·H, D] for the other RoPE pairing:
/// to_half_split moves row 2j of every head to j and 2j+1 to j + H/2 (what Hugging Face's
/// conversion script does), so that rotate-half RoPE computes what adjacent-pair RoPE did; the
/// reverse permutation otherwise.
Tensor permute_rope_rows(const Tensor& w, std::int64_t heads, bool to_half_split);

/// llama2.c files for Tokenizer::load and for_model: a .bin tokenizer file is a tokenizer.bin;
/// a .bin model file has a tokenizer.bin, or a single tok*.bin, beside it.
TokenizerFormat llama2c_tokenizer_format();

/// llama2.c's tokenizer: SentencePiece-style BPE over byte-fallback pieces, BOS = 1, EOS = 2.
class Llama2cTokenizer final : public Tokenizer {
 public:
  static Llama2cTokenizer load(const std::string& path);
  /// Adds BOS (when add_special_tokens), a dummy-prefix space for non-empty text, then merges
  /// the pair whose merged piece scores highest until none is in the vocabulary.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  /// Pieces joined; a piece's leading space right after BOS is dropped; <0xHH> become bytes.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const override;
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(pieces_.size()); }
  const std::string& id_to_token(std::int32_t id) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override;
  bool is_special(std::int32_t id) const override { return id >= 0 && id <= 2; }
  const std::string& path() const override { return path_; }
  /// A tokenizer.bin stores no token count (run.c reads exactly the model's vocab_size
  /// tokens), so it must hold exactly that many: a file cut at a token boundary is caught here.
  void check_vocab(std::int64_t model_vocab, const std::string& model) const override;
  float score(std::int32_t id) const { return scores_.at(static_cast<std::size_t>(id)); }
  /// The same vocabulary as a Hugging Face tokenizer.json (Llama-2 style: "▁" for spaces,
  /// byte fallback, merges ordered by the merged piece's score).
  std::string to_tokenizer_json() const;

 private:
  std::string path_;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::map<std::string, std::int32_t, std::less<>> lookup_;
};

}  // namespace inferlab
