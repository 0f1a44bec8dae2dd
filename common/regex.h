#pragma once
/// @file regex.h
/// @brief A small wrapper over PCRE2 with Unicode classes (`\p{L}`, `\p{N}`, `\s` in UTF mode).
///
/// Tokenizers split text with patterns such as GPT-2's
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, which need a
/// regex engine that knows Unicode character properties and lookahead: std::regex knows
/// neither, PCRE2 knows both.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace inferlab {

class Regex {
 public:
  /// Compiles `pattern` in UTF + Unicode-properties mode; throws with PCRE2's message and offset.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  /// Byte ranges [begin, end) of all non-overlapping matches in `text`, left to right. `text`
  /// must be valid UTF-8 (validate_utf8 first).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

/// Throws "<context>: not valid UTF-8 at byte N" unless `s` is valid UTF-8.
void validate_utf8(std::string_view s, const std::string& context);

/// Splits UTF-8 text into its code points' byte sequences.
std::vector<std::string_view> utf8_chars(std::string_view s);

/// Appends the UTF-8 encoding of code point `cp`.
void append_utf8(std::string& out, char32_t cp);

}  // namespace inferlab
