// ch13_serve: chapters 11 and 12's engine as an OpenAI-compatible HTTP server.
//   ch13_serve                 serves the bundled model on http://127.0.0.1:8000 until SIGTERM or Ctrl-C
//   ch13_serve --model FILE    an HF folder, a llama2.c file or a GGUF (in its stored type)
//   ch13_serve demo            starts the server, drives it with clients at 1, 4 and 16 at once, and stops
#include <httplib.h>
#include <omp.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "chapters/13_serving/demo.h"
#include "chapters/13_serving/http.h"
#include "common/cli.h"
#include "common/gguf.h"
#include "common/gguf_tokenizer.h"
#include "common/http_front.h"
#include "common/models/model.h"

using namespace inferlab;
using namespace inferlab::ch13;

namespace {

// A model as the server runs it: any architecture the core loads (common/models/model.h), its
// tokenizer, the ids that end a sample.
struct Loaded {
  std::unique_ptr<models::Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::int64_t> eos;
};

Loaded load(const std::string& path, const std::string& tokenizer, Device d) {
  Loaded l;
  l.model = models::load_model(path, d);  // on the CPU a GGUF's tensors run as they are stored (chapter 09)
  l.tok = models::load_model_tokenizer(*l.model, tokenizer);
  l.eos = models::stop_ids(*l.model);  // EOS, and a GGUF's end-of-turn tokens, as llama.cpp stops
  return l;
}

std::string token_text(const Tokenizer& tok, std::optional<std::int64_t> id) {
  return id && *id >= 0 && *id < tok.vocab_size() ? tok.id_to_token(static_cast<std::int32_t>(*id)) : "";
}

FrontEnd front_end(const Loaded& l, const std::string& model_path, const std::string& name, const std::string& template_file,
                   const RenderBudget& budget) {
  FrontEnd f;
  f.model_name = name.empty() ? std::filesystem::path(model_path).filename().string() : name;
  if (f.model_name.empty()) f.model_name = std::filesystem::path(model_path).parent_path().filename().string();
  f.created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string bos = token_text(*l.tok, l.model->bos_id()),
                    eos = token_text(*l.tok, l.eos.empty() ? std::nullopt : std::optional(l.eos[0]));
  if (!template_file.empty()) {
    // The operator asked for this file: one that cannot be read or parsed stops the start.
    f.chat_template = ChatTemplate::from_file(template_file, bos, eos);
  } else {
    try {
      f.chat_template = ChatTemplate::for_model(model_path);
      if (!f.chat_template) f.chat_template_problem = model_path + " ships none";
    } catch (const Error& e) {  // the model's own: served without chat, and chat says why not
      f.chat_template_problem = e.what();
      std::fprintf(stderr, "ch13_serve: no chat: %s\n", e.what());
    }
  }
  if (f.chat_template) f.chat_template->set_budget(budget);
  return f;
}

struct Options {
  ModelOptions model;
  std::string tokenizer, host = "127.0.0.1", name, chat_template, log_format = "text";
  int port = 8000, threads = 0;
  ServerConfig server;
  double kv_budget_mib = 64, drain_seconds = 30;
  bool no_prefix_caching = false, specials_in_content = false;
  http::Limits limits;
  double max_body_mib = 8, max_header_kib = 64, max_receiving_mib = 256, template_mib = 256;
  std::size_t max_json_depth = 64;
  RenderBudget template_budget;
};

// The limits a client cannot pass (docs/reliability.md, "The server's limits").
void add_limit_options(CLI::App& app, Options& o) {
  auto limit = [&app](const char* flag, auto& value, const char* what, double lo, double hi) {
    app.add_option(flag, value, what)->check(number_in(lo, hi))->capture_default_str()->group("Limits");
  };
  http::Limits& l = o.limits;
  limit("--max-body-mib", o.max_body_mib, "A request body at most, MiB (more: 413)", 0.001, 4096);
  limit("--max-headers", l.max_headers, "Header lines of a request at most (more: 431)", 1, 100000);
  limit("--max-header-kib", o.max_header_kib, "A request's line and headers at most, KiB (more: 431)", 1, 65536);
  limit("--max-json-depth", o.max_json_depth, "Nesting of a request body's JSON at most (deeper: 400)", 2, 10000);
  limit("--max-connections", l.max_connections, "Open connections at most (more: 503 at once)", 1, 1 << 20);
  limit("--max-receiving-mib", o.max_receiving_mib,
        "Request bytes held at once, all connections, MiB (more: 503); at least --max-body-mib", 0.001, 1 << 20);
  limit("--header-timeout", l.header_timeout_s, "Seconds a request's line and headers may take (then 408)", 0.01, 3600);
  limit("--body-timeout", l.body_timeout_s, "Seconds a request body may send nothing (then 408)", 0.01, 3600);
  limit("--keep-alive-timeout", l.keep_alive_timeout_s, "Seconds an idle connection is kept between requests", 0.01, 3600);
  limit("--keep-alive-requests", l.keep_alive_requests, "Requests on one connection at most", 1, 1e9);
  limit("--write-timeout", l.write_timeout_s,
        "Seconds a client may read nothing of its answer (then it is taken as gone, and its request aborted)", 0.01, 3600);
  limit("--template-steps", o.template_budget.steps,
        "Steps (statements, expressions, loop turns) of one chat-template render at most (then 400)", 1000, 1 << 30);
  limit("--template-mib", o.template_mib, "Text and data one chat-template render may make, MiB (then 400)", 1, 1 << 20);
}

void add_server_options(CLI::App& app, Options& o) {
  add_model_option(app, o.model);
  add_device_option(app, o.model);
  app.add_option("--tokenizer", o.tokenizer, "Tokenizer file or folder (default: the model's own)");
  app.add_option("--served-model-name", o.name, "The model's id for clients (default: the model's file or folder name)");
  app.add_option("--max-num-seqs", o.server.scheduler.max_running, "Sequences in one step at most")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  app.add_option("--max-batched-tokens", o.server.scheduler.max_step_tokens,
                 "Tokens in one step at most (a long prompt enters in chunks of what is left)")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--kv-budget", o.kv_budget_mib, "KV cache pool, MiB")
      ->check(number_in(0.01, 1 << 20))
      ->capture_default_str();
  app.add_option("--block-size", o.server.block_size, "Positions per KV block")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  app.add_flag("--no-prefix-caching", o.no_prefix_caching, "Never share the blocks of a common prompt prefix");
  app.add_option("--max-waiting", o.server.max_waiting, "Requests queued behind the running batch at most (then 429)")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads for the model (default: OpenMP's choice)")->check(number_in(1, 1024));
  app.add_option("--chat-template", o.chat_template, "A Jinja chat template file, instead of the model's own")
      ->check(input_file("chat template"));
  app.add_flag("--special-tokens-in-content", o.specials_in_content,
               "Read special tokens' text in chat messages as those tokens (default: as text, so that a message "
               "cannot forge the conversation's turns)");
  add_limit_options(app, o);
}

int serve(const Options& o, const DemoOptions* demo) {
  const Device d = o.model.resolved_device();
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const Loaded l = load(o.model.model, o.tokenizer, d);
  ServerConfig c = o.server;
  c.kv_budget_bytes = static_cast<std::int64_t>(o.kv_budget_mib * (1 << 20));
  c.prefix_caching = !o.no_prefix_caching;
  c.scheduler.policy = ch11::Policy::Continuous;
  c.scheduler.validate();
  RenderBudget budget = o.template_budget;
  budget.bytes = static_cast<std::size_t>(o.template_mib * (1 << 20));
  FrontEnd front = front_end(l, o.model.model, o.name, o.chat_template, budget);
  front.max_json_depth = o.max_json_depth;
  front.specials_in_content = o.specials_in_content;
  http::Limits limits = o.limits;
  limits.max_body_bytes = static_cast<std::size_t>(o.max_body_mib * (1 << 20));
  limits.max_head_bytes = static_cast<std::size_t>(o.max_header_kib * 1024);
  limits.max_receiving_bytes = static_cast<std::size_t>(o.max_receiving_mib * (1 << 20));
  limits = front_limits(c, limits);
  IL_CHECK(limits.max_receiving_bytes >= limits.max_body_bytes, "--max-receiving-mib ", o.max_receiving_mib,
           " is below --max-body-mib ", o.max_body_mib, ": no body could be received");
  limits.validate();
  if (demo) {  // the same model served twice, with and without prefix caching, for the comparison
    ServerConfig plain = c;
    plain.prefix_caching = false;
    Server server(*l.model, *l.tok, l.eos, c), no_prefix(*l.model, *l.tok, l.eos, plain);
    const nlohmann::json r = run_demo(server, no_prefix, front, *demo);
    if (!demo->json.empty()) write_json(demo->json, r, {o.model.model});
    return 0;
  }

  // SIGTERM, SIGINT and SIGHUP (a closed terminal) are taken by one thread (sigwait), not by a
  // handler: every other thread starts with them blocked, and the one that waits for them drains
  // the server and stops it. Each ends the server the same way: what is in flight finishes.
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not the end of the server

  Server server(*l.model, *l.tok, l.eos, c);
  if (c.prefix_caching && !server.prefix_caching())
    std::fprintf(stderr, "ch13_serve: prefix caching off: %s keeps %s, and a ring or a state has no prefix to share\n",
                 l.model->architecture().c_str(), l.model->describe_layers().c_str());
  http::Front http(limits);
  http.set_access_log(http::parse_log_format(o.log_format));
  add_routes(http, server, front);
  const int port = http.bind(o.host, o.port);
  const std::string url = http::url(o.host, port);
  std::printf("ch13_serve: serving %s on %s (%s; %s)\n", front.model_name.c_str(), url.c_str(),
              server.pool().describe().c_str(),
              front.chat_template ? ("chat template " + front.chat_template->origin()).c_str() : "no chat template");
  std::printf(
      "  try: curl %s/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \"%s\", \"prompt\": "
      "\"Once upon a time\", \"max_tokens\": 32}'\n",
      url.c_str(), front.model_name.c_str());
  std::printf("  stop with Ctrl-C, SIGTERM or SIGHUP (what is in flight finishes first, up to %g s)\n", o.drain_seconds);
  std::fflush(stdout);

  std::atomic<bool> served{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stops, &sig);
    if (served) return;  // woken by the main thread: the server ended without a signal
    const Gauges g = server.gauges();
    std::fprintf(stderr, "ch13_serve: %s: no new requests; finishing the %lld in flight (up to %g s)\n",
                 sig == SIGTERM  ? "SIGTERM"
                 : sig == SIGHUP ? "SIGHUP"
                                 : "SIGINT",
                 static_cast<long long>(g.in_flight), o.drain_seconds);
    server.drain(o.drain_seconds);
    http.stop_serving();
  });
  http.serve();
  served = !server.draining();
  if (served) pthread_kill(stopper.native_handle(), SIGTERM);  // serving ended without a signal: end the waiter
  stopper.join();
  std::printf("ch13_serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 13: serving. Chapters 11 and 12's engine as an OpenAI-compatible HTTP server", "ch13_serve"};
  help_footer(app,
              "serves the bundled model (tiny-mha) on http://127.0.0.1:8000 with the OpenAI API (/v1/completions, "
              "/v1/chat/completions, streamed or not; /v1/models, /health, /metrics) until Ctrl-C, SIGTERM or SIGHUP",
              "chapters/13_serving/README.md", "推理生态");
  Options o;
  add_server_options(app, o);
  app.add_option("--host", o.host, "Address to listen on (127.0.0.1: this machine only)")->capture_default_str();
  app.add_option("--port", o.port, "Port (0: any free one)")->check(number_in(0, 65535))->capture_default_str();
  app.add_option("--log-format", o.log_format, "The access log on stderr, a line per request: text, json or none (5xx only)")
      ->check(CLI::IsMember({"text", "json", "none"}))
      ->capture_default_str();
  app.add_option("--drain-timeout", o.drain_seconds,
                 "On SIGTERM, SIGINT or SIGHUP, seconds to let requests in flight finish")
      ->check(number_in(0, 3600))
      ->capture_default_str();
  DemoOptions demo;
  auto* dm = app.add_subcommand("demo",
                                "Starts the server on a loopback port, drives it with streamed clients at 1, 4 and 16 at "
                                "once and with a shared system prompt, prints what it measured, and stops");
  add_demo_options(*dm, demo);
  dm->fallthrough();  // the server's own options (--model, --max-num-seqs, ...) may follow `demo`
  app.require_subcommand(0, 1);
  return run_cli(app, argc, argv, [&] {
    if (*dm)
      for (const char* listening : {"--host", "--port", "--drain-timeout", "--log-format"})
        IL_CHECK(app.count(listening) == 0, listening, " has no use with demo: it listens on a free loopback port");
    return serve(o, *dm ? &demo : nullptr);
  });
}
