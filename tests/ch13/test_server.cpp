// Chapter 13: the server over HTTP on a loopback port. Served equals alone (16 clients at once,
// streamed and not, greedy and seeded, parallel samples); a client that goes away gives its blocks
// back; a full queue is refused with Retry-After, never queued without bound; errors are OpenAI's
// error object naming the field; a drain finishes what is in flight and refuses the rest.
#include <gtest/gtest.h>

#include <httplib.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "bundled_model.h"
#include "chapters/13_serving/client.h"
#include "chapters/13_serving/demo.h"
#include "chapters/13_serving/openai.h"
#include "common/eval.h"
#include "common/gguf.h"
#include "test_util.h"

using namespace inferlab;
using namespace inferlab::ch13;
using nlohmann::json;

namespace {

const std::string kData = INFERLAB_DATA_DIR;

const models::Llama& tiny_mha() { return test::bundled_llama("tiny-mha"); }

const Tokenizer& tiny_tokenizer() {
  static const auto tok = Tokenizer::load(kData + "/models/tiny-mha");
  return *tok;
}

ServerConfig small_config() {
  ServerConfig c;
  c.scheduler = {ch11::Policy::Continuous, 6, 48};                // chunked prefill, and more clients than slots
  c.kv_budget_bytes = tiny_mha().config.kv_cache_bytes(1024, 4);  // tight: preemptions happen
  c.block_size = 16;
  c.max_waiting = 64;
  return c;
}

FrontEnd front() {
  FrontEnd f;
  f.model_name = "tiny-mha";
  f.chat_template_problem = "tiny-mha ships none";
  return f;
}

// What the request gets alone (chapter 11's run_alone), as the text the server would send.
std::string alone_text(const ch11::Request& r, const std::vector<std::int32_t>& prompt) {
  const ch11::Sequence s = ch11::run_alone(tiny_mha(), r);
  OutputText out(tiny_tokenizer(), prompt, {});
  return out.update(s.tokens, true);
}

using test::eventually;

}  // namespace

// 16 clients at once, mixed prompt lengths and outputs, half streamed, greedy and seeded, one with
// 3 parallel samples: every answer is what the request gets alone.
TEST(Serving, EveryClientGetsWhatItGetsAloneUnderConcurrency) {
  Server server(tiny_mha(), tiny_tokenizer(), tiny_mha().config.eos_token_ids, small_config());
  const Listening live(server, front());
  const auto text = eval::validation_tokens(kData, 4000);
  struct Ask {
    std::vector<std::int32_t> prompt;
    int max_tokens;
    double temperature;
    std::uint64_t seed;
    int n;
    bool stream;
  };
  std::vector<Ask> asks;
  for (int i = 0; i < 16; ++i) {
    const std::size_t at = static_cast<std::size_t>(97 * i), len = static_cast<std::size_t>(3 + (i * 37) % 120);
    asks.push_back({{text.begin() + static_cast<long>(at), text.begin() + static_cast<long>(at + len)},
                    4 + (i * 13) % 40,
                    i % 3 == 0 ? 0.0 : 0.8,
                    static_cast<std::uint64_t>(100 + i),
                    i == 5 ? 3 : 1,
                    i % 2 == 0});
  }
  std::vector<std::vector<std::string>> got(asks.size());
  std::vector<std::vector<std::string>> reasons(asks.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < asks.size(); ++i)
    clients.emplace_back([&, i] {
      const Ask& a = asks[i];
      const json body = {{"model", "tiny-mha"},          {"prompt", a.prompt}, {"max_tokens", a.max_tokens},
                         {"temperature", a.temperature}, {"seed", a.seed},     {"n", a.n}};
      if (a.stream) {
        const Streamed s = stream("127.0.0.1", live.port(), "/v1/completions", body);
        ASSERT_EQ(s.status, 200) << s.body;
        ASSERT_TRUE(s.done) << "no [DONE]: " << s.body;
        got[i] = s.text, reasons[i] = s.finish_reason;
      } else {
        const auto [status, r] = post("127.0.0.1", live.port(), "/v1/completions", body);
        ASSERT_EQ(status, 200) << r.dump();
        for (const json& c : r["choices"]) {
          got[i].push_back(c["text"]), reasons[i].push_back(c["finish_reason"]);
        }
      }
    });
  for (auto& c : clients) c.join();
  for (std::size_t i = 0; i < asks.size(); ++i) {
    const Ask& a = asks[i];
    ASSERT_EQ(got[i].size(), static_cast<std::size_t>(a.n)) << "request " << i;
    for (int k = 0; k < a.n; ++k) {
      ch11::Request r;
      r.prompt = a.prompt, r.max_new_tokens = a.max_tokens;
      r.sampling.temperature = static_cast<float>(a.temperature), r.sampling.seed = a.seed + static_cast<std::uint64_t>(k);
      r.sampling.vocab = tiny_tokenizer().vocab_size();
      r.stop_ids = tiny_mha().config.eos_token_ids;
      EXPECT_EQ(got[i][static_cast<std::size_t>(k)], alone_text(r, a.prompt)) << "request " << i << ", sample " << k;
      const ch11::Sequence s = ch11::run_alone(tiny_mha(), r);
      EXPECT_EQ(reasons[i][static_cast<std::size_t>(k)], s.generated() == a.max_tokens ? "length" : "stop");
    }
  }
  EXPECT_TRUE(eventually([&] { return server.gauges().blocks_used == 0 && server.gauges().in_flight == 0; }));
}

