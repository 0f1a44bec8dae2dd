#pragma once
/// @file client.h
/// @brief Chapter 13: a small client of the server's completions endpoint, streamed, that times
/// what a user feels: the first token, every token after it, the whole answer.
///
/// The chapter's demo drives the server with it, and the tests read the server's events through
/// it. Any OpenAI client works the same way (tests/serve/ drives the server with the `openai`
/// package and curl).

#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace inferlab::ch13 {

/// One streamed completion, as the client saw it.
struct Streamed {
  int status = 0;                      ///< the HTTP status (0: no answer)
  std::string body;                    ///< the raw answer (server-sent events, or an error object)
  std::vector<nlohmann::json> chunks;  ///< every event's JSON payload, in order ([DONE] left out)
  bool done = false;                   ///< the stream ended with data: [DONE]
  std::vector<std::string> text;       ///< each choice's text, put together
  std::vector<std::string> finish_reason;
  double ttft = -1, seconds = 0;    ///< first text, and the whole answer, from the request
  std::vector<double> token_times;  ///< when each text chunk came, from the request (seconds)
};

/// POSTs `body` (with "stream": true) to `path` on host:port and reads the events as they come.
/// `disconnect_after` > 0: closes the connection after that many events (a client that goes away).
Streamed stream(const std::string& host, int port, const std::string& path, nlohmann::json body, int disconnect_after = 0);

/// POSTs `body` without streaming; the status and the parsed answer (null when it is not JSON).
std::pair<int, nlohmann::json> post(const std::string& host, int port, const std::string& path, const nlohmann::json& body);

}  // namespace inferlab::ch13
