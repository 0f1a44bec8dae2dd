#include "chapters/13_serving/engine_events.h"

#include <algorithm>

namespace inferlab::ch13 {

using nlohmann::json;

namespace {

constexpr std::size_t kLatenciesKept = 256;  // per mailbox, between two takes: the newest
constexpr std::size_t kQueueShown = 32;      // waiting sequences named in a snapshot

void append_newest(std::vector<Latency>& to, const std::vector<Latency>& from) {
  to.insert(to.end(), from.begin(), from.end());
  if (to.size() > kLatenciesKept) to.erase(to.begin(), to.end() - static_cast<std::ptrdiff_t>(kLatenciesKept));
}

json latencies_ms(const std::vector<Latency>& v) {
  json out = json::array();
  for (const Latency& l : v) out.push_back({{"id", l.id}, {"sample", l.sample}, {"ms", l.seconds * 1e3}});
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
std::optional<Update> Subscription::take(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  wants_map_ = true;
  cv_.wait_for(lk, timeout, [&] { return pending_ && pending_->latest->map; });
  std::optional<Update> out;
  out.swap(pending_);
  return out;
}

void Subscription::offer(const std::shared_ptr<const Snapshot>& s) {
  {
    std::lock_guard lk(mu_);
    if (!pending_) {
      pending_.emplace();
    } else {
      ++pending_->merged;
    }
    Update& u = *pending_;
    u.latest = s;
    u.map = s->map;  // a map drawn for an older snapshot would disagree with the counts beside it
    if (s->map) wants_map_ = false;
    if (s->stepped) {
      ++u.steps;
      u.busy_seconds += s->step_seconds;
      for (const StepRow& r : s->batch) (r.prefill ? u.prefill_tokens : u.decode_tokens) += r.tokens;
    }
    append_newest(u.ttft, s->ttft);
    append_newest(u.tpot, s->tpot);
  }
  cv_.notify_one();
}

// ---------------------------------------------------------------------------------------------
void PlanRecorder::begin(bool on) {
  rows_.clear();
  if (on && !on_) cow_.assign(static_cast<std::size_t>(pool_.blocks_total()), false);  // marks from before are stale
  on_ = on;
}

bool PlanRecorder::reserve(ch11::Sequence& s, std::int64_t n) {
  if (!on_) return pool_.reserve(s, n);
  if (!pool_.has_blocks()) {  // a model of fixed slots only (Mamba): nothing to draw but the step
    if (!pool_.reserve(s, n)) return false;
    n = std::min(n, s.pending());
    const bool prefill = !(s.pending() == 1 && s.generated() > 0);
    rows_.push_back({s.request.id, s.index, n, prefill, prefill && s.generated() > 0, 0, s.computed() + n, 0});
    return true;
  }
  const ch12::BlockPool& blocks = pool_.blocks();
  const std::int64_t hits = blocks.hits, copies = blocks.copies;
  const std::size_t had = s.cache ? ch12::PagedPool::blocks_of(s.cache.get())->block_table().size() : 0;
  if (!pool_.reserve(s, n)) return false;
  const auto& table = ch12::PagedPool::blocks_of(s.cache.get())->block_table();
  const std::int64_t adopted = blocks.hits - hits;  // blocks found in the prefix cache as it opened
  n = std::min(n, s.pending());                     // what the scheduler plans, as the engine runs it
  // Blocks this reservation allocated are fresh; the one the next position goes into was copied
  // when copy-on-write applied.
  for (std::size_t i = std::max(had, static_cast<std::size_t>(adopted)); i < table.size(); ++i)
    cow_[static_cast<std::size_t>(table[i])] = false;
  if (blocks.copies > copies)
    cow_[static_cast<std::size_t>(table[static_cast<std::size_t>(s.computed() / blocks.block_size())])] = true;
  const bool prefill = !(s.pending() == 1 && s.generated() > 0);
  rows_.push_back({s.request.id, s.index, n, prefill, prefill && s.generated() > 0, adopted * blocks.block_size(),
                   s.computed() + n, static_cast<std::int64_t>(table.size())});
  return true;
}

// ---------------------------------------------------------------------------------------------
EngineWatch::EngineWatch(ch12::PagedPool& pool) : blocks_(pool), recorder_(pool) {}

std::shared_ptr<Subscription> EngineWatch::subscribe() {
  auto s = std::make_shared<Subscription>(count_);
  {
    std::lock_guard lk(mu_);
    subs_.push_back(s);
  }
  wanted_ = true;
  return s;
}

void EngineWatch::ttft(std::int64_t id, double seconds) {
  if (*count_ > 0) ttft_.push_back({id, 0, seconds});
}

void EngineWatch::tpot(std::int64_t id, std::int64_t sample, double seconds) {
  if (*count_ > 0) tpot_.push_back({id, sample, seconds});
}

std::shared_ptr<const BlockMap> EngineWatch::draw() const {
  auto m = std::make_shared<BlockMap>();
  if (!blocks_.has_blocks()) return m;  // slots only: no block to draw
  const ch12::BlockPool& b = blocks_.blocks();
  m->cells.resize(static_cast<std::size_t>(b.total()));
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(b.total()); ++i) {
    const int refs = b.refs(i);
    const bool hashed = b.hashed(i);
    char c = '.';
    if (refs == 0) {
      c = hashed ? 'c' : '.';
      ++(hashed ? m->cached : m->free);
    } else if (refs > 1) {
      c = 's', ++m->shared;
    } else if (recorder_.copied(i)) {
      c = 'w', ++m->copies;
    } else {
      c = hashed ? 'p' : 'u', ++m->one;
    }
    m->cells[static_cast<std::size_t>(i)] = c;
  }
  return m;
}

void EngineWatch::publish(const ch11::Engine& e, bool stepped, const std::function<std::int64_t()>& waiting) {
  if (stepped) ++steps_;
  if (*count_ == 0) {
    ttft_.clear(), tpot_.clear();
    return;
  }
  auto s = std::make_shared<Snapshot>();
  const auto now = std::chrono::steady_clock::now();
  s->step = steps_;
  s->stepped = stepped;
  s->busy = e.busy();
  s->step_seconds = stepped && !e.steps().empty() ? e.steps().back().seconds : 0;
  s->time = std::chrono::duration<double>(now - started_).count();
  s->batch = recorder_.rows();  // the last step's (empty when nobody watched it)
  s->running = static_cast<std::int64_t>(e.scheduler().running().size());
  s->waiting = waiting();
  for (const auto& q : e.scheduler().waiting()) {
    if (s->queue.size() == kQueueShown) break;
    s->queue.push_back({q->request.id, q->index, static_cast<std::int64_t>(q->tokens.size()), q->preemptions > 0});
  }
  if (blocks_.has_blocks()) {
    const ch12::BlockPool& b = blocks_.blocks();
    s->blocks_used = b.used(), s->blocks_total = b.total(), s->block_size = b.block_size();
    s->prefix_hits = b.hits, s->cow_copies = b.copies, s->evictions = b.evictions;
  }
  s->slots_used = blocks_.slots_used(), s->slots_total = blocks_.slots_total();
  s->bytes_by_kind = blocks_.used_by_kind();
  s->preemptions = e.scheduler().preemptions();
  s->ttft.swap(ttft_);
  s->tpot.swap(tpot_);

  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<Subscription>> subs;
  std::erase_if(subs_, [&](const std::weak_ptr<Subscription>& w) {
    if (auto sub = w.lock()) subs.push_back(std::move(sub));
    return w.expired();  // a watcher that went away
  });
  // The map walks every block: drawn only for a watcher about to take an update, for a new one,
  // and as the engine goes idle (so that the last state every watcher sees is exact).
  bool draw_now = wanted_.exchange(false) || !e.busy();
  for (const auto& sub : subs) draw_now = draw_now || sub->wants_map();
  if (draw_now) s->map = draw();
  for (const auto& sub : subs) sub->offer(s);
}

// ---------------------------------------------------------------------------------------------
json to_json(const Update& u) {
  const Snapshot& s = *u.latest;
  json batch = json::array();
  for (const StepRow& r : s.batch)
    batch.push_back({{"id", r.id},
                     {"sample", r.sample},
                     {"tokens", r.tokens},
                     {"phase", r.recompute ? "recompute"
                               : r.prefill ? "prefill"
                                           : "decode"},
                     {"cached", r.cached},
                     {"position", r.position},
                     {"blocks", r.blocks}});
  json queue = json::array();
  for (const WaitingRow& w : s.queue)
    queue.push_back({{"id", w.id}, {"sample", w.sample}, {"tokens", w.tokens}, {"preempted", w.preempted}});
  json blocks = {{"used", s.blocks_used}, {"total", s.blocks_total}, {"size", s.block_size}};
  json by_kind = json::object();
  for (std::size_t k = 0; k < s.bytes_by_kind.size(); ++k)
    by_kind[models::layer_kind_name(static_cast<models::LayerKind>(k))] = s.bytes_by_kind[k];
  if (u.map)
    blocks.update({{"map", u.map->cells},
                   {"free", u.map->free},
                   {"cached", u.map->cached},
                   {"one", u.map->one},
                   {"shared", u.map->shared},
                   {"copies", u.map->copies}});
  return {{"step", s.step},
          {"time", s.time},
          {"busy", s.busy},
          {"step_ms", s.step_seconds * 1e3},
          {"batch", batch},
          {"running", s.running},
          {"waiting", s.waiting},
          {"queue", queue},
          {"blocks", blocks},
          {"slots", {{"used", s.slots_used}, {"total", s.slots_total}}},
          {"bytes_by_kind", by_kind},
          {"prefix_hits", s.prefix_hits},
          {"cow_copies", s.cow_copies},
          {"evictions", s.evictions},
          {"preemptions", s.preemptions},
          {"since_last",
           {{"steps", u.steps},
            {"prefill_tokens", u.prefill_tokens},
            {"decode_tokens", u.decode_tokens},
            {"busy_ms", u.busy_seconds * 1e3},
            {"merged", u.merged}}},
          {"ttft", latencies_ms(u.ttft)},
          {"tpot", latencies_ms(u.tpot)}};
}

}  // namespace inferlab::ch13