// A streamed client that closes its connection after two events: the engine aborts its sequence
// and its blocks return to the pool, while another request runs on unchanged.
TEST(Serving, AClientThatGoesAwayGivesItsBlocksBack) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());  // no EOS: runs to max_tokens
  const Listening live(server, front());
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0}};
  const Streamed gone = stream("127.0.0.1", live.port(), "/v1/completions", body, 2);
  EXPECT_EQ(gone.chunks.size(), 2u);
  EXPECT_TRUE(eventually([&] {
    const Gauges g = server.gauges();
    return g.running == 0 && g.waiting == 0 && g.blocks_used == 0 && g.in_flight == 0;
  })) << server.metrics();
  EXPECT_NE(server.metrics().find("inferlab_requests_finished_total{reason=\"abort\"} 1"), std::string::npos)
      << server.metrics();
  const Streamed whole = stream("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 8}});
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.finish_reason, std::vector<std::string>{"length"});
}

// More requests than the running slots and the waiting queue hold: the rest are refused at once
// with 429 and Retry-After, and every accepted one is answered.
TEST(Serving, AFullQueueIsRefusedWithRetryAfter) {
  ServerConfig c = small_config();
  c.scheduler = {ch11::Policy::Continuous, 1, 16};
  c.max_waiting = 2;
  Server server(tiny_mha(), tiny_tokenizer(), {}, c);
  const Listening live(server, front());
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&] {
      httplib::Client cli("127.0.0.1", live.port());
      cli.set_read_timeout(60, 0);
      const auto res = cli.Post("/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 60}}.dump(), "application/json");
      if (!res) {
        ++other;
      } else if (res->status == 200) {
        ++ok;
      } else if (res->status == 429 && res->get_header_value("Retry-After") == "1" &&
                 json::parse(res->body)["error"]["type"] == "rate_limit_exceeded") {
        ++refused;
      } else {
        ++other;
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(other, 0);
  EXPECT_GE(refused, 1) << "8 requests at once, 1 running slot and 2 waiting places";
  EXPECT_GE(ok, 2) << "the waiting places hold at least 2 (a request counts as waiting until the engine takes it)";
  EXPECT_EQ(ok + refused, 8);
}

// Errors over HTTP are OpenAI's error object, with the status clients' libraries expect.
TEST(Serving, ErrorsNameTheField) {
  Server server(tiny_mha(), tiny_tokenizer(), tiny_mha().config.eos_token_ids, small_config());
  const Listening live(server, front());
  const auto expect_error =
      [&](const std::string& path, const std::string& body, int status, const std::string& param, const std::string& says) {
    httplib::Client cli("127.0.0.1", live.port());
    const auto res = cli.Post(path, body, "application/json");
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, status) << body << ": " << res->body;
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << res->body;
    EXPECT_EQ(j["error"]["param"], param.empty() ? json(nullptr) : json(param)) << res->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(says), std::string::npos) << res->body;
  };
  const std::string long_prompt = [] {
    std::string s;
    for (int i = 0; i < 600; ++i) s += " time";
    return s;
  }();
  expect_error("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "model", "does not exist");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", "must be in");
  expect_error("/v1/completions", "{\"prompt\": ", 400, "", "not valid JSON");
  expect_error("/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "prompt", "maximum context length is 512");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 600})", 400, "max_tokens", "maximum context length");
  expect_error("/v1/completions", R"({"prompt": [5000]})", 400, "prompt", "outside the model's vocabulary");
  expect_error("/v1/completions", R"({"prompt": "x", "n": 7})", 400, "n", "--max-num-seqs");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})", 400, "messages",
               "no chat template");
  expect_error("/v1/nothing", "{}", 404, "", "no such endpoint");
  httplib::Client cli("127.0.0.1", live.port());
  const auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny-mha");
  const auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const auto metrics = cli.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name :
       {"inferlab_requests_accepted_total 0", "inferlab_requests_rejected_total 9", "inferlab_kv_blocks_total",
        "inferlab_time_to_first_token_seconds_bucket", "inferlab_num_requests_waiting 0", "inferlab_kv_blocks_used 0"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name << " in\n" << metrics->body;
}

