#include "chapters/13_serving/http.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "chapters/13_serving/openai.h"
#include "chapters/13_serving/page_html.h"
#include "common/chat_prompt.h"
#include "common/error.h"

namespace inferlab::ch13 {

using nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";
// The engine's event stream: at most one event per watcher every 50 ms (steps in between are
// merged into it), a comment line after a second without steps (a write is how a watcher that
// went away is noticed), and a few watchers at once (each holds one of the pool's threads).
constexpr auto kEventGap = std::chrono::milliseconds(50);
constexpr auto kIdleBeat = std::chrono::milliseconds(1000);
constexpr std::int64_t kMaxWatchers = 4;

// JSON text for the wire; bytes that are not UTF-8 (in an error message that quotes input) become
// U+FFFD rather than an exception.
std::string wire(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(wire(error_body(e)), kJson);
}

// The prompt's tokens: the chat template's text for messages (its special tokens written out,
// so none added), or the completion prompt's text with the tokenizer's own (BOS), or its ids.
std::vector<std::int32_t> prompt_tokens(const Server& server, const FrontEnd& front, const CompletionParams& p) {
  const Tokenizer& tok = server.tokenizer();
  try {
    if (p.chat) {
      if (!front.chat_template)
        throw ApiError(400,
                       "this model has no chat template (" + front.chat_template_problem +
                           "); use /v1/completions, or start the server with --chat-template FILE",
                       "messages");
      return chat_prompt_tokens(*front.chat_template, tok, p.messages, true, front.specials_in_content);
    }
    if (p.prompt_text) return tok.encode(*p.prompt_text, true);
    return p.prompt_ids;
  } catch (const Error& e) {  // a template that raises, text that is not UTF-8
    throw ApiError(400, e.what(), p.chat ? "messages" : "prompt");
  }
}

SamplingParams sampling_of(const CompletionParams& p) {
  SamplingParams s;
  s.temperature = static_cast<float>(p.temperature);
  s.top_p = static_cast<float>(p.top_p);
  s.top_k = static_cast<int>(p.top_k);
  s.seed = p.seed ? *p.seed : std::random_device{}();
  return s;
}

// One request's answer as it is put together from its channel's events.
struct Answer {
  AnswerHeader header;
  std::vector<Choice> choices;
  Usage usage;
  std::int64_t open = 0;  // choices not yet finished
  std::string error;      // an engine failure, told to the client

