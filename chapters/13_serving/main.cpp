// ch13_serve: chapters 11 and 12's engine as an OpenAI-compatible HTTP server.
//   ch13_serve                 serves the bundled model on http://127.0.0.1:8000 until SIGTERM or Ctrl-C
//   ch13_serve --model FILE    an HF folder, a llama2.c file or a GGUF (in its stored type)
//   ch13_serve demo            starts the server, drives it with clients at 1, 4 and 16 at once, and stops
#include <httplib.h>
#include <omp.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "chapters/09_quantization/gguf_model.h"
#include "chapters/09_quantization/qmodel.h"
#include "chapters/13_serving/demo.h"
#include "chapters/13_serving/http.h"
#include "common/cli.h"
#include "common/gguf.h"
#include "common/gguf_tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch13;

namespace {

// A model as the server runs it: the weights, their tokenizer, the ids that end a sample.
struct Loaded {
  std::unique_ptr<gguf::File> file;  // a GGUF's tensors are read from it while it serves
  ch01::Llama model;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::int64_t> eos;
};

bool is_gguf(const std::string& path) { return std::filesystem::path(path).extension() == ".gguf"; }

Loaded load(const std::string& path, const std::string& tokenizer, Device d) {
  Loaded l;
  if (is_gguf(path)) {  // on the CPU every tensor runs as it is stored (chapter 09)
    l.file = std::make_unique<gguf::File>(path);
    l.model = ch09::load_gguf(*l.file);
    if (d == Device::CPU) ch09::interleave_blocks(l.model);
    else l.model = l.model.to(d, DType::F32);
    l.tok = ch09::gguf_tokenizer(*l.file, tokenizer, path);
    l.eos = gguf::stop_ids(*l.file);  // EOS and the end-of-turn tokens the file names, as llama.cpp stops
  } else {
    l.model = ch01::load_llama(path).to(d, DType::F32);
    l.tok = Tokenizer::for_model(path, tokenizer);
  }
  for (std::int64_t e : l.model.config.eos_token_ids)
    if (std::find(l.eos.begin(), l.eos.end(), e) == l.eos.end()) l.eos.push_back(e);
  check_tokenizer_vocab(*l.tok, l.model.config.vocab_size, path);
  return l;
}

std::string token_text(const Tokenizer& tok, std::optional<std::int64_t> id) {
  return id && *id >= 0 && *id < tok.vocab_size() ? tok.id_to_token(static_cast<std::int32_t>(*id)) : "";
}

FrontEnd front_end(const Loaded& l, const std::string& model_path, const std::string& name,
                   const std::string& template_file) {
  FrontEnd f;
  f.model_name = name.empty() ? std::filesystem::path(model_path).filename().string() : name;
  if (f.model_name.empty()) f.model_name = std::filesystem::path(model_path).parent_path().filename().string();
  f.created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string bos = token_text(*l.tok, l.model.config.bos_token_id),
                    eos = token_text(*l.tok, l.eos.empty() ? std::nullopt : std::optional(l.eos[0]));
  try {
    if (!template_file.empty()) f.chat_template = ChatTemplate::from_file(template_file, bos, eos);
    else f.chat_template = ChatTemplate::for_model(model_path);
    if (!f.chat_template) f.chat_template_problem = model_path + " ships none";
  } catch (const Error& e) {  // served without chat: completions still work, and chat says why not
    f.chat_template_problem = e.what();
    std::fprintf(stderr, "ch13_serve: no chat: %s\n", e.what());
  }
  return f;
}

struct Options {
  ModelOptions model;
  std::string tokenizer, host = "127.0.0.1", name, chat_template;
  int port = 8000, threads = 0;
  ServerConfig server;
  double kv_budget_mib = 64, drain_seconds = 30;
  bool no_prefix_caching = false;
};

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
  const FrontEnd front = front_end(l, o.model.model, o.name, o.chat_template);
  if (demo) {  // the same model served twice, with and without prefix caching, for the comparison
    ServerConfig plain = c;
    plain.prefix_caching = false;
    Server server(l.model, *l.tok, l.eos, c), no_prefix(l.model, *l.tok, l.eos, plain);
    const nlohmann::json r = run_demo(server, no_prefix, front, *demo);
    if (!demo->json.empty()) write_json(demo->json, r, {o.model.model});
    return 0;
  }

  // SIGTERM and SIGINT are taken by one thread (sigwait), not by a handler: every other thread
  // starts with them blocked, and the one that waits for them drains the server and stops it.
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not the end of the server

  Server server(l.model, *l.tok, l.eos, c);
  httplib::Server http;
  const std::size_t pool = http_threads(c);
  http.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  add_routes(http, server, front);
  const int port = o.port == 0 ? http.bind_to_any_port(o.host) : (http.bind_to_port(o.host, o.port) ? o.port : -1);
  IL_CHECK(port > 0, "cannot listen on ", o.host, ":", o.port, ": ", std::strerror(errno),
           o.port ? " (is another server on that port? --port 0 takes any free one)" : "");
  widen_listen_backlog(port);  // a burst of clients connecting at once is queued, not reset
  const std::string url = "http://" + o.host + ":" + std::to_string(port);
  std::printf(
      "ch13_serve: serving %s on %s (%s; %s)\n", front.model_name.c_str(), url.c_str(),
      ch12::PagedPool(l.model.config, c.kv_budget_bytes, c.block_size, Device::CPU, c.prefix_caching).describe().c_str(),
      front.chat_template ? ("chat template " + front.chat_template->origin()).c_str() : "no chat template");
  std::printf(
      "  try: curl %s/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \"%s\", \"prompt\": "
      "\"Once upon a time\", \"max_tokens\": 32}'\n",
      url.c_str(), front.model_name.c_str());
  std::printf("  stop with Ctrl-C or SIGTERM (what is in flight finishes first, up to %.0f s)\n", o.drain_seconds);
  std::fflush(stdout);

  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stops, &sig);
    const Gauges g = server.gauges();
    std::fprintf(stderr, "ch13_serve: %s: no new requests; finishing the %lld in flight\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(g.in_flight));
    server.drain(o.drain_seconds);
    http.stop();
  });
  const bool ok = http.listen_after_bind();
  if (!ok && http.is_running()) http.stop();
  if (!server.draining()) pthread_kill(stopper.native_handle(), SIGTERM);  // listening failed: end the waiter
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
              "/v1/chat/completions, streamed or not; /v1/models, /health, /metrics) until Ctrl-C or SIGTERM",
              "chapters/13_serving/README.md", "推理生态");
  Options o;
  add_server_options(app, o);
  app.add_option("--host", o.host, "Address to listen on (127.0.0.1: this machine only)")->capture_default_str();
  app.add_option("--port", o.port, "Port (0: any free one)")->check(number_in(0, 65535))->capture_default_str();
  app.add_option("--drain-timeout", o.drain_seconds, "On SIGTERM, seconds to let requests in flight finish")
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
      for (const char* listening : {"--host", "--port", "--drain-timeout"})
        IL_CHECK(app.count(listening) == 0, listening, " has no use with demo: it listens on a free loopback port");
    return serve(o, *dm ? &demo : nullptr);
  });
}
