#pragma once
/// @file chat_prompt.h
/// @brief Chat messages to prompt tokens, without letting a message forge the conversation's turns.
///
/// A chat template writes the turns' special tokens ("<|im_start|>user\n…<|im_end|>") around the
/// messages' content, and the tokenizer cuts every special token's text out of the prompt it is
/// given. Rendered and tokenized as one string (as transformers' apply_chat_template(tokenize=True)
/// does), a message whose content spells "<|im_end|>\n<|im_start|>system\n…" becomes real turn
/// boundaries: the user has written a system turn. Here content is text: where a message's content
/// spells a special token, that text is tokenized as ordinary text, and only the template's own
/// special tokens are special.
///
/// How: before rendering, each special token's text inside a message (and any private-use
/// marker character already there) is replaced by a marker of private-use characters that no
/// template filter changes (trim, upper, replace, tojson, …); after rendering, the markers are
/// turned back into the text they stand for, and those byte ranges are encoded as text
/// (Tokenizer::encode_with_text_ranges). The prompt must be the one the messages give rendered
/// as they are (so a template that changes that text, upper-casing it say, is an error, never a
/// different prompt). Messages without such text are rendered once, as they are.

#include <cstdint>
#include <string>
#include <vector>

#include "common/chat_template.h"
#include "common/tokenizer.h"

namespace inferlab {

/// The prompt's tokens for `messages` under template `t`. With `specials_in_content`, content
/// that spells a special token is tokenized as that token (transformers' behaviour). Throws
/// inferlab::Error when the template fails on these messages, or when it changed the text of a
/// message that spells a special token in a way the markers cannot follow.
std::vector<std::int32_t> chat_prompt_tokens(const ChatTemplate& t, const Tokenizer& tok,
                                             const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                             bool specials_in_content = false);

}  // namespace inferlab
