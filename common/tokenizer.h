#pragma once
/// @file tokenizer.h
/// @brief The Tokenizer interface, loading one by file format, and Hugging Face `tokenizer.json`
/// BPE tokenizers.
///
/// The tokenizer.json reader covers the two families that Llama-style checkpoints ship:
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
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace inferlab {

/// Bytes [begin, end) of a text.
struct TextRange {
  std::size_t begin = 0, end = 0;
};

/// What generation needs from a tokenizer, whatever its file format.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Token ids of UTF-8 `text` (throws on invalid UTF-8). With add_special_tokens, the
  /// tokenizer's own rule adds its tokens (e.g. BOS).
  virtual std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  /// encode(), except that inside the byte ranges `as_text` (sorted, not overlapping) no added
  /// token is cut out: there "<|im_end|>" is ordinary text, whatever it spells. A tokenizer
  /// that cuts out no added tokens encodes as encode() does.
  virtual std::vector<std::int32_t> encode_with_text_ranges(std::string_view text, bool add_special_tokens,
                                                            std::span<const TextRange> as_text) const;
  /// The texts encode() cuts out of its input as tokens of their own (added and special
  /// tokens), longest first; none for a tokenizer that cuts out nothing.
  virtual std::vector<std::string> added_token_texts() const { return {}; }
  /// Text of `ids`; throws on an id outside the vocabulary.
  virtual std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const = 0;
  /// Vocabulary size including added tokens (one past the largest id).
  virtual std::int64_t vocab_size() const = 0;
  /// The token string of an id, as stored in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>").
  virtual const std::string& id_to_token(std::int32_t id) const = 0;
  /// The id of a token string, if it is in the vocabulary.
  virtual std::optional<std::int32_t> token_to_id(std::string_view token) const = 0;
  /// True for special tokens (BOS, EOS, <|mask|>, ...).
  virtual bool is_special(std::int32_t id) const = 0;
  /// The file it was loaded from.
  virtual const std::string& path() const = 0;
  /// Throws unless this tokenizer can serve a model with `model_vocab` embedding rows (`model`
  /// names it in the error): it may have fewer tokens than rows (padded tables), never more.
  /// A format whose file stores no token count asks for an exact match instead.
  virtual void check_vocab(std::int64_t model_vocab, const std::string& model) const;

  /// Loads a file of one of tokenizer_formats() (such as llama2.c's tokenizer.bin), else a
  /// Hugging Face tokenizer.json (the file, or a folder holding one).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  /// The tokenizer that goes with a model: `explicit_path` when given; for a model folder, its
  /// tokenizer.json; for a model file, the tokenizer its format keeps beside it (see
  /// TokenizerFormat), else the tokenizer.json beside it.
  static std::unique_ptr<Tokenizer> for_model(const std::string& model_path, const std::string& explicit_path = "");
};

/// tok.check_vocab(vocab_size, model): the check generation runs before sampling from `tok`.
void check_tokenizer_vocab(const Tokenizer& tok, std::int64_t vocab_size, const std::string& model);

/// A tokenizer file format besides tokenizer.json, as Tokenizer::load and for_model see it.
struct TokenizerFormat {
  /// True when `path` is a tokenizer file of this format.
  bool (*is_tokenizer_file)(const std::string& path);
  std::unique_ptr<Tokenizer> (*load)(const std::string& path);
  /// The tokenizer file beside `model_path` when that is a model file of this format, else "".
  std::string (*tokenizer_beside)(const std::string& model_path);
};

/// The formats Tokenizer::load and for_model try before tokenizer.json (listed in
/// tokenizer_formats.cpp; each format's module provides its entry).
std::span<const TokenizerFormat> tokenizer_formats();

/// Prints generated text as it grows: decodes the whole sequence each time and writes what is
/// new, so that characters split across tokens come out whole.
class TextStream {
 public:
  /// Prints the prompt's text.
  TextStream(const Tokenizer& tok, const std::vector<std::int32_t>& prompt);
  /// Prints the text of `tokens` (prompt + generated so far) past what was printed.
  void print(const std::vector<std::int32_t>& tokens);

 private:
  const Tokenizer& tok_;
  std::size_t printed_ = 0;
};

/// A Hugging Face `tokenizer.json` BPE tokenizer.
class HfTokenizer final : public Tokenizer {
 public:
  /// Loads `<folder>/tokenizer.json` or the file at `path`.
  static HfTokenizer load(const std::string& path);
  /// The tokenizer a parsed tokenizer.json describes; `name` stands for its file in errors and
  /// path() (a GGUF file's tokenizer is built this way, common/gguf_tokenizer.h).
  static HfTokenizer from_json(const nlohmann::json& j, const std::string& name);
  ~HfTokenizer() override;
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::vector<std::int32_t> encode_with_text_ranges(std::string_view text, bool add_special_tokens,
                                                    std::span<const TextRange> as_text) const override;
  std::vector<std::string> added_token_texts() const override;
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const override;
  std::int64_t vocab_size() const override;
  const std::string& id_to_token(std::int32_t id) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override;
  bool is_special(std::int32_t id) const override;
  const std::string& path() const override;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  static HfTokenizer from_json_impl(const nlohmann::json& j, const std::string& name);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferlab
