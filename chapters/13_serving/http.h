#pragma once
/// @file http.h
/// @brief Chapter 13: the HTTP front end. cpp-httplib's routes over a Server.
///
/// Each connection is served by a thread of cpp-httplib's pool. A completion request is read
/// (openai.h), turned into tokens (the chat template, then the tokenizer), checked and queued
/// (server.h); then the thread waits on the request's channel and writes what comes: one JSON
/// answer at the end, or, streamed, a server-sent event per piece of text as it comes. A client
/// that goes away is seen when a write to it fails, and its request is aborted.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chapters/13_serving/server.h"
#include "common/chat_template.h"

namespace httplib {
class Server;
}

namespace inferlab::ch13 {

/// What the front end says of itself and how it turns chat messages into a prompt.
struct FrontEnd {
  std::string model_name;                     ///< the id clients name in "model"
  std::int64_t created = 0;                   ///< Unix seconds, for /v1/models
  std::optional<ChatTemplate> chat_template;  ///< none: /v1/chat/completions answers 400
  std::string chat_template_problem;          ///< why there is none, for that answer
};

/// The routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
/// GET /metrics; the serving page: GET / (the page), GET /v1/engine (what it serves, and how),
/// GET /v1/engine/events (the engine's steps as server-sent events); and JSON errors for every
/// other path and for exceptions. `server` and `front` must
/// outlive `http`'s serving.
void add_routes(httplib::Server& http, Server& server, const FrontEnd& front);

/// The thread pool cpp-httplib should have for `c`: a thread per request that can be in flight
/// (running and waiting), and a few for /metrics, /health and refusals.
std::size_t http_threads(const ServerConfig& c);

/// Lets the listening socket on `port` queue as many connections as the system allows
/// (SOMAXCONN). cpp-httplib 0.11 listens with a backlog of 5, so a burst of clients connecting at
/// once (16 in a load test) finds the queue full and some are reset before the server ever sees
/// them; Linux takes a second listen() on a listening socket as a new backlog. Returns whether it
/// found the socket.
bool widen_listen_backlog(int port);

}  // namespace inferlab::ch13
