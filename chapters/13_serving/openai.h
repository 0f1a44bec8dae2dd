#pragma once
/// @file openai.h
/// @brief Chapter 13: the OpenAI API as clients speak it. Requests read and checked, responses,
/// streamed chunks and errors written.
///
/// Two endpoints, one request shape. `POST /v1/completions` takes a prompt (text or token ids);
/// `POST /v1/chat/completions` takes messages, which the model's chat template turns into a
/// prompt. Both take max_tokens, temperature, top_p, seed, stop, n and stream, and answer with
/// choices, each with its text and why it ended (finish_reason "stop" or "length"), and the
/// tokens used. A streamed answer is the same content cut into server-sent events: `data:
/// {chunk}` lines, each a JSON object, and `data: [DONE]` at the end.
///
/// Everything a client can get wrong is an ApiError: an HTTP status and OpenAI's error object,
/// naming the field (`param`) so that the client's library raises the right exception.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/chat_template.h"

namespace inferlab::ch13 {

/// What the client did wrong (or why the server cannot take it now), as OpenAI reports it.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error");
  int status;         ///< 400 bad request, 404 no such model, 429 queue full, 503 shutting down
  std::string param;  ///< the request field at fault ("" when none)
  std::string type;   ///< OpenAI's error type
};

/// `{"error": {"message", "type", "param", "code"}}`.
nlohmann::json error_body(const ApiError& e);

/// A completion request, read and checked (types and ranges; what depends on the model, such as
/// the context, the server checks).
struct CompletionParams {
  bool chat = false;
  std::string model;                       ///< "" when the client left it out
  std::optional<std::string> prompt_text;  ///< completions: the prompt as text
  std::vector<std::int32_t> prompt_ids;    ///< completions: the prompt as token ids
  std::vector<ChatMessage> messages;       ///< chat
  std::optional<std::int64_t> max_tokens;  ///< absent: 16 for completions, the rest of the context for chat
  double temperature = 1.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;  ///< not OpenAI's; vLLM's and llama.cpp's extension (0: all)
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;  ///< up to 4 strings; the text ends before the first that appears
  std::int64_t n = 1;             ///< parallel samples
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage: a last chunk with the usage
  bool ignore_eos = false;     ///< vLLM's and llama.cpp's extension: generate max_tokens whatever comes
};

/// Reads a request body for /v1/completions (chat = false) or /v1/chat/completions. Throws
/// ApiError 400 naming the field: malformed JSON, JSON nested deeper than `max_depth` (refused
/// before it is parsed), a wrong type, a value out of range, a feature this server does not have
/// (logprobs, echo, suffix, best_of, tools, tool messages, and the sampling fields logit_bias,
/// presence_penalty, frequency_penalty, repetition_penalty, min_p unless they leave the
/// distribution as it is). Fields it does not know are ignored, as OpenAI's clients send some.
CompletionParams parse_completion(const std::string& body, bool chat, std::size_t max_depth = 64);

/// How deeply `text` nests arrays and objects, counted up to `limit` + 1 (strings skipped,
/// nothing parsed or allocated).
std::size_t json_depth(std::string_view text, std::size_t limit);

/// One choice (sample) of an answer.
struct Choice {
  std::int64_t index = 0;
  std::string text;
  std::string finish_reason;  ///< "stop", "length"; "" while it runs
};

struct Usage {
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
  nlohmann::json to_json() const;
};

/// Names an answer: its id, the model, when it was made (Unix seconds), and which endpoint.
struct AnswerHeader {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  bool chat = false;
};

/// The whole answer: a `text_completion` or a `chat.completion` object.
nlohmann::json response(const AnswerHeader& h, const std::vector<Choice>& choices, const Usage& u);

/// One streamed chunk: `text` is the new text of choice `c.index`, `c.finish_reason` set on the
/// last chunk of that choice. For chat, `first` adds the assistant role to the delta.
nlohmann::json chunk(const AnswerHeader& h, const Choice& c, bool first = false);
/// The chunk after every choice ended, when the client asked for the usage: no choices.
nlohmann::json usage_chunk(const AnswerHeader& h, const Usage& u);

/// A server-sent event carrying `payload`: "data: " + payload + a blank line.
std::string sse_event(const std::string& payload);
/// The event that ends a stream: "data: [DONE]" and a blank line.
std::string sse_done();

}  // namespace inferlab::ch13
