#include "common/chat_prompt.h"

#include <algorithm>

#include "common/error.h"

namespace inferlab {

namespace {

// U+E000 and U+E001 (private use) in UTF-8: a marker is kOpen, a decimal index, kClose.
constexpr std::string_view kOpen = "\xEE\x80\x80", kClose = "\xEE\x80\x81";

// `s` with each of `texts` (longest first, leftmost first, as the tokenizer cuts them) and each
// marker character replaced by a marker; what each marker stands for is added to `table`.
std::string mark(const std::string& s, const std::vector<std::string>& texts, std::vector<std::string>& table) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const std::string* hit = nullptr;
    for (const std::string& t : texts)
      if (!t.empty() && s.compare(i, t.size(), t) == 0) {
        hit = &t;
        break;
      }
    if (!hit && (s.compare(i, kOpen.size(), kOpen) == 0 || s.compare(i, kClose.size(), kClose) == 0)) {
      static const std::string open(kOpen), close(kClose);
      hit = s.compare(i, kOpen.size(), kOpen) == 0 ? &open : &close;
    }
    if (!hit) {
      out += s[i++];
      continue;
    }
    out += kOpen;
    out += std::to_string(table.size());
    out += kClose;
    table.push_back(*hit);
    i += hit->size();
  }
  return out;
}

}  // namespace

std::vector<std::int32_t> chat_prompt_tokens(const ChatTemplate& t, const Tokenizer& tok,
                                             const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                             bool specials_in_content) {
  if (specials_in_content) return tok.encode(t.render(messages, add_generation_prompt), false);
  std::vector<std::string> texts = tok.added_token_texts();
  std::stable_sort(texts.begin(), texts.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  auto needs_marks = [&](const std::string& s) {
    if (s.find(kOpen) != std::string::npos || s.find(kClose) != std::string::npos) return true;
    return std::any_of(texts.begin(), texts.end(),
                       [&](const std::string& x) { return !x.empty() && s.find(x) != std::string::npos; });
  };
  const bool any = std::any_of(messages.begin(), messages.end(),
                               [&](const ChatMessage& m) { return needs_marks(m.content) || needs_marks(m.role); });
  if (!any) return tok.encode(t.render(messages, add_generation_prompt), false);

  std::vector<std::string> table;
  std::vector<ChatMessage> marked;
  for (const ChatMessage& m : messages) marked.push_back({mark(m.role, texts, table), mark(m.content, texts, table)});
  const std::string rendered = t.render(marked, add_generation_prompt);
  std::string text;
  std::vector<TextRange> ranges;
  for (std::size_t i = 0; i < rendered.size();) {
    if (rendered.compare(i, kOpen.size(), kOpen) != 0) {
      if (rendered.compare(i, kClose.size(), kClose) == 0)
        fail(t.origin(),
             ": the template changed a message that spells a special token's text, and it cannot be kept as "
             "text (the server's --special-tokens-in-content reads it as the special token instead)");
      text += rendered[i++];
      continue;
    }
    std::size_t j = i + kOpen.size(), index = 0;
    bool digits = false;
    while (j < rendered.size() && rendered[j] >= '0' && rendered[j] <= '9' && index < table.size())
      index = index * 10 + static_cast<std::size_t>(rendered[j++] - '0'), digits = true;
    if (!digits || index >= table.size() || rendered.compare(j, kClose.size(), kClose) != 0)
      fail(t.origin(),
           ": the template changed a message that spells a special token's text, and it cannot be kept as "
           "text (the server's --special-tokens-in-content reads it as the special token instead)");
    ranges.push_back({text.size(), text.size() + table[index].size()});
    text += table[index];
    i = j + kClose.size();
  }
  // The markers stand for exactly the text they replaced only if the template treated it as it
  // treats any text: rendered as it came, the messages must give the same prompt.
  if (text != t.render(messages, add_generation_prompt))
    fail(t.origin(),
         ": the template changed a message that spells a special token's text, and it cannot be kept as "
         "text (the server's --special-tokens-in-content reads it as the special token instead)");
  return tok.encode_with_text_ranges(text, false, ranges);
}

}  // namespace inferlab
