#pragma once
/// @file demo.h
/// @brief Chapter 13's bare-run measurement: the server driven over HTTP by its own clients.
///
/// Two of the lecture's points, measured end to end through the server:
///  - throughput is not latency: with more clients at once, the engine batches more sequences
///    per step, so the tokens per second of the whole server rise while each client's time per
///    token rises too (and the step reads the weights once for all of them: the read ceiling of
///    a step's bytes bounds both);
///  - a shared prompt prefix is computed once: with prefix caching, requests that start with the
///    same system prompt find its KV blocks already filled, and their time to first token falls.

#include <cstdint>
#include <string>
#include <vector>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "chapters/13_serving/http.h"

namespace inferlab::ch13 {

struct DemoOptions {
  std::vector<int> concurrency = {1, 4, 16};  ///< clients at once, one sweep point each
  int requests = 16;                          ///< requests per sweep point
  int max_tokens = 48;                        ///< tokens each request generates (EOS ignored)
  int shared_prefix = 384;                    ///< tokens of the shared system prompt
  std::string json;                           ///< --json FILE
};

void add_demo_options(CLI::App& app, DemoOptions& o);

/// A Server listening on a free loopback port behind the HTTP front (with `limits`), in a
/// thread of its own; stops when destroyed. It keeps its own copy of `front`. Its access log
/// has the 5xx lines only.
class Listening {
 public:
  Listening(Server& server, const FrontEnd& front, const http::Limits& limits = {});
  ~Listening();
  Listening(const Listening&) = delete;
  Listening& operator=(const Listening&) = delete;
  int port() const { return port_; }
  http::Front& front() { return *http_; }

 private:
  FrontEnd front_;  // the routes refer to it
  std::unique_ptr<http::Front> http_;
  std::thread thread_;
  int port_ = 0;
};

/// Runs the demo on `server` (and, for the prefix-caching comparison, on `no_prefix`, the same
/// model served without it); prints its tables and returns them as JSON.
nlohmann::json run_demo(Server& server, Server& no_prefix, const FrontEnd& front, const DemoOptions& o);

}  // namespace inferlab::ch13
