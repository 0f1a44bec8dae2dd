#pragma once
/// @file http.h
/// @brief Chapter 13: the HTTP front end. cpp-httplib's routes over a Server.
///
/// The connections are held by common/http_front.h's event loop, which reads each request
/// within its limits and hands it whole to a worker thread. There a completion request is read
/// (openai.h), turned into tokens (the chat template, then the tokenizer), checked and queued
/// (server.h); then the thread waits on the request's channel and writes what comes: one JSON
/// answer at the end, or, streamed, a server-sent event per piece of text as it comes. A client
/// that goes away is seen between the engine's events (the socket is closed) or when a write
/// to it fails, and its request is aborted.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chapters/13_serving/server.h"
#include "common/chat_template.h"
#include "common/http_front.h"

namespace inferlab::ch13 {

/// What the front end says of itself and how it turns chat messages into a prompt.
struct FrontEnd {
  std::string model_name;                     ///< the id clients name in "model"
  std::int64_t created = 0;                   ///< Unix seconds, for /v1/models
  std::optional<ChatTemplate> chat_template;  ///< none: /v1/chat/completions answers 400
  std::string chat_template_problem;          ///< why there is none, for that answer
  std::size_t max_json_depth = 64;            ///< request bodies nested deeper are refused (--max-json-depth)
  /// Message content that spells a special token ("<|im_end|>") is tokenized as that token
  /// (--special-tokens-in-content). Off by default: content is text, so a user cannot forge the
  /// turns of the conversation.
  bool specials_in_content = false;
};

/// The routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
/// GET /metrics; the serving page: GET / (the page), GET /v1/engine (what it serves, and how),
/// GET /v1/engine/events (the engine's steps as server-sent events); and JSON errors for every
/// other path and for exceptions. `server` and `front` must
/// outlive `http`'s serving.
void add_routes(http::Front& http, Server& server, const FrontEnd& front);

/// `l` with the worker threads `c` needs: one per request that can be in flight (running and
/// waiting), and a few for /metrics, /health and the engine's watchers.
http::Limits front_limits(const ServerConfig& c, http::Limits l = {});

}  // namespace inferlab::ch13