// A drain lets what is in flight finish and refuses what comes after with 503.
TEST(Serving, ADrainFinishesWhatIsInFlightAndRefusesTheRest) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const Listening live(server, front());
  Streamed first;
  std::thread client([&] {
    first = stream("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 120}});
  });
  ASSERT_TRUE(eventually([&] { return server.gauges().in_flight == 1; }));
  std::thread drainer([&] { server.drain(30); });
  ASSERT_TRUE(eventually([&] { return server.draining(); }));
  const auto [status, r] = post("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "x"}});
  EXPECT_EQ(status, 503) << r.dump();
  drainer.join();
  client.join();
  EXPECT_EQ(first.status, 200);
  EXPECT_TRUE(first.done);
  EXPECT_EQ(first.finish_reason, std::vector<std::string>{"length"});
  EXPECT_EQ(server.gauges().in_flight, 0);
}

// Out of time, a drain aborts what is left: the client is told (finish_reason "abort") rather
// than left waiting.
TEST(Serving, ADrainOutOfTimeAbortsAndTellsTheClient) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const Listening live(server, front());
  Streamed first;
  std::thread client([&] {
    first = stream("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 500}});
  });
  ASSERT_TRUE(eventually([&] { return server.gauges().in_flight == 1; }));
  server.drain(0);
  client.join();
  EXPECT_EQ(first.status, 200);
  EXPECT_TRUE(first.done);
  EXPECT_EQ(first.finish_reason, std::vector<std::string>{"abort"});
  EXPECT_EQ(server.gauges().blocks_used, 0);
}

// ---------------------------------------------------------------------------------------------
// The engine's event stream (GET /v1/engine/events, engine_events.h).

namespace {

// Reads GET /v1/engine/events on a thread of its own, parsing each event, until `enough` says so
// (or 30 s pass). Each event is handed to `enough` as it comes.
class Watcher {
 public:
  Watcher(int port, std::function<bool(const json&)> enough)
      : thread_([this, port, enough = std::move(enough)] {
          httplib::Client cli("127.0.0.1", port);
          cli.set_read_timeout(30, 0);
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          std::string pending;
          httplib::Request req;
          req.method = "GET";
          req.path = "/v1/engine/events";
          req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
            pending.append(data, n);
            for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
              const std::string event = pending.substr(0, end);
              pending.erase(0, end + 2);
              if (event.rfind("data: ", 0) != 0) continue;  // a comment: the stream is idle
              json j = json::parse(event.substr(6));
              std::lock_guard lk(mu_);
              events_.push_back(j);
              if (enough(j)) return false;
            }
            return std::chrono::steady_clock::now() < until;
          };
          httplib::Response res;
          httplib::Error err = httplib::Error::Success;
          cli.send(req, res, err);
          status_ = res.status;
        }) {}
  ~Watcher() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::vector<json> events() const {
    std::lock_guard lk(mu_);
    return events_;
  }
  int status() const { return status_; }

 private:
  mutable std::mutex mu_;
  std::vector<json> events_;
  std::atomic<int> status_{0};
  std::thread thread_;  // last: starts once the rest is there
};

bool holds_a_block(const json& e) {
  const std::string map = e["blocks"].value("map", "");
  return map.find_first_of("upsw") != std::string::npos;
}

}  // namespace

