#pragma once
/// @file output_text.h
/// @brief Chapter 13: a sample's text as its tokens arrive, cut exactly at a stop string.
///
/// A server streams text, not tokens, and two things make "the text so far" subtle. A token can
/// end in the middle of a character (byte-level BPE splits UTF-8), so the last bytes may not be
/// printable yet, and sampled tokens can make bytes that are no character at all (JSON must carry
/// valid UTF-8, so those become U+FFFD). And a client's stop string can span tokens: "\n\n" may come as "\n" then "\n",
/// and the first "\n" must not be sent until the next token shows whether the stop string is
/// there, since text once sent cannot be taken back. So the text released is always the decoded
/// text minus what could still turn out to be the start of a stop string or of a character.

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer.h"

namespace inferlab::ch13 {

/// `bytes` as valid UTF-8: each ill-formed part (the longest that began a character and broke
/// off) becomes U+FFFD, as Hugging Face's decoders give it. With `hold_tail`, an incomplete
/// character at the very end is left out instead (its next bytes may still come).
std::string valid_utf8(const std::string& bytes, bool hold_tail);

/// How much of `text` may be released now: its length, less the longest ending of it that is
/// the beginning of one of `stop` (that ending could still become a stop string). Stop strings
/// that appear whole are the caller's to find first.
std::size_t releasable(const std::string& text, const std::vector<std::string>& stop);

class OutputText {
 public:
  /// The sample of a request whose prompt is `prompt`, ending at any of `stop`.
  OutputText(const Tokenizer& tok, const std::vector<std::int32_t>& prompt, std::vector<std::string> stop);
  /// Takes the sequence's tokens so far (prompt + generated); returns the text released by them.
  /// `last`: no more tokens will come, so everything left is released (unless a stop string cut it).
  std::string update(const std::vector<std::int32_t>& tokens, bool last);
  /// Whether a stop string appeared: the text ends before it, and the sample is done.
  bool stopped() const { return stopped_; }
  /// Everything released so far.
  const std::string& text() const { return released_; }

 private:
  const Tokenizer& tok_;
  std::size_t prompt_tokens_;
  std::string prompt_text_;  // the prompt's text, which the decoded sequence starts with
  std::vector<std::string> stop_;
  std::string released_;
  bool stopped_ = false;
};

}  // namespace inferlab::ch13
