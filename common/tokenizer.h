#pragma once
/// @file tokenizer.h
/// @brief Hugging Face `tokenizer.json` BPE tokenizers, encode and decode.
///
/// Covers the two families that Llama-style checkpoints ship:
/// - byte-level BPE (GPT-2, Llama-3, SmolLM, Qwen): text is split by a Unicode-aware regex, each
///   byte is mapped to a printable character, and merges apply to those characters;
/// - metaspace BPE with byte fallback (Llama-2, Mistral, TinyLlama): spaces become "▁", and
///   characters outside the vocabulary become <0xHH> byte tokens.
/// The pipeline follows the `tokenizers` library: added tokens are cut out first, then the
/// normalizer, the pre-tokenizer, the BPE model and the post-processor run on the rest;
/// decoding runs the decoder chain. Anything in a tokenizer.json that this reader does not
/// implement is an error naming the component, never silently ignored.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inferlab {

class Tokenizer {
 public:
  /// Loads `<folder>/tokenizer.json` or the file at `path`.
  static Tokenizer load(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of UTF-8 `text` (throws on invalid UTF-8). With add_special_tokens, the
  /// post-processor's template adds its tokens (e.g. BOS).
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  /// Text of `ids`; throws on an id outside the vocabulary.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const;

  /// Vocabulary size including added tokens (one past the largest id).
  std::int64_t vocab_size() const;
  /// The token string of an id, as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>").
  const std::string& id_to_token(std::int32_t id) const;
  /// The id of a token string, if it is in the vocabulary or the added tokens.
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  /// True for added tokens marked special (BOS, EOS, <|mask|>, ...).
  bool is_special(std::int32_t id) const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Tokenizer load_impl(const std::string& path);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferlab
