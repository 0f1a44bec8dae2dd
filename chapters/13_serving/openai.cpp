#include "chapters/13_serving/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/lab.h"

namespace inferlab::ch13 {

using nlohmann::json;

ApiError::ApiError(int s, const std::string& message, std::string p, std::string t)
    : std::runtime_error(message), status(s), param(std::move(p)), type(std::move(t)) {}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", nullptr}}}};
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& message) { throw ApiError(400, message, field); }

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

// The field, when present and not null (OpenAI's clients send null for "not given").
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An integer in [lo, hi], compared exactly: JSON keeps 2^63 as an unsigned integer and
// 9.223372036854775807e18 as a double equal to 2^63, and neither may pass as INT64_MAX (a
// comparison in doubles rounds hi up to 2^63 and lets both through).
std::int64_t integer(const json& v, const std::string& name, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    bad(name, "'" + name + "' must be an integer, got " + type_name(v));
  auto out_of_range = [&] {
    bad(name, "'" + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  };
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) out_of_range();
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else {
    // Integral, written as a float or past int64 (nlohmann reads -9223372036854775809 as a
    // double, which rounds to -2^63): taken only where a double holds every integer exactly.
    const double d = v.get<double>();
    if (!(std::fabs(d) <= 9007199254740992.0)) out_of_range();
    x = static_cast<std::int64_t>(d);
  }
  if (x < lo || x > hi) out_of_range();
  return x;
}

double number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, "'" + name + "' must be a number, got " + type_name(v));
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi)) {
    std::ostringstream range;
    range << "'" << name << "' must be in [" << lo << ", " << hi << "], got " << v.dump();
    bad(name, range.str());
  }
  return d;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, "'" + name + "' must be a boolean, got " + type_name(v));
  return v.get<bool>();
}

std::string text(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, "'" + name + "' must be a string, got " + type_name(v));
  return v.get<std::string>();
}

std::vector<std::int32_t> token_ids(const json& v, const std::string& name) {
  std::vector<std::int32_t> ids;
  for (const json& t : v)
    ids.push_back(static_cast<std::int32_t>(integer(t, name, 0, std::numeric_limits<std::int32_t>::max())));
  return ids;
}

// A message's content: a string, or OpenAI's list of parts of which this server reads the text ones.
std::string content(const json& v, const std::string& name) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(name, "'" + name + "' must be a string or a list of text parts, got " + type_name(v));
  std::string all;
  for (const json& part : v) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(name, "'" + name + "': only text parts ({\"type\": \"text\", \"text\": ...}) are supported, got " +
                    part.dump().substr(0, 80));
    all += part["text"].get<std::string>();
  }
  return all;
}

}  // namespace

std::size_t json_depth(std::string_view text, std::size_t limit) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