  // Applies an event; returns the choice it touched.
  const Choice& apply(const Event& e) {
    Choice& c = choices.at(static_cast<std::size_t>(e.index));
    c.text += e.text;
    if (!e.finish_reason.empty()) {
      --open;
      usage.completion_tokens += e.tokens;
      c.finish_reason = e.finish_reason == "stop" || e.finish_reason == "length" ? e.finish_reason : "abort";
      if (e.finish_reason == "error") error = e.error;
    }
    return c;
  }
};

// Writes the events that came (waiting up to 50 ms for them) as server-sent events, and the end
// of the stream once every choice finished. False when a write failed: the client went away.
bool write_events(Answer& answer, Channel& channel, std::vector<bool>& started, bool usage, httplib::DataSink& sink) {
  for (const Event& e : channel.pop(std::chrono::milliseconds(50))) {
    const Choice& c = answer.apply(e);
    const Choice piece{c.index, e.text, e.finish_reason.empty() ? "" : c.finish_reason};
    const bool first = !started[static_cast<std::size_t>(c.index)];
    started[static_cast<std::size_t>(c.index)] = true;
    if (!e.error.empty()) {
      std::fprintf(stderr, "ch13_serve: %s: the engine failed: %s\n", answer.header.id.c_str(), e.error.c_str());
      const std::string err = sse_event(wire(error_body(ApiError(500, e.error, "", "server_error"))));
      if (!sink.write(err.data(), err.size())) return false;
    }
    const std::string event = sse_event(wire(chunk(answer.header, piece, first)));
    if (!sink.write(event.data(), event.size())) return false;
  }
  if (answer.open > 0) return !http::Front::client_gone();  // called again at once: waits for the next events
  std::string tail;
  if (usage) tail += sse_event(wire(usage_chunk(answer.header, answer.usage)));
  tail += sse_done();
  if (!sink.write(tail.data(), tail.size())) return false;
  sink.done();
  return true;
}

void complete(Server& server, const FrontEnd& front, const httplib::Request& req, httplib::Response& res, bool chat) {
  const CompletionParams p = parse_completion(req.body, chat, front.max_json_depth);
  if (!p.model.empty() && p.model != front.model_name)
    throw ApiError(404, "the model '" + p.model + "' does not exist; this server serves '" + front.model_name + "'", "model",
                   "invalid_request_error");
  // Chat without max_tokens may use the rest of the context; a completion gets OpenAI's 16.
  const std::int64_t default_max = chat ? server.context() : 16;
  ch11::Request r = server.make_request(prompt_tokens(server, front, p), chat ? "messages" : "prompt", p.max_tokens,
                                        default_max, sampling_of(p), p.n, p.ignore_eos);
  auto answer = std::make_shared<Answer>();
  answer->header = {(chat ? "chatcmpl-" : "cmpl-") + std::to_string(r.id), front.model_name,
                    static_cast<std::int64_t>(std::time(nullptr)), chat};
  answer->usage.prompt_tokens = static_cast<std::int64_t>(r.prompt.size());
  answer->open = p.n;
  for (std::int64_t i = 0; i < p.n; ++i) answer->choices.push_back({i, "", ""});
  std::shared_ptr<Channel> channel = server.submit(std::move(r), p.stop);
  http::Front::note("prompt_tokens", answer->usage.prompt_tokens);

  if (!p.stream) {
    // Nothing is written until the end, so a client that goes away is seen by its closed socket,
    // looked at between the engine's events: its request is aborted rather than run to max_tokens.
    while (answer->open > 0) {
      for (const Event& e : channel->pop(std::chrono::milliseconds(100))) answer->apply(e);
      if (answer->open > 0 && http::Front::client_gone()) {
        channel->cancel();
        http::Front::note("completion_tokens", answer->usage.completion_tokens);
        throw ApiError(499, "the client closed the connection before the answer was ready", "", "client_closed");
      }
    }
    http::Front::note("completion_tokens", answer->usage.completion_tokens);
    if (!answer->error.empty()) throw ApiError(500, answer->error, "", "server_error");
    res.set_content(wire(response(answer->header, answer->choices, answer->usage)), kJson);
    return;
  }
  // Streamed: the status and headers go now; each event after it is written as it comes. A write
  // that fails means the client went away: the request is cancelled and the engine aborts it.
  auto started = std::make_shared<std::vector<bool>>(static_cast<std::size_t>(p.n), false);
  const bool usage = p.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [answer, channel, started, usage](std::size_t, httplib::DataSink& sink) {
    try {
      const bool more = write_events(*answer, *channel, *started, usage, sink);
      http::Front::note("completion_tokens", answer->usage.completion_tokens);
      return more;
    } catch (const std::exception& e) {  // nothing may leave a provider: the stream ends, the request is aborted
      std::fprintf(stderr, "ch13_serve: %s: %s\n", answer->header.id.c_str(), e.what());
      channel->cancel();
      return false;
    }
      },
      [channel](bool success) {
    if (!success) channel->cancel();  // the client went away before the end
  });
}

