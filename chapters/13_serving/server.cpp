#include "chapters/13_serving/server.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

#include "chapters/13_serving/openai.h"
#include "common/ceiling.h"
#include "common/error.h"
#include "common/metrics.h"

namespace inferlab::ch13 {

using Clock = std::chrono::steady_clock;

void Channel::push(Event e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::vector<Event> Channel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

namespace {

ch11::EngineConfig engine_config(const ServerConfig& c) {
  ch11::EngineConfig e;
  e.scheduler = c.scheduler;
  e.scheduler.policy = ch11::Policy::Continuous;
  e.clock = ch11::Clock::Measured;
  e.keep_steps = false;  // a server runs for days: no record of every step
  return e;
}

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A window's rings or a recurrent state: no prefix of cached blocks to share (hybrid_cache.h).
bool has_fixed_layers(const models::Model& m) {
  for (const models::LayerSpec& s : m.layers())
    if (!s.grows() && s.kind != models::LayerKind::Shared) return true;
  return false;
}

}  // namespace

Server::Server(const models::Llama& m, const Tokenizer& tok, std::vector<std::int64_t> eos, const ServerConfig& c)
    : Server(models::as_model(models::Llama(m)), nullptr, tok, std::move(eos), c) {}

Server::Server(const models::Model& m, const Tokenizer& tok, std::vector<std::int64_t> eos, const ServerConfig& c)
    : Server(nullptr, &m, tok, std::move(eos), c) {}

Server::Server(std::unique_ptr<models::Model> owned, const models::Model* m, const Tokenizer& tok,
               std::vector<std::int64_t> eos, const ServerConfig& c)
    : owned_(std::move(owned)),
      m_(m ? *m : *owned_),
      tok_(tok),
      eos_(std::move(eos)),
      c_(c),
      pool_(m_, c.kv_budget_bytes, c.block_size, c.prefix_caching && !has_fixed_layers(m_), c.scheduler.max_running),
      engine_(m_, watch_.pool(), engine_config(c)) {
  IL_CHECK(c.max_waiting >= 1, "server: the waiting queue must hold at least 1 request, got ", c.max_waiting);
  publish_gauges();
  thread_ = std::thread([this] { loop(); });
}

std::int64_t Server::context() const {
  return m_.context().value_or(std::numeric_limits<int>::max());  // max_new_tokens is an int
}

Server::~Server() {
  stopping_ = true;
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ch11::Request Server::make_request(std::vector<std::int32_t> prompt, const std::string& prompt_field,
                                   std::optional<std::int64_t> max_tokens, std::int64_t default_max_tokens,
                                   const SamplingParams& sampling, std::int64_t n, bool ignore_eos) const {
  const std::int64_t P = static_cast<std::int64_t>(prompt.size()), C = context();
  if (P == 0) throw ApiError(400, "the prompt is empty (it gave no tokens)", prompt_field);
  for (std::int32_t t : prompt)
    if (t < 0 || t >= m_.vocab_size())
      throw ApiError(
          400, "token id " + std::to_string(t) + " is outside the model's vocabulary of " + std::to_string(m_.vocab_size()),
          prompt_field);
  if (P >= C)
    throw ApiError(400,
                   "this model's maximum context length is " + std::to_string(C) + " tokens, and the prompt has " +
                       std::to_string(P) + ": no room for a single new token",
                   prompt_field);
  std::int64_t max_new = max_tokens.value_or(std::min(default_max_tokens, C - P));
  if (P + max_new > C)
    throw ApiError(400,
                   "this model's maximum context length is " + std::to_string(C) + " tokens; the prompt has " +
                       std::to_string(P) + " and max_tokens asks for " + std::to_string(max_new) + " more (" +
                       std::to_string(P + max_new) + ")",
                   "max_tokens");
  if (n > c_.scheduler.max_running)
    throw ApiError(400,
                   "n = " + std::to_string(n) + " parallel samples need as many running slots, and this server runs " +
                       std::to_string(c_.scheduler.max_running) + " sequences at most (--max-num-seqs)",
                   "n");
  if (pool_.bytes_for(P + max_new) > pool_.budget_bytes())
    throw ApiError(400,
                   "at its longest (" + std::to_string(P + max_new) + " positions) this request needs " +
                       metrics::human_bytes(static_cast<double>(pool_.bytes_for(P + max_new))) +
                       " of KV cache, more than the server's whole pool of " +
                       metrics::human_bytes(static_cast<double>(pool_.budget_bytes())) + " (--kv-budget)",
                   "max_tokens");
  ch11::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = static_cast<int>(max_new);
  r.sampling = sampling;
  r.sampling.vocab = std::min<std::int64_t>(tok_.vocab_size(), m_.vocab_size());
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  r.samples = static_cast<int>(n);
  if (!ignore_eos) r.stop_ids = eos_;
  r.id = next_id_++;
  return r;
}

std::shared_ptr<Subscription> Server::watch() {
  auto s = watch_.subscribe();
  { std::lock_guard lk(mu_); }  // the engine thread is waiting, or will see the new watcher before it does
  wake_.notify_all();
  return s;
}

std::shared_ptr<Channel> Server::submit(ch11::Request r, std::vector<std::string> stop) {
  auto channel = std::make_shared<Channel>();
  {
    std::lock_guard lk(mu_);
    if (draining_ || stopping_) {
      ++rejected_;
      throw ApiError(503, "the server is shutting down and takes no new requests", "", "server_error");
    }
    if (static_cast<std::int64_t>(inbox_.size()) + gauges_.waiting >= c_.max_waiting) {
      ++rejected_;
      throw ApiError(429,
                     "the server's queue is full (" + std::to_string(c_.max_waiting) +
                         " requests waiting, --max-waiting); retry later",
                     "", "rate_limit_exceeded");
    }
    ++accepted_, ++in_flight_;
    prompt_tokens_ += static_cast<std::int64_t>(r.prompt.size());
    inbox_.push_back({std::move(r), std::move(stop), channel, Clock::now()});
  }
  wake_.notify_all();
  return channel;
}

void Server::drain(double seconds) {
  draining_ = true;
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (in_flight_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (in_flight_ > 0) {  // out of time: what is left is aborted, and each of its clients told so
    abort_all_ = true;
    wake_.notify_all();
    while (in_flight_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// ---------------------------------------------------------------------------------------------
// The engine thread.
void Server::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      wake_.wait(lk, [&] { return !inbox_.empty() || stopping_ || engine_.busy() || watch_.wanted(); });
      if (stopping_) abort_all_ = true;
      if (stopping_ && inbox_.empty() && !engine_.busy()) break;
    }
    take_inbox();
    for (auto& [id, l] : live_)  // clients that went away, or everything when out of time
      if (abort_all_ || l.job.channel->cancelled()) engine_.abort(id);
    const bool stepping = engine_.busy();
    if (stepping) {
      watch_.begin_step();
      try {
        engine_.step();
      } catch (const std::exception& e) {
        fail_everything(e.what());
      }
    }
    std::vector<ch11::Sequence*> stopped;
    for (const auto& s : engine_.scheduler().running())
      if (deliver(*s, false)) stopped.push_back(s.get());
    for (const auto& s : engine_.scheduler().waiting())  // a fork holds the token it was forked with
      if (deliver(*s, false)) stopped.push_back(s.get());
    for (ch11::Sequence* s : stopped) engine_.finish_early(s);
    for (auto& s : engine_.take_finished()) finish(*s);
    publish_gauges();
    watch_.publish(engine_, stepping, [this] { return gauges().waiting; });
    if (stepping && c_.after_step) c_.after_step(engine_);
  }
  publish_gauges();
}

void Server::take_inbox() {
  std::vector<Job> jobs;
  {
    std::lock_guard lk(mu_);
    jobs.swap(inbox_);
  }
  for (Job& j : jobs) {
    const std::int64_t id = j.request.id;
    Live& l = live_[id];
    l.job = std::move(j);
    l.samples.resize(static_cast<std::size_t>(l.job.request.samples));
    for (Sample& s : l.samples) s.text = std::make_unique<OutputText>(tok_, l.job.request.prompt, l.job.stop);
    ch11::Request r = l.job.request;
    r.arrival = engine_.now();
    try {
      engine_.add(std::move(r));
    } catch (const std::exception& e) {  // make_request checked it; this would be a bug, told to the client
      for (std::int64_t i = 0; i < l.job.request.samples; ++i) end_sample(live_.at(id), i, "error", e.what());
    }
  }
}

bool Server::deliver(ch11::Sequence& s, bool last) {
  const auto it = live_.find(s.request.id);
  if (it == live_.end()) return false;
  Live& l = it->second;
  Sample& sample = l.samples.at(static_cast<std::size_t>(s.index));
  if (sample.done || (s.generated() <= sample.delivered && !last)) return false;
  const auto now = Clock::now();
  const std::int64_t fresh = s.generated() - sample.delivered;
  if (fresh > 0) {
    if (!l.first_token_seen) {
      l.first_token_seen = true;
      std::lock_guard lk(mu_);
      const double ttft = seconds_between(l.job.received, now);
      ttft_.observe(ttft);
      watch_.ttft(s.request.id, ttft);
    }
    if (sample.delivered == 0) sample.first_token = now;
    sample.delivered = s.generated();
    generated_tokens_ += fresh;
  }
  std::string text;
  try {
    text = sample.text->update(s.tokens, last);
  } catch (const std::exception& e) {  // the sample ends with the error, told to its client
    if (l.error.empty())
      std::fprintf(stderr, "ch13_serve: request %lld: %s\n", static_cast<long long>(s.request.id), e.what());
    l.error = e.what();
    return true;
  }
  if (!text.empty()) l.job.channel->push({s.index, std::move(text), s.generated(), "", ""});
  return sample.text->stopped();
}

void Server::finish(ch11::Sequence& s) {
  const auto it = live_.find(s.request.id);
  if (it == live_.end()) return;
  Live& l = it->second;
  deliver(s, true);
  const Sample& sample = l.samples.at(static_cast<std::size_t>(s.index));
  const auto& ids = s.request.stop_ids;
  const bool eos =
      s.generated() > 0 && std::find(ids.begin(), ids.end(), static_cast<std::int64_t>(s.tokens.back())) != ids.end();
  std::string reason = !l.error.empty()                            ? "error"
                       : sample.text->stopped() || eos             ? "stop"
                       : s.generated() >= s.request.max_new_tokens ? "length"
                                                                   : "abort";
  if (s.generated() >= 2) {
    std::lock_guard lk(mu_);
    const double tpot = seconds_between(sample.first_token, Clock::now()) / static_cast<double>(s.generated() - 1);
    tpot_.observe(tpot);
    watch_.tpot(s.request.id, s.index, tpot);
  }
  const bool never_forked = s.forks_ahead();  // it ended before its first token: its forks never began
  const std::int64_t id = s.request.id, n = s.request.samples;
  end_sample(l, s.index, reason, l.error);
  if (never_forked)
    for (std::int64_t i = 1; i < n && live_.count(id); ++i) end_sample(live_.at(id), i, reason, live_.at(id).error);
}

void Server::end_sample(Live& l, std::int64_t index, const std::string& reason, const std::string& error) {
  Sample& sample = l.samples.at(static_cast<std::size_t>(index));
  if (sample.done) return;
  sample.done = true;
  l.job.channel->push({index, "", sample.delivered, reason, error});
  if (++l.finished < static_cast<std::int64_t>(l.samples.size())) return;
  {
    std::lock_guard lk(mu_);
    finished_by_reason_[reason]++;
  }
  live_.erase(l.job.request.id);  // l is gone from here on
  --in_flight_;
}

void Server::fail_everything(const std::string& why) {
  for (auto& [id, l] : live_) l.error = "the engine failed: " + why;
  std::vector<std::int64_t> ids;
  for (const auto& [id, l] : live_) ids.push_back(id);
  for (std::int64_t id : ids) engine_.abort(id);
}

void Server::publish_gauges() {
  std::lock_guard lk(mu_);
  gauges_.running = static_cast<std::int64_t>(engine_.scheduler().running().size());
  gauges_.waiting = static_cast<std::int64_t>(engine_.scheduler().waiting().size());
  gauges_.blocks_used = pool_.blocks_used();
  gauges_.blocks_total = pool_.blocks_total();
  gauges_.prefix_hit_blocks = pool_.prefix_hits();
  gauges_.slots_used = pool_.slots_used();
  gauges_.slots_total = pool_.slots_total();
  gauges_.bytes_by_kind = pool_.used_by_kind();
  gauges_.in_flight = in_flight_;
}

Gauges Server::gauges() const {
  std::lock_guard lk(mu_);
  Gauges g = gauges_;
  g.waiting += static_cast<std::int64_t>(inbox_.size());
  g.in_flight = in_flight_;
  return g;
}

std::string Server::metrics() const {
  const Gauges g = gauges();
  std::ostringstream os;
  os << metric_text("inferlab_requests_accepted_total", "counter", "Requests queued.", static_cast<double>(accepted_))
     << metric_text("inferlab_requests_rejected_total", "counter",
                    "Requests refused before they were queued (bad request, queue full, shutting down).",
                    static_cast<double>(rejected_));
  {
    std::lock_guard lk(mu_);
    os << "# HELP inferlab_requests_finished_total Requests ended, by why (stop, length, abort, error).\n"
       << "# TYPE inferlab_requests_finished_total counter\n";
    for (const char* reason : {"stop", "length", "abort", "error"}) {
      const auto it = finished_by_reason_.find(reason);
      os << "inferlab_requests_finished_total{reason=\"" << reason << "\"} "
         << (it == finished_by_reason_.end() ? 0 : it->second) << "\n";
    }
    os << ttft_.text("inferlab_time_to_first_token_seconds", "From a request's arrival to its first token.")
       << tpot_.text("inferlab_time_per_output_token_seconds", "A sample's time per token after its first.");
  }
  os << metric_text("inferlab_prompt_tokens_total", "counter", "Prompt tokens of the requests queued.",
                    static_cast<double>(prompt_tokens_))
     << metric_text("inferlab_generation_tokens_total", "counter", "Tokens generated.",
                    static_cast<double>(generated_tokens_))
     << metric_text("inferlab_num_requests_running", "gauge", "Sequences in the running batch.",
                    static_cast<double>(g.running))
     << metric_text("inferlab_num_requests_waiting", "gauge", "Sequences and requests queued behind the batch.",
                    static_cast<double>(g.waiting))
     << metric_text("inferlab_kv_blocks_used", "gauge", "KV cache blocks held by sequences or the prefix cache's users.",
                    static_cast<double>(g.blocks_used))
     << metric_text("inferlab_kv_blocks_total", "gauge", "KV cache blocks in the pool.", static_cast<double>(g.blocks_total))
     << metric_text("inferlab_prefix_cache_hit_blocks_total", "counter",
                    "Blocks a new sequence found already computed in the prefix cache.",
                    static_cast<double>(g.prefix_hit_blocks))
     << metric_text("inferlab_kv_slots_used", "gauge",
                    "Fixed per-sequence slots (a window's rings, a recurrent state) held by sequences.",
                    static_cast<double>(g.slots_used))
     << metric_text("inferlab_kv_slots_total", "gauge", "Fixed per-sequence slots set aside in the pool.",
                    static_cast<double>(g.slots_total));
  // The bytes each kind of layer holds (common/models/model.h's LayerKind): one family, a label each.
  os << "# HELP inferlab_kv_bytes_used KV cache bytes held, by the kind of layer that keeps them.\n"
     << "# TYPE inferlab_kv_bytes_used gauge\n";
  for (std::size_t k = 0; k < g.bytes_by_kind.size(); ++k)
    os << "inferlab_kv_bytes_used{kind=\"" << models::layer_kind_name(static_cast<models::LayerKind>(k)) << "\"} "
       << g.bytes_by_kind[k] << "\n";
  return os.str();
}

}  // namespace inferlab::ch13
