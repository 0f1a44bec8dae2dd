#include "chapters/13_serving/demo.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "chapters/13_serving/client.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/decode_bench.h"
#include "common/error.h"

namespace inferlab::ch13 {

using nlohmann::json;

void add_demo_options(CLI::App& app, DemoOptions& o) {
  app.add_option("--concurrency", o.concurrency, "Clients at once, one sweep point each")
      ->check(number_in(1, 256))
      ->capture_default_str();
  app.add_option("--requests", o.requests, "Requests per sweep point")->check(number_in(1, 10000))->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "Tokens each request generates")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  app.add_option("--shared-prefix", o.shared_prefix, "Tokens of the shared system prompt (0: no prefix comparison)")
      ->check(number_in(0, 1 << 20))
      ->capture_default_str();
  add_json_option(app, o.json);
}

Listening::Listening(Server& server, const FrontEnd& front, const http::Limits& limits)
    : front_(front), http_(std::make_unique<http::Front>(front_limits(server.config(), limits))) {
  add_routes(*http_, server, front_);
  http_->set_access_log(http::LogFormat::None);  // tests and the demo: 5xx only
  port_ = http_->bind("127.0.0.1", 0);
  thread_ = std::thread([this] { http_->serve(); });
  while (!http_->serving()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

Listening::~Listening() {
  http_->stop_serving();
  if (thread_.joinable()) thread_.join();
}

namespace {

// The validation corpus's stories, one per line.
std::vector<std::string> stories() {
  std::ifstream in(data_dir() + "/corpus/val.txt");
  IL_CHECK(in.good(), "cannot open ", data_dir(), "/corpus/val.txt");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  IL_CHECK(!out.empty(), data_dir(), "/corpus/val.txt holds no text");
  return out;
}

// The first `tokens` tokens of `text` (or all of it), as text.
std::string first_tokens(const Tokenizer& tok, const std::string& text, std::int64_t tokens) {
  std::vector<std::int32_t> ids = tok.encode(text, false);
  if (static_cast<std::int64_t>(ids.size()) > tokens) ids.resize(static_cast<std::size_t>(tokens));
  return tok.decode(ids, true);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

struct Point {
  int clients = 0, requests = 0, failed = 0;
  double seconds = 0, tokens = 0;
  std::vector<double> ttft, tpot, e2e;
};

// `o.requests` streamed completions from `clients` clients at once, each back to back.
Point sweep(int port, const std::string& model, const std::vector<std::string>& prompts, int clients, const DemoOptions& o) {
  Point p;
  p.clients = clients;
  std::mutex mu;
  int next = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      for (;;) {
        int i;
        {
          std::lock_guard lk(mu);
          if (next >= o.requests) return;
          i = next++;
        }
        const json body = {{"model", model},
                           {"prompt", prompts[static_cast<std::size_t>(i) % prompts.size()]},
                           {"max_tokens", o.max_tokens},
                           {"temperature", 0},
                           {"ignore_eos", true},
                           {"stream_options", {{"include_usage", true}}}};
        const Streamed s = stream("127.0.0.1", port, "/v1/completions", body);
        std::lock_guard lk(mu);
        ++p.requests;
        if (s.status != 200 || !s.done || s.chunks.empty()) {
          ++p.failed;
          continue;
        }
        const double n = s.chunks.back()["usage"].value("completion_tokens", 0.0);
        p.tokens += n;
        p.ttft.push_back(s.ttft);
        p.e2e.push_back(s.seconds);
        if (n > 1) p.tpot.push_back((s.seconds - s.ttft) / (n - 1));
      }
    });
  for (auto& t : threads) t.join();
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

// The fastest a server can generate with `clients` sequences decoding at once: one step reads
// the weights once and every sequence's cache, at the read ceiling of that many bytes, and gives
// one token per sequence.
struct Bound {
  double tokens_per_s = 0;
  double step_bytes = 0;
  metrics::ReadCeiling read;
};

Bound decode_bound(const models::Model& m, int clients, std::int64_t mean_length) {
  const std::vector<std::int64_t> lengths(static_cast<std::size_t>(clients), mean_length);
  const double bytes = m.step_bytes(lengths);  // the weights once, every sequence's cache by its layers' kinds
  Bound b;
  b.step_bytes = bytes;
  b.read = m.device() == Device::CPU ? metrics::cpu_read_ceiling(bytes)
                                     : metrics::read_ceiling_for(metrics::measure_ceiling(m.device()), bytes);
  b.tokens_per_s = clients * b.read.rate.best / bytes;
  return b;
}

}  // namespace

json run_demo(Server& server, Server& no_prefix, const FrontEnd& front, const DemoOptions& o) {
  const Tokenizer& tok = server.tokenizer();
  const models::Model& m = server.model();
  const auto lines = stories();
  std::vector<std::string> prompts;
  for (const std::string& s : lines) prompts.push_back(first_tokens(tok, s, 24));
  json out = {{"model", front.model_name}, {"max_tokens", o.max_tokens}};

  std::printf(
      "Serving (lecture: 推理的核心度量指标, TTFT, latency, throughput): %s behind HTTP on a loopback port,\n"
      "driven by %d streamed completions (%d tokens each, greedy) at each number of clients at once\n\n",
      front.model_name.c_str(), o.requests, o.max_tokens);
  {
    const Listening live(server, front);
    sweep(live.port(), front.model_name, prompts, 1, DemoOptions{{1}, 2, 4, 0, ""});  // warm-up
    std::printf("  %7s %10s %18s %9s %9s %9s %9s %8s\n", "clients", "tokens/s", "decode ceiling", "% of it", "TTFT p50",
                "TTFT p90", "TPOT p50", "e2e p50");
    json rows = json::array();
    metrics::CeilingLegend legend;
    for (int c : o.concurrency) {
      const Point p = sweep(live.port(), front.model_name, prompts, c, o);
      const double rate = p.tokens / p.seconds;
      const Bound b = decode_bound(m, c, 24 + o.max_tokens / 2);
      // The bytes a step of c decoding sequences reads, per second at this rate, against the ceiling.
      const double pct = legend.percent(std::to_string(c) + " clients", rate / c * b.step_bytes, b.read);
      std::printf("  %7d %10.0f %12.0f %5s %8.0f%% %7.1f ms %7.1f ms %7.2f ms %6.2f s%s\n", c, rate, b.tokens_per_s,
                  b.read.abbrev(), pct, 1e3 * median(p.ttft), 1e3 * quantile(p.ttft, 0.9), 1e3 * median(p.tpot),
                  median(p.e2e), p.failed ? (" (" + std::to_string(p.failed) + " failed)").c_str() : "");
      rows.push_back({{"clients", c},
                      {"requests", p.requests},
                      {"failed", p.failed},
                      {"seconds", p.seconds},
                      {"tokens", p.tokens},
                      {"tokens_per_s", rate},
                      {"decode_ceiling_tokens_per_s", b.tokens_per_s},
                      {"read_ceiling", metrics::to_json(b.read)},
                      {"ttft_p50_s", median(p.ttft)},
                      {"ttft_p90_s", quantile(p.ttft, 0.9)},
                      {"tpot_p50_s", median(p.tpot)},
                      {"e2e_p50_s", median(p.e2e)}});
    }
    legend.print("  ");
    std::printf(
        "  more clients, more tokens per second from the server, and a longer wait per token for each client:\n"
        "  throughput is not latency. The decode ceiling is one token per client per step, a step reading the\n"
        "  weights once and every cache at the read ceiling of that many bytes.\n\n");
    out["concurrency"] = rows;
  }
  if (o.shared_prefix > 0) {
    std::string system;
    for (const std::string& s : lines) {
      system += s + " ";
      if (static_cast<std::int64_t>(tok.encode(system, false).size()) > o.shared_prefix) break;
    }
    system = first_tokens(tok, system, o.shared_prefix);
    std::vector<std::string> asks;
    for (std::size_t i = 0; i < 8 && i < lines.size(); ++i)
      asks.push_back(system + " " + first_tokens(tok, lines[i + 1], 8));
    DemoOptions one = o;
    one.requests = static_cast<int>(asks.size()), one.max_tokens = 4;
    std::printf("  %zu requests one after another, each a %d-token shared system prompt and a question of its own:\n",
                asks.size(), o.shared_prefix);
    json rows = json::object();
    double ttft[2] = {0, 0};
    for (int cached = 1; cached >= 0; --cached) {
      Server& s = cached ? server : no_prefix;
      const Listening live(s, front);
      const Point p = sweep(live.port(), front.model_name, asks, 1, one);
      std::vector<double> later(p.ttft.begin() + std::min<std::ptrdiff_t>(1, static_cast<std::ptrdiff_t>(p.ttft.size())),
                                p.ttft.end());  // the first request fills the cache
      ttft[cached] = median(later);
      std::printf("    %-22s TTFT p50 %7.1f ms (after the first request)\n", cached ? "with prefix caching" : "without",
                  1e3 * ttft[cached]);
      rows[cached ? "prefix_caching" : "no_prefix_caching"] = {{"ttft_p50_s", ttft[cached]}, {"ttft_s", p.ttft}};
    }
    std::printf("    prefix caching cuts the time to first token %.1fx: the shared blocks are not computed again\n",
                ttft[1] > 0 ? ttft[0] / ttft[1] : 0.0);
    rows["speedup"] = ttft[1] > 0 ? ttft[0] / ttft[1] : 0.0;
    out["shared_prefix"] = rows;
  }
  return out;
}

}  // namespace inferlab::ch13
