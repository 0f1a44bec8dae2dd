// The HTTP front as a whole: raw bytes as one connection's input, through the front's request
// reader (common/http_front.h, with its limits), cpp-httplib's request parsing and routing, and
// chapter 13's handlers over a Server on the bundled model, in process (http::Front::serve_bytes).
// The promise: every input gets HTTP answers and nothing else: no crash, no sanitizer report, no
// exception out of the front, and no 500 (a handler that failed; a client's mistake is a 4xx).
// tools/fuzz.sh gives libFuzzer http.dict, the requests' words.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "chapters/01_naive_decode/llama.h"
#include "chapters/13_serving/http.h"
#include "common/cli.h"
#include "common/error.h"

namespace {

using namespace inferlab;

// The bundled model with a context of 48 positions: a chat request without max_tokens may use
// the rest of the context, and 500 tokens under the sanitizers would pass libFuzzer's timeout.
models::Llama short_context_model() {
  models::Llama m = models::load_llama(default_model_path());
  m.config.max_position_embeddings = 48;
  return m;
}

struct Served {
  models::Llama model = short_context_model();
  std::unique_ptr<Tokenizer> tok = Tokenizer::for_model(default_model_path());
  ch13::Server server{model, *tok, model.config.eos_token_ids, config()};
  ch13::FrontEnd front_end = front_end_of();
  http::Front front{ch13::front_limits(server.config(), limits())};

  Served() {
    ch13::add_routes(front, server, front_end);
    front.set_access_log(http::LogFormat::None);
  }
  static ch13::ServerConfig config() {
    ch13::ServerConfig c;
    c.scheduler = {ch11::Policy::Continuous, 4, 64};
    c.kv_budget_bytes = 4 << 20;
    c.max_waiting = 4;
    return c;
  }
  static http::Limits limits() {
    http::Limits l;
    l.max_body_bytes = 64 << 10;  // the fuzzer's inputs are short: reach the limits with them
    l.max_head_bytes = 4 << 10;
    l.max_headers = 16;
    l.keep_alive_requests = 8;
    return l;
  }
  static ch13::FrontEnd front_end_of() {
    ch13::FrontEnd f;
    f.model_name = "tiny-mha";
    f.chat_template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "chatml");
    return f;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Served* s = new Served();  // one server for the whole run, as a real one serves every client
  std::string out;
  try {
    out = s->front.serve_bytes(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an exception left the front: %s\n", e.what());
    std::abort();
  }
  for (std::size_t at = out.find("HTTP/1.1 "); at != std::string::npos; at = out.find("\r\nHTTP/1.1 ", at + 1)) {
    const std::size_t code = at + (out.compare(at, 2, "\r\n") == 0 ? 11 : 9);
    if (out.compare(code, 3, "500") == 0) {
      std::fprintf(stderr, "a 500 answer: %s\n", out.substr(code, 400).c_str());
      std::abort();
    }
  }
  return 0;
}
