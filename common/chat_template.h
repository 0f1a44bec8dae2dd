#pragma once
/// @file chat_template.h
/// @brief Chat templates: OpenAI-style messages to the prompt text a model was trained on.
///
/// A model ships its prompt format as a Jinja template (tokenizer_config.json's `chat_template`,
/// a GGUF's `tokenizer.chat_template`). transformers renders it with
/// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`; this
/// file renders the same templates to the same bytes. Debian packages no C++ Jinja library, so
/// the interpreter is hand-written (chat_template.cpp) and covers the subset chat templates use,
/// under the environment transformers builds (ImmutableSandboxedEnvironment with trim_blocks and
/// lstrip_blocks on, keep_trailing_newline off, the loop-controls extension):
///
/// - tags: `{{ }}`, `{% %}`, `{# #}`, with `-` (strip whitespace) and `+` (keep it) on either side;
/// - statements: if / elif / else, for … in … [if …] (one name or `a, b` unpacking; `loop.index`,
///   `index0`, `revindex`, `revindex0`, `first`, `last`, `length`; `else` for an empty loop),
///   break / continue, set (`x = …`, `ns.x = …`), generation / endgeneration (renders its body);
/// - expressions: string, integer, float, true/false/none literals, lists, dicts, parentheses,
///   variables, `a.b`, `a['b']`, `a[0]`, slices `a[1:]` `a[::-1]`, `+ - * / // % **`, `~`,
///   `== != < <= > >=`, `in` / `not in`, `and or not`, `x if c else y`, unary `-`;
/// - tests (`is` / `is not`): defined, undefined, none, string, number, integer, float, boolean,
///   mapping, iterable, sequence, true, false, odd, even, divisibleby, equalto / eq, ne;
/// - filters: trim, length / count, tojson (indent, sort_keys, ensure_ascii), upper, lower,
///   default / d, first, last, join, capitalize, title, replace, string, items, list, int, float,
///   abs, select / reject (by test), selectattr / rejectattr, map (attribute=…), safe;
/// - methods: str strip / lstrip / rstrip / startswith / endswith / split / upper / lower /
///   replace / title / capitalize; dict items / keys / values / get;
/// - functions: raise_exception(msg), strftime_now(fmt), namespace(…), range(…), dict(…).
///
/// Anything else (macros, call blocks, includes, other filters, tests or functions, `%`
/// formatting of strings, …) is refused when the template is parsed, with an error naming the
/// construct, the template's origin and the line — never rendered some other way. Values are
/// JSON (nlohmann::ordered_json, which keeps a dict's key order as Python does; tuples are
/// marked arrays) plus Jinja's undefined, namespaces and the functions above; they print as
/// Python's str() prints them. Case changes use Unicode's simple mappings; a code point whose
/// Python mapping is special (ß to "SS", final sigma, …) is an error when it is met.

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace inferlab {

struct ChatMessage {
  std::string role;
  std::string content;
};

namespace chat_detail {
struct Node;
}

/// What one render may spend. A template is a program, and one that comes inside a downloaded
/// model file is not trusted: a render that passes either budget stops with an error naming the
/// template, rather than hang a thread or fill the memory.
struct RenderBudget {
  std::int64_t steps = 1 << 20;   ///< statements, expressions and loop iterations
  std::size_t bytes = 256 << 20;  ///< bytes of text and data made or copied, in all (the output included)
};

class ChatTemplate {
 public:
  /// Parses `source`; throws inferlab::Error naming `origin` and what it cannot render. An empty
  /// bos_token / eos_token is left undefined, as transformers leaves a token the tokenizer lacks.
  ChatTemplate(std::string source, std::string origin, std::string bos_token = "", std::string eos_token = "");

  /// The prompt for `messages`, as apply_chat_template(messages, tokenize=False,
  /// add_generation_prompt=...) gives it. Throws naming the origin when the template raises
  /// (raise_exception) or fails on these messages.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  /// The same for messages as JSON objects (tool calls, tool results, ...), with further variables
  /// (`tools`, `documents`, `date_string`, ...) from `extra`; `tools` and `documents` are none
  /// unless `extra` sets them, as in transformers.
  std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }

  /// strftime_now() reports this time instead of the clock's (local time), so that a template
  /// that prints today's date (Llama 3.x) renders the same bytes every time.
  void freeze_time(const std::tm& t) { frozen_time_ = t; }
  /// The budget of each render (RenderBudget's defaults unless set).
  void set_budget(const RenderBudget& b) { budget_ = b; }
  const RenderBudget& budget() const { return budget_; }

  /// The model's own template: a folder's tokenizer_config.json (with its bos_token / eos_token,
  /// which may be strings or {"content":…} objects; a list of named templates gives "default";
  /// without a `chat_template` field, a chat_template.jinja file beside it, as newer exports write),
  /// or a .gguf file's tokenizer.chat_template (bos/eos from its token list); nullopt when the
  /// model has none. Throws when it has one that cannot be parsed.
  static std::optional<ChatTemplate> for_model(const std::string& model_path);
  /// --chat-template FILE; bos/eos as the model's tokenizer names them. Throws naming the file
  /// when it cannot be read, is not UTF-8, or cannot be parsed (with the line and construct).
  static ChatTemplate from_file(const std::string& path, std::string bos_token = "", std::string eos_token = "");

 private:
  std::string source_, origin_, bos_token_, eos_token_;
  std::shared_ptr<const chat_detail::Node> root_;
  std::optional<std::tm> frozen_time_;
  RenderBudget budget_;
};

}  // namespace inferlab