// A watcher sees the request's steps (its prompt as prefill, then one decode token a step), the
// blocks it holds while it runs, and every block free again after.
TEST(EngineEvents, AWatcherSeesTheStepsOfARequestAndItsBlocksComeBack) {
  // A watcher gets an event at most every 50 ms, and on a busy machine its thread may not run for
  // longer than the whole request takes. So the engine waits after the request's first decode
  // step (up to 10 s) until the watcher has seen it running: the events it then sends are the
  // steps' own, whatever the load.
  std::atomic<Watcher*> watching{nullptr};
  bool held = false;
  ServerConfig config = small_config();
  config.after_step = [&](const ch11::Engine& e) {
    if (held || e.scheduler().running().empty() || e.scheduler().running().front()->generated() < 2) return;
    held = true;
    eventually([&] {
      Watcher* w = watching.load();
      if (w == nullptr) return false;
      const std::vector<json> seen = w->events();
      return std::any_of(seen.begin(), seen.end(), [](const json& x) { return x["running"] == 1; });
    });
  };
  Server server(tiny_mha(), tiny_tokenizer(), {}, config);  // no EOS: runs to max_tokens
  const Listening live(server, front());
  // Enough once the engine has stepped and is idle again.
  Watcher watcher(live.port(), [](const json& e) {
    return e["step"] > 0 && e["running"] == 0 && e["waiting"] == 0 && e["blocks"]["used"] == 0;
  });
  watching = &watcher;
  struct Unwatch {
    std::atomic<Watcher*>& w;
    ~Unwatch() { w = nullptr; }
  } unwatch{watching};  // before the watcher goes
  ASSERT_TRUE(eventually([&] { return !watcher.events().empty(); })) << "no first snapshot for a new watcher";
  const json first = watcher.events().front();
  EXPECT_EQ(first["blocks"]["used"], 0);
  EXPECT_EQ(first["blocks"]["map"].get<std::string>().size(), first["blocks"]["total"].get<std::size_t>())
      << "the first snapshot draws every block";
  // 70 prompt tokens (two chunks of the 48-token step budget) and 440 more, one a step.
  const std::vector<std::int32_t> prompt(70, 5);
  const auto [status, r] =
      post("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 440}, {"temperature", 0}});
  ASSERT_EQ(status, 200) << r.dump();
  const std::int64_t id = std::stoll(r["id"].get<std::string>().substr(5));  // "cmpl-N"
  watcher.join();
  const std::vector<json> events = watcher.events();
  ASSERT_GE(events.size(), 2u);
  std::int64_t prefill = 0, decode = 0, steps = 0, seen_running = 0, with_map = 0;
  for (const json& e : events) {
    steps += e["since_last"]["steps"].get<std::int64_t>();
    prefill += e["since_last"]["prefill_tokens"].get<std::int64_t>();
    decode += e["since_last"]["decode_tokens"].get<std::int64_t>();
    // A map is the blocks as they are beside its counts. An event sent after the engine was held
    // longer than the watcher's wait has none (the page keeps the one it drew).
    if (e["blocks"].contains("map")) {
      ++with_map;
      const std::string map = e["blocks"]["map"];
      EXPECT_EQ(
          static_cast<std::int64_t>(std::count_if(map.begin(), map.end(), [](char c) { return c != '.' && c != 'c'; })),
          e["blocks"]["used"].get<std::int64_t>())
          << map;
    }
    for (const json& row : e["batch"]) {
      EXPECT_EQ(row["id"], id);
      EXPECT_EQ(row["sample"], 0);
      EXPECT_EQ(row["blocks"], (row["position"].get<std::int64_t>() + 15) / 16) << "the blocks its positions fill";
      EXPECT_EQ(row["phase"], row["position"] <= 70 ? "prefill" : "decode") << row;
    }
    if (e["running"] == 1 && e["batch"].size() == 1) {
      ++seen_running;
      EXPECT_EQ(e["blocks"]["used"], e["batch"][0]["blocks"]) << "a request alone holds every block used";
    }
  }
  EXPECT_GE(seen_running, 1) << "no event came while the request ran";
  EXPECT_EQ(prefill, 70) << "the prompt goes through the model once";
  EXPECT_EQ(decode, 439) << "then each generated token but the last";
  EXPECT_EQ(steps, 2 + 439) << "two prefill chunks, the second of which samples the first token, then a token a step";
  EXPECT_GE(with_map, 2) << "the first snapshot and the engine going idle draw the blocks";
  const json& last = events.back();
  ASSERT_TRUE(last["blocks"].contains("map")) << "the engine draws the blocks as it goes idle";
  EXPECT_EQ(last["blocks"]["used"], 0);
  EXPECT_FALSE(holds_a_block(last)) << last["blocks"]["map"];
  EXPECT_EQ(last["waiting"], 0);
  EXPECT_EQ(last["busy"], false);
  EXPECT_EQ(last["step"], steps);
}

// A watcher that reads nothing never holds the engine back: the steps it missed are merged into
// one update (their tokens summed), however many there were.
// A watcher that took nothing while the engine drew the blocks and then stepped on gets the
// newest counts without the older map: drawn beside them it would disagree with them.
TEST(EngineEvents, AMapTravelsOnlyWithTheSnapshotItWasDrawnFor) {
  Subscription sub(std::make_shared<std::atomic<std::int64_t>>(0));
  auto drawn = std::make_shared<Snapshot>(), later = std::make_shared<Snapshot>();
  drawn->blocks_used = 3, later->blocks_used = 5;
  drawn->map = std::make_shared<BlockMap>(BlockMap{"uuu.", 1, 0, 3, 0, 0});
  sub.offer(drawn);
  sub.offer(later);
  std::optional<Update> u = sub.take(std::chrono::milliseconds(0));
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->latest, later);
  EXPECT_EQ(u->merged, 1);
  EXPECT_EQ(u->map, nullptr) << "the map of 3 blocks would be sent beside a count of 5";
  EXPECT_FALSE(to_json(*u)["blocks"].contains("map"));
  sub.offer(drawn);
  u = sub.take(std::chrono::milliseconds(0));
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->map, drawn->map);
}

