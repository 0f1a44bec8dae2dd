// Chapter 13's request parser (ch13::parse_completion) on a request body, as /v1/completions and
// as /v1/chat/completions read it. The promise: a body a client got wrong ends in an ApiError
// (HTTP 400 and OpenAI's error object naming the field), never a crash or another exception.
// tools/fuzz.sh gives libFuzzer openai.dict, the request's JSON keys and values, so that
// mutations speak the API.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "chapters/13_serving/openai.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const ch13::CompletionParams p = ch13::parse_completion(body, chat);
      if (p.n < 1 || p.stop.size() > 4 || !(p.temperature >= 0) || !(p.top_p > 0 && p.top_p <= 1)) {
        std::fprintf(stderr, "accepted out of range: n %lld, %zu stops, temperature %g, top_p %g\n",
                     static_cast<long long>(p.n), p.stop.size(), p.temperature, p.top_p);
        std::abort();
      }
    } catch (const ch13::ApiError& e) {
      if (e.status != 400) std::abort();  // a request's own fault is a 400
      // As the server writes it (http.cpp): bytes that are not UTF-8 in a message that quotes the
      // body become U+FFFD.
      ch13::error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not an ApiError: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
