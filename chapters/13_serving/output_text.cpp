#include "chapters/13_serving/output_text.h"

#include <algorithm>

#include "common/lab.h"

namespace inferlab::ch13 {

namespace {

// The prompt tokens decoded in front of the generated ones: enough for a tokenizer whose
// decoding of a token depends on the one before it (a leading space, a byte split across tokens).
constexpr std::size_t kContext = 8;

// U+FFFD, the replacement character.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// How many bytes the character that `lead` begins has (0: `lead` begins none), and the range of
// its second byte (which rules out overlong forms, surrogates and values beyond U+10FFFF).
int utf8_length(unsigned char lead, unsigned char& lo, unsigned char& hi) {
  lo = 0x80, hi = 0xBF;
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) {
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    return 3;
  }
  if (lead < 0xF5) {
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

std::string valid_utf8(const std::string& bytes, bool hold_tail) {
  std::string out;
  out.reserve(bytes.size());
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    unsigned char lo, hi;
    const int len = utf8_length(b[i], lo, hi);
    if (len == 0) {
      out += kReplacement, ++i;
      continue;
    }
    int k = 1;  // bytes of the character that are well formed so far
    for (; k < len && i + static_cast<std::size_t>(k) < n; ++k) {
      const unsigned char c = b[i + static_cast<std::size_t>(k)];
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
    }
    if (k == len) {
      out.append(bytes, i, static_cast<std::size_t>(len));
    } else if (i + static_cast<std::size_t>(k) == n && hold_tail) {
      break;  // a character whose last bytes have not come yet
    } else {
      out += kReplacement;
    }
    i += static_cast<std::size_t>(k);
  }
  return out;
}

std::size_t releasable(const std::string& text, const std::vector<std::string>& stop) {
  std::size_t hold = 0;
  // EXERCISE 13.2 BEGIN: what may be sent before the next token
  for (const std::string& s : stop)
    for (std::size_t k = std::min(s.size(), text.size() + 1) - 1; k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  // EXERCISE 13.2 STUB
  // lab::not_done("13.2", "set hold to the length of the longest ending of text that is the beginning (shorter "
  //                       "than the whole) of one of the stop strings: the part the next token could complete");
  // EXERCISE 13.2 END
  return text.size() - hold;
}

OutputText::OutputText(const Tokenizer& tok, const std::vector<std::int32_t>& prompt, std::vector<std::string> stop)
    : tok_(tok), prompt_tokens_(prompt.size()), stop_(std::move(stop)) {
  const std::size_t k = std::min(kContext, prompt.size());
  prompt_text_ = tok_.decode({prompt.end() - static_cast<long>(k), prompt.end()}, true);
}

std::string OutputText::update(const std::vector<std::int32_t>& tokens, bool last) {
  if (stopped_) return "";
  const std::size_t k = std::min(kContext, prompt_tokens_);
  std::string all = tok_.decode({tokens.begin() + static_cast<long>(prompt_tokens_ - k), tokens.end()}, true);
  std::string text = valid_utf8(all.compare(0, prompt_text_.size(), prompt_text_) == 0
                                    ? all.substr(prompt_text_.size())
                                    : tok_.decode({tokens.begin() + static_cast<long>(prompt_tokens_), tokens.end()}, true),
                                !last);
  // A stop string that appeared whole: the text ends before the first one.
  std::size_t cut = std::string::npos;
  for (const std::string& s : stop_)
    cut = std::min(cut, text.find(s, released_.size() > s.size() ? released_.size() - s.size() : 0));
  std::size_t end = text.size();
  if (cut != std::string::npos) {
    end = cut, stopped_ = true;
  } else if (!last) {
    end = releasable(text, stop_);
  }
  if (end <= released_.size()) return "";
  std::string fresh = text.substr(released_.size(), end - released_.size());
  released_ += fresh;
  return fresh;
}

}  // namespace inferlab::ch13