TEST(EngineEvents, AWatcherThatDoesNotReadGetsTheStepsMerged) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const std::shared_ptr<Subscription> sub = server.watch();
  ASSERT_TRUE(sub->take(std::chrono::seconds(10))) << "no first snapshot";
  ch11::Request r = server.make_request(std::vector<std::int32_t>(20, 7), "prompt", 60, 16, SamplingParams{}, 1, true);
  const std::shared_ptr<Channel> channel = server.submit(std::move(r), {});
  for (bool done = false; !done;)
    for (const Event& e : channel->pop(std::chrono::milliseconds(100))) done = done || !e.finish_reason.empty();
  std::int64_t steps = 0, prefill = 0, decode = 0, takes = 0;
  for (bool idle = false; !idle && takes < 10; ++takes) {
    const std::optional<Update> u = sub->take(std::chrono::seconds(5));
    ASSERT_TRUE(u) << "the engine's last step never came";
    steps += u->steps, prefill += u->prefill_tokens, decode += u->decode_tokens;
    idle = u->latest->running == 0 && u->latest->blocks_used == 0;
  }
  EXPECT_LE(takes, 2) << "60 steps came to a watcher that was not reading: they wait as one update";
  EXPECT_EQ(steps, 60);
  EXPECT_EQ(prefill, 20);
  EXPECT_EQ(decode, 59);
  EXPECT_EQ(server.watchers(), 1);
}

// A watcher that goes away (its connection closed) is dropped, and the server runs on.
TEST(EngineEvents, AWatcherThatDisconnectsIsDropped) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const Listening live(server, front());
  {
    Watcher watcher(live.port(), [](const json&) { return true; });  // one event, then it hangs up
    watcher.join();
    EXPECT_EQ(watcher.events().size(), 1u);
  }
  EXPECT_TRUE(eventually([&] { return server.watchers() == 0; }, 10)) << "the server still counts a watcher that left";
  const auto [status, r] = post("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 8}});
  EXPECT_EQ(status, 200) << r.dump();
}

// A burst of clients connecting at once is queued by the listening socket, not reset: the
// front widens cpp-httplib's backlog of 5 (http::Front::bind), and every one is answered.
TEST(Serving, ABurstOfConnectionsIsAnsweredNotReset) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const Listening live(server, front());
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i)
    clients.emplace_back([&] {
      httplib::Client cli("127.0.0.1", live.port());
      cli.set_connection_timeout(30, 0);
      if (const auto res = cli.Get("/health"); res && res->status == 200) ++answered;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(answered, 64);
}

namespace {

// A raw loopback connection: the client that sends a request and hangs up.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "cannot connect";
  return fd;
}

double metric(const std::string& text, const std::string& name) {
  const std::size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

}  // namespace

// A non-streamed request whose client went away used to run to max_tokens (15 still running and
// 105 blocks held after every client had gone): its closed socket is seen between the engine's
// events and the request is aborted.
TEST(Serving, ANonStreamedRequestWhoseClientLeftIsAborted) {
  ServerConfig config = small_config();
  config.after_step = [](const ch11::Engine&) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  Server server(tiny_mha(), tiny_tokenizer(), {}, config);  // no EOS: 440 tokens take 440 steps of 5 ms at least
  const Listening live(server, front());
  std::vector<int> clients;
  for (int i = 0; i < 4; ++i) {
    const int fd = connect_to(live.port());
    const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 440, "temperature": 0})";
    const std::string req =
        "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    clients.push_back(fd);
  }
  ASSERT_TRUE(eventually([&] { return server.gauges().running == 4; })) << "the requests never ran";
  for (int fd : clients) ::close(fd);
  ASSERT_TRUE(eventually([&] { return server.gauges().in_flight == 0; }, 1.5))
      << "still running after their clients left: " << server.gauges().in_flight;
  EXPECT_TRUE(eventually([&] { return server.gauges().blocks_used == 0; })) << server.gauges().blocks_used;
  const std::string m = server.metrics();
  EXPECT_EQ(metric(m, "inferlab_requests_finished_total{reason=\"abort\"}"), 4) << m;
  EXPECT_LT(metric(m, "inferlab_generation_tokens_total"), 4 * 440) << "they ran to max_tokens";
}