CompletionParams parse_completion(const std::string& body, bool chat, std::size_t max_depth) {
  // nlohmann's parser builds every level it reads: 8 MB of '[' is 8 million nested arrays and
  // half a gigabyte before it fails. Counted first, nothing is built.
  if (json_depth(body, max_depth) > max_depth)
    throw ApiError(400, "the request body nests arrays and objects deeper than " + std::to_string(max_depth) + " levels");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond a double (1e400)
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, std::string("the request body must be a JSON object, got ") + type_name(j));
  CompletionParams p;
  p.chat = chat;
  if (const json* v = field(j, "model")) p.model = text(*v, "model");

  if (chat) {
    const json* m = field(j, "messages");
    if (!m) bad("messages", "'messages' is required");
    if (!m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty list of messages");
    for (std::size_t i = 0; i < m->size(); ++i) {
      const json& msg = (*m)[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!msg.is_object()) bad(at, "'" + at + "' must be an object with a role and a content");
      const json* role = field(msg, "role");
      if (!role) bad(at + ".role", "'" + at + ".role' is required");
      const json* c = field(msg, "content");
      const std::string r = text(*role, at + ".role");
      // A tool call or a tool's result would be flattened to its text and lose what it is.
      if (const json* calls = field(msg, "tool_calls"); calls && !(calls->is_array() && calls->empty()))
        bad(at + ".tool_calls", "'" + at + ".tool_calls': tool calls are not supported by this server");
      if (field(msg, "function_call"))
        bad(at + ".function_call", "'" + at + ".function_call': function calls are not supported by this server");
      if (r == "tool" || r == "function" || field(msg, "tool_call_id"))
        bad(at + ".role", "'" + at + "': tool and function messages are not supported by this server");
      p.messages.push_back({r, c ? content(*c, at + ".content") : ""});
    }
    for (const char* unsupported : {"tools", "functions", "response_format", "tool_choice", "function_call"})
      if (field(j, unsupported)) bad(unsupported, std::string("'") + unsupported + "' is not supported by this server");
    if (const json* v = field(j, "logprobs"); v && boolean(*v, "logprobs"))
      bad("logprobs", "'logprobs' is not supported by this server");
  } else {
    const json* v = field(j, "prompt");
    if (!v) bad("prompt", "'prompt' is required");
    if (v->is_string()) {
      p.prompt_text = v->get<std::string>();
    } else if (v->is_array() && v->size() == 1 && (*v)[0].is_string()) {
      p.prompt_text = (*v)[0].get<std::string>();
    } else if (v->is_array() && v->size() == 1 && (*v)[0].is_array()) {
      p.prompt_ids = token_ids((*v)[0], "prompt");
    } else if (v->is_array() && !v->empty() && (*v)[0].is_number()) {
      p.prompt_ids = token_ids(*v, "prompt");
    } else if (v->is_array() && v->size() > 1) {
      bad("prompt",
          "'prompt': one prompt per request (send the others as requests of their own), got " + std::to_string(v->size()));
    } else {
      bad("prompt", std::string("'prompt' must be a string, a list of token ids, or a list holding one of them, got ") +
                        type_name(*v));
    }
    if (p.prompt_text && p.prompt_text->empty()) bad("prompt", "'prompt' is empty");
    if (!p.prompt_text && p.prompt_ids.empty()) bad("prompt", "'prompt' is empty");
    if (const json* l = field(j, "logprobs"); l && !(l->is_number() && l->get<double>() == 0))
      bad("logprobs", "'logprobs' is not supported by this server");
    if (const json* e = field(j, "echo"); e && boolean(*e, "echo")) bad("echo", "'echo' is not supported by this server");
    if (field(j, "suffix")) bad("suffix", "'suffix' is not supported by this server");
  }

  const char* max_name = chat && field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (const json* v = field(j, max_name)) p.max_tokens = integer(*v, max_name, 1, std::numeric_limits<std::int32_t>::max());
  if (const json* v = field(j, "temperature")) p.temperature = number(*v, "temperature", 0, 2);
  if (const json* v = field(j, "top_p")) p.top_p = number(*v, "top_p", 0, 1);
  if (p.top_p <= 0) bad("top_p", "'top_p' must be greater than 0");
  if (const json* v = field(j, "top_k")) p.top_k = integer(*v, "top_k", -1, std::numeric_limits<std::int32_t>::max());
  if (p.top_k < 0) p.top_k = 0;  // vLLM's -1: all
  if (const json* v = field(j, "seed"))
    p.seed = static_cast<std::uint64_t>(
        integer(*v, "seed", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
  if (const json* v = field(j, "n")) p.n = integer(*v, "n", 1, 128);
  if (const json* v = field(j, "best_of"); v && integer(*v, "best_of", 1, 128) != p.n)
    bad("best_of", "'best_of' other than n is not supported by this server");
  if (const json* v = field(j, "stop")) {
    if (v->is_string()) {
      p.stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      if (v->size() > 4) bad("stop", "'stop' holds at most 4 strings, got " + std::to_string(v->size()));
      for (const json& s : *v) p.stop.push_back(text(s, "stop"));
    } else {
      bad("stop", std::string("'stop' must be a string or a list of strings, got ") + type_name(*v));
    }
    for (const std::string& s : p.stop)
      if (s.empty()) bad("stop", "'stop' strings must not be empty");
  }
  if (const json* v = field(j, "stream")) p.stream = boolean(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad("stream_options", std::string("'stream_options' must be an object, got ") + type_name(*v));
    if (!p.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (const json* u = field(*v, "include_usage")) p.include_usage = boolean(*u, "stream_options.include_usage");
  }
  if (const json* v = field(j, "ignore_eos")) p.ignore_eos = boolean(*v, "ignore_eos");
  // Sampling fields this server does not implement yet: refused unless they change nothing, so
  // that no request is answered as if they had been applied.
  for (const auto& [name, neutral] : {std::pair{"presence_penalty", 0.0}, std::pair{"frequency_penalty", 0.0},
                                      std::pair{"repetition_penalty", 1.0}, std::pair{"min_p", 0.0}})
    if (const json* v = field(j, name); v && number(*v, name, -1e9, 1e9) != neutral)
      bad(name, std::string("'") + name + "' is not supported by this server yet (only " + (neutral == 0 ? "0" : "1") +
                    ", which changes nothing)");
  if (const json* v = field(j, "logit_bias"); v && !(v->is_object() && v->empty()))
    bad("logit_bias", "'logit_bias' is not supported by this server yet (only {}, which changes nothing)");
  return p;
}

json Usage::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json finish(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

json header(const AnswerHeader& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

}  // namespace

json response(const AnswerHeader& h, const std::vector<Choice>& choices, const Usage& u) {
  json out = header(h, h.chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (const Choice& c : choices) {
    if (h.chat)
      list.push_back({{"index", c.index},
                      {"message", {{"role", "assistant"}, {"content", c.text}}},
                      {"logprobs", nullptr},
                      {"finish_reason", finish(c.finish_reason)}});
    else
      list.push_back(
          {{"index", c.index}, {"text", c.text}, {"logprobs", nullptr}, {"finish_reason", finish(c.finish_reason)}});
  }
  out["choices"] = std::move(list);
  out["usage"] = u.to_json();
  return out;
}

json chunk(const AnswerHeader& h, const Choice& c, bool first) {
  json out = header(h, h.chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", c.index}, {"logprobs", nullptr}, {"finish_reason", finish(c.finish_reason)}};
  if (h.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!c.text.empty() || (first && c.finish_reason.empty())) delta["content"] = c.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = c.text;
  }
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json usage_chunk(const AnswerHeader& h, const Usage& u) {
  json out = header(h, h.chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = u.to_json();
  return out;
}

std::string sse_event(const std::string& payload) {
  std::string event;
  // EXERCISE 13.1 BEGIN: one server-sent event
  // A payload is one line of JSON (dump() escapes every newline inside strings), so one data
  // field carries it; the blank line ends the event.
  event = "data: " + payload + "\n\n";
  // EXERCISE 13.1 STUB
  // lab::not_done("13.1", "frame the payload as one server-sent event: the field name data, a colon and a space, "
  //                       "the payload, then the line break that ends the line and the blank line that ends the event");
  // EXERCISE 13.1 END
  return event;
}

std::string sse_done() { return sse_event("[DONE]"); }

}  // namespace inferlab::ch13