// GET /v1/engine/events: the engine's snapshots (engine_events.h) as server-sent events, for as
// long as the watcher reads them.
void engine_events(Server& server, httplib::Response& res) {
  if (server.watchers() >= kMaxWatchers)
    throw ApiError(429, std::to_string(kMaxWatchers) + " watchers already follow the engine; retry later", "",
                   "rate_limit_exceeded");
  std::shared_ptr<Subscription> sub = server.watch();
  auto sent = std::make_shared<std::chrono::steady_clock::time_point>();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [sub, sent](std::size_t, httplib::DataSink& sink) {
    std::this_thread::sleep_until(*sent + kEventGap);
    const std::optional<Update> u = sub->take(kIdleBeat);
    const std::string text = u ? sse_event(wire(to_json(*u))) : ": idle\n\n";
    *sent = std::chrono::steady_clock::now();
    return sink.write(text.data(), text.size());  // false: the watcher went away, and sub with it
  });
}

// GET /v1/engine: what the serving page needs to know once.
json engine_info(const Server& server, const FrontEnd& front) {
  const ServerConfig& c = server.config();
  return {{"model", front.model_name},
          {"chat_template", front.chat_template.has_value()},
          {"context", server.context()},
          {"max_num_seqs", c.scheduler.max_running},
          {"max_batched_tokens", c.scheduler.max_step_tokens},
          {"block_size", c.block_size},
          {"prefix_caching", server.prefix_caching()},
          {"architecture", server.model().architecture()},
          {"layers", server.model().describe_layers()},
          {"pool", server.pool().describe()},
          {"max_waiting", c.max_waiting}};
}

}  // namespace

http::Limits front_limits(const ServerConfig& c, http::Limits l) {
  l.workers = static_cast<std::size_t>(c.scheduler.max_running + c.max_waiting + 8 + kMaxWatchers);
  return l;
}

void add_routes(http::Front& http, Server& server, const FrontEnd& front) {
  const auto guarded = [&server](auto handler) {
    return [&server, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const ApiError& e) {
        if (e.status != 429 && e.status != 503 && e.status != 499) server.count_rejected();
        send_error(res, e);
      }
    };
  };
  http.Post("/v1/completions",
            guarded([&](const httplib::Request& req, httplib::Response& res) { complete(server, front, req, res, false); }));
  http.Post("/v1/chat/completions",
            guarded([&](const httplib::Request& req, httplib::Response& res) { complete(server, front, req, res, true); }));
  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", front.model_name}, {"object", "model"}, {"created", front.created}, {"owned_by", "inferlab"}};
    res.set_content(wire(json{{"object", "list"}, {"data", json::array({model})}}), kJson);
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    if (server.draining()) {
      send_error(res, ApiError(503, "the server is shutting down", "", "server_error"));
      return;
    }
    res.set_content(R"({"status":"ok"})", kJson);
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(server.metrics(), "text/plain; version=0.0.4");
  });
  // The serving page: a chat beside the engine at work (page/index.html, built into the binary).
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kServingPage.data(), kServingPage.size(), "text/html; charset=utf-8");
  });
  http.Get("/v1/engine", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(wire(engine_info(server, front)), kJson);
  });
  http.Get("/v1/engine/events",
           guarded([&](const httplib::Request&, httplib::Response& res) { engine_events(server, res); }));
  // Every other failure still answers with OpenAI's error object: an unknown path or method, a
  // body over the size limit, a handler that threw.
  http.set_exception_handler([&server](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    server.count_rejected();
    send_error(res, ApiError(500, "the server failed on this request: " + what, "", "server_error"));
  });
  http.set_error_handler([&server](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // an answer of ours, already an error object
    server.count_rejected();
    const std::string message = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                                : res.status == 405 ? "method " + req.method + " is not allowed on " + req.path
                                : res.status == 413
                                    ? "the request body is too large"
                                    : "the request could not be served (HTTP " + std::to_string(res.status) + ")";
    send_error(res, ApiError(res.status, message));
  });
  // What the front refuses itself (a body too large, too many headers, ...) is counted as well.
  http.on_refusal([&server](int) { server.count_rejected(); });
}

}  // namespace inferlab::ch13