// The front's own refusals (a body too large, a bad Content-Length) count as rejected requests.
TEST(Serving, TheFrontsRefusalsAreCountedInTheMetrics) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  const Listening live(server, front());
  const int fd = connect_to(live.port());
  const std::string bad = "POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n";
  ::send(fd, bad.data(), bad.size(), MSG_NOSIGNAL);
  char buf[512];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  ASSERT_GT(n, 12);
  EXPECT_EQ(std::string(buf, 12), "HTTP/1.1 400");
  EXPECT_EQ(metric(server.metrics(), "inferlab_requests_rejected_total"), 1);
}

// Chat content that spells a special token is text by default (so a user cannot forge turns);
// the front end's flag reads it as the token.
TEST(Serving, ChatContentIsTextUnlessTheServerSaysOtherwise) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  FrontEnd safe = front(), special = front();
  for (FrontEnd* f : {&safe, &special}) f->chat_template = ChatTemplate::from_file(kData + "/chat_templates/chatml.jinja");
  special.specials_in_content = true;
  const Listening a(server, safe), b(server, special);
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi<|endoftext|>"}}}}, {"max_tokens", 1}};
  const auto [sa, ra] = post("127.0.0.1", a.port(), "/v1/chat/completions", body);
  const auto [sb, rb] = post("127.0.0.1", b.port(), "/v1/chat/completions", body);
  ASSERT_EQ(sa, 200) << ra.dump();
  ASSERT_EQ(sb, 200) << rb.dump();
  const std::int64_t as_text = ra["usage"]["prompt_tokens"], as_token = rb["usage"]["prompt_tokens"];
  EXPECT_GT(as_text, as_token) << "<|endoftext|> is several tokens of text, or one special token";
  const ChatTemplate t = ChatTemplate::from_file(kData + "/chat_templates/chatml.jinja");
  EXPECT_EQ(as_token,
            static_cast<std::int64_t>(tiny_tokenizer().encode(t.render({{"user", "Hi<|endoftext|>"}}, true), false).size()));
}

// A template past its budget, here one a downloaded GGUF carries, is a 400 naming it, and the
// server goes on.
TEST(Serving, AChatTemplatePastItsBudgetIsA400) {
  Server server(tiny_mha(), tiny_tokenizer(), {}, small_config());
  test::TempDir dir;
  const std::string path = dir.file("hostile.gguf");
  gguf::write(path,
              {{"general.architecture", gguf::Value::str("llama")},
               {"tokenizer.chat_template",
                gguf::Value::str("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}")}},
              {});
  FrontEnd f = front();
  f.chat_template = ChatTemplate::for_model(path);
  ASSERT_TRUE(f.chat_template.has_value());
  f.chat_template->set_budget({100000, 64 << 20});
  const Listening live(server, f);
  const auto [status, r] =
      post("127.0.0.1", live.port(), "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(status, 400) << r.dump();
  const std::string message = r["error"]["message"];
  EXPECT_NE(message.find("hostile.gguf (tokenizer.chat_template): line 1: the template "), std::string::npos) << message;
  EXPECT_NE(message.find("budget"), std::string::npos) << message;
  const auto [ok, r2] = post("127.0.0.1", live.port(), "/v1/completions", json{{"prompt", "Once"}, {"max_tokens", 2}});
  EXPECT_EQ(ok, 200) << r2.dump();
}
