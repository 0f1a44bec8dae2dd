#include "chapters/11_continuous_batching/engine.h"

#include <algorithm>
#include <sstream>

#include "chapters/01_naive_decode/generate.h"
#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/decode_bench.h"
#include "common/metrics.h"

namespace inferlab::ch11 {

Sequence::Sequence(Request r) : request(std::move(r)), tokens(request.prompt), sampler(request.sampling) {}

// ---------------------------------------------------------------------------------------------
// A contiguous cache that grows by reallocation.
GrowingKVCache::GrowingKVCache(const TransformerConfig& c, Device device) : config_(c), device_(device) {}

void GrowingKVCache::grow(std::int64_t capacity) {
  if (capacity <= this->capacity()) return;
  auto bigger = std::make_unique<models::ContiguousKVCache>(config_, capacity, device_);
  const std::int64_t n = length();
  if (n > 0) {
    for (std::int64_t l = 0; l < rows_->layers(); ++l) {
      bigger->k(l).slice(0, 0, n).copy_from(rows_->k(l).slice(0, 0, n));
      bigger->v(l).slice(0, 0, n).copy_from(rows_->v(l).slice(0, 0, n));
    }
    bigger->commit(n);
  }
  rows_ = std::move(bigger);
}

void GrowingKVCache::commit(std::int64_t T) {
  IL_CHECK(rows_ || T == 0, "growing KV cache: ", T, " positions committed before any room was made");
  if (rows_) rows_->commit(T);
}

void GrowingKVCache::truncate(std::int64_t n) {
  IL_CHECK(rows_ || n == 0, "growing KV cache: truncate to ", n, " of an empty cache");
  if (rows_) rows_->truncate(n);
}

void GrowingKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(rows_ != nullptr, "growing KV cache: attend before any room was made");
  rows_->attend(layer, q, k, v, out);
}

bool GrowingKVCache::locate(std::int64_t T, CachedSeq& where) {
  IL_CHECK(rows_ != nullptr, "growing KV cache: attend before any room was made");
  return rows_->locate(T, where);
}

// ---------------------------------------------------------------------------------------------
// The pool: a budget of bytes over contiguous caches.
ContiguousPool::ContiguousPool(const TransformerConfig& c, std::int64_t budget_bytes, Allocation a, Device device,
                               std::int64_t chunk)
    : config_(c), budget_(budget_bytes), chunk_(chunk), allocation_(a), device_(device) {
  IL_CHECK(budget_bytes > 0, "KV pool: the budget must be positive, got ", budget_bytes, " bytes");
  IL_CHECK(chunk >= 1, "KV pool: the growth chunk must be at least 1 position, got ", chunk);
}

ContiguousPool::ContiguousPool(const models::Model& m, std::int64_t budget_bytes, Allocation a, std::int64_t chunk)
    : ContiguousPool(m.llama() ? m.llama()->config : TransformerConfig{}, budget_bytes, a, m.device(), chunk) {
  if (!m.llama()) model_ = &m;
}

std::int64_t ContiguousPool::bytes_for(std::int64_t tokens) const {
  if (model_) return model_->cache_bytes(tokens);
  return config_.kv_cache_bytes(tokens, static_cast<std::int64_t>(dtype_size(DType::F32)));
}

bool ContiguousPool::reserve(Sequence& s, std::int64_t n) {
  if (model_) {  // made at its longest, once
    if (s.cache) return s.computed() + n <= s.max_tokens();
    const std::int64_t extra = bytes_for(s.max_tokens());
    if (used_ + extra > budget_) return false;
    s.cache = model_->make_cache(s.max_tokens());
    used_ += extra;
    return true;
  }
  auto* cache = static_cast<GrowingKVCache*>(s.cache.get());
  const std::int64_t have = cache ? cache->capacity() : 0, need = s.computed() + n;
  if (need <= have) return true;
  const std::int64_t want = allocation_ == Allocation::MaxLength
                                ? std::max(s.max_tokens(), need)
                                : std::min(std::max(s.max_tokens(), need), (need + chunk_ - 1) / chunk_ * chunk_);
  const std::int64_t extra = bytes_for(want) - bytes_for(have);
  if (used_ + extra > budget_) return false;
  if (!cache)
    s.cache = std::make_unique<GrowingKVCache>(config_, device_), cache = static_cast<GrowingKVCache*>(s.cache.get());
  cache->grow(want);
  used_ += extra;
  return true;
}

void ContiguousPool::free(Sequence& s) {
  if (!s.cache) return;
  used_ -= model_ ? bytes_for(s.max_tokens()) : bytes_for(static_cast<GrowingKVCache*>(s.cache.get())->capacity());
  s.cache.reset();
}

std::string ContiguousPool::describe() const {
  std::ostringstream os;
  os << "contiguous caches, "
     << (allocation_ == Allocation::MaxLength || model_ ? "max-length allocation" : "on-demand allocation");
  if (allocation_ == Allocation::OnDemand && !model_) os << " in chunks of " << chunk_ << " positions";
  os << ", a budget of " << metrics::human_bytes(static_cast<double>(budget_));
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// The engine.
Engine::Engine(const models::Model& m, KVPool& pool, const EngineConfig& c)
    : m_(m), pool_(pool), c_(c), scheduler_(c.scheduler, pool) {}

namespace {
// A Model over a Llama held by reference: the Llama constructor's callers keep their model.
class LlamaRef final : public models::Model {
 public:
  explicit LlamaRef(const models::Llama& m) : m_(m), layers_(models::attention_layers(m.config)) {}
  const std::string& architecture() const override { return m_.config.architecture; }
  const std::string& source() const override { return m_.source; }
  std::int64_t vocab_size() const override { return m_.config.vocab_size; }
  std::optional<std::int64_t> context() const override { return m_.config.max_position_embeddings; }
  Device device() const override { return m_.device(); }
  std::vector<std::int64_t> eos_ids() const override { return m_.config.eos_token_ids; }
  std::optional<std::int64_t> bos_id() const override { return m_.config.bos_token_id; }
  const std::vector<models::LayerSpec>& layers() const override { return layers_; }
  Tensor forward(std::vector<models::SequenceStep>& seqs, models::AttendPath path) const override {
    return models::forward(m_, seqs, models::attention_block, path);
  }
  std::unique_ptr<models::Cache> make_cache(std::int64_t capacity) const override {
    return std::make_unique<models::ContiguousKVCache>(m_.config, capacity, m_.device());
  }
  std::int64_t step_weight_bytes() const override { return m_.step_weight_bytes(); }
  const models::Llama* llama() const override { return &m_; }

 private:
  const models::Llama& m_;
  std::vector<models::LayerSpec> layers_;
};
}  // namespace

Engine::Engine(const models::Llama& m, KVPool& pool, const EngineConfig& c)
    : owned_(std::make_unique<LlamaRef>(m)), m_(*owned_), pool_(pool), c_(c), scheduler_(c.scheduler, pool) {}

void Engine::add(Request r) {
  const std::int64_t id = r.id;
  IL_CHECK(!r.prompt.empty(), "request ", id, ": the prompt is empty");
  IL_CHECK(r.max_new_tokens >= 1, "request ", id, ": max_new_tokens must be at least 1, got ", r.max_new_tokens);
  IL_CHECK(r.arrival >= clock_, "request ", id, " arrives at ", r.arrival, ", before the engine's clock (", clock_, ")");
  IL_CHECK(std::find(ids_.begin(), ids_.end(), id) == ids_.end(), "request ", id, ": the id is already taken");
  for (std::int32_t t : r.prompt)
    IL_CHECK(t >= 0 && t < m_.vocab_size(), "request ", id, ": token ", t, " is outside the model's vocabulary of ",
             m_.vocab_size());
  const std::int64_t longest = static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens;
  IL_CHECK(!m_.context() || longest <= *m_.context(), "request ", id, ": a prompt of ", r.prompt.size(),
           " tokens and up to ", r.max_new_tokens, " new ones need ", longest, " positions, beyond the model's context of ",
           m_.context().value_or(0));
  IL_CHECK(pool_.bytes_for(longest) <= pool_.budget_bytes(), "request ", id, ": at its longest (", longest,
           " positions) it needs ", metrics::human_bytes(static_cast<double>(pool_.bytes_for(longest))),
           " of KV cache, more than the pool's whole budget of ",
           metrics::human_bytes(static_cast<double>(pool_.budget_bytes())));
  IL_CHECK(r.samples >= 1 && r.samples <= c_.scheduler.max_running, "request ", id, ": ", r.samples,
           " parallel samples need as many running slots, and the cap on running sequences is ", c_.scheduler.max_running);
  validate(r.sampling);
  IL_CHECK(r.sampling.vocab <= m_.vocab_size(), "request ", id, ": it samples from ", r.sampling.vocab,
           " ids, more than the model's vocabulary of ", m_.vocab_size());
  ids_.push_back(id);
  // incoming_ is kept with the latest arrival first, so the next one is at the back; equal
  // arrivals keep the order they were added in.
  const auto at = std::upper_bound(incoming_.begin(), incoming_.end(), r.arrival,
                                   [](double a, const Request& x) { return a >= x.arrival; });
  incoming_.insert(at, std::move(r));
}

void Engine::arrive() {
  while (!incoming_.empty() && incoming_.back().arrival <= clock_) {
    scheduler_.add(std::make_unique<Sequence>(std::move(incoming_.back())));
    incoming_.pop_back();
  }
}

bool Engine::stops(const Sequence& s) const {
  if (s.generated() >= s.request.max_new_tokens) return true;
  const auto& ids = s.request.stop_ids;
  return std::find(ids.begin(), ids.end(), static_cast<std::int64_t>(s.tokens.back())) != ids.end();
}

void Engine::sample(Sequence& s, const float* logits) {
  const std::int64_t V = m_.vocab_size();
  if (s.request.keep_logits) s.logits.emplace_back(logits, logits + V);
  s.tokens.push_back(s.sampler.sample(logits, V));
}

std::vector<Sequence*> Engine::fork(Sequence& s, const float* logits) {
  std::vector<Sequence*> forks;
  for (int i = 1; i < s.request.samples; ++i) {
    auto f = std::make_unique<Sequence>(s.request);
    f->index = i;
    f->sampler = Sampler([&] {
      SamplingParams p = s.request.sampling;
      p.seed += static_cast<std::uint64_t>(i);
      return p;
    }());
    f->cache = pool_.fork(s);  // null: the fork computes the prompt again
    sample(*f, logits);
    forks.push_back(f.get());
    scheduler_.add_fork(std::move(f));
  }
  return forks;
}

bool Engine::finish_early(const Sequence* s) {
  std::unique_ptr<Sequence> gone = scheduler_.remove(s);
  if (!gone) return false;
  gone->finish_time = clock_;
  finished_.push_back(std::move(gone));
  return true;
}

std::int64_t Engine::abort(std::int64_t id) {
  std::int64_t n = 0;
  for (auto it = incoming_.begin(); it != incoming_.end();)
    if (it->id == id) {
      auto s = std::make_unique<Sequence>(std::move(*it));
      s->finish_time = clock_;
      finished_.push_back(std::move(s));
      it = incoming_.erase(it), ++n;
    } else {
      ++it;
    }
  std::vector<const Sequence*> mine;
  for (const auto& s : scheduler_.waiting())
    if (s->request.id == id) mine.push_back(s.get());
  for (const auto& s : scheduler_.running())
    if (s->request.id == id) mine.push_back(s.get());
  for (const Sequence* s : mine) n += finish_early(s);
  return n;
}

std::vector<std::unique_ptr<Sequence>> Engine::take_finished() {
  std::vector<std::unique_ptr<Sequence>> out = std::move(finished_);
  finished_.clear();
  for (const auto& s : out) std::erase(ids_, s->request.id);
  return out;
}

bool Engine::step() {
  arrive();
  if (scheduler_.waiting().empty() && scheduler_.running().empty()) {
    if (incoming_.empty()) return false;
    clock_ = std::max(clock_, incoming_.back().arrival);  // idle: nothing to run until the next arrival
    arrive();
  }
  metrics::Timer timer = metrics::Timer::work(m_.device() == Device::CPU);  // the engine's clock advances by it
  StepRecord rec;
  rec.start = clock_;
  const std::vector<Scheduled> plan = scheduler_.schedule();
  IL_CHECK(!plan.empty(), "engine: the scheduler planned nothing with ", scheduler_.waiting().size(),
           " requests waiting and ", scheduler_.running().size(), " running");

  // Selective batching: chapter 02's forward pass over every planned sequence's next tokens.
  std::vector<models::SequenceStep> batch;
  std::vector<std::int64_t> lengths;
  for (const Scheduled& p : plan) {
    Sequence& s = *p.seq;
    const auto from = s.tokens.begin() + s.computed();
    batch.push_back({std::vector<std::int32_t>(from, from + p.tokens), s.cache.get(), false});
    lengths.push_back(s.computed() + p.tokens - 1);
    rec.kv_positions += s.computed() + p.tokens;
    (s.pending() == 1 && s.generated() > 0 ? rec.decode_tokens : rec.prefill_tokens) += p.tokens;
  }
  rec.sequences = static_cast<std::int64_t>(plan.size());
  rec.kv_bytes = pool_.used_bytes();
  rec.bytes_read = m_.step_bytes(lengths);
  Tensor logits;
  {
    metrics::CountScope work;
    const cuda::Launches before = cuda::launches();
    logits = m_.forward(batch, c_.attend_path).to(Device::CPU);  // a row per sequence
    const cuda::Launches after = cuda::launches();
    rec.flops = work.work().flops;
    rec.launches = after.kernels - before.kernels, rec.copies = after.copies - before.copies;
  }

  // A sequence whose pending tokens are all through samples its next token.
  std::vector<Sequence*> sampled;
  const float* rows = logits.data<float>();
  for (std::size_t b = 0; b < plan.size(); ++b) {
    Sequence& s = *plan[b].seq;
    if (s.pending() > 0) continue;  // a prefill chunk that is not the last
    const float* row = rows + static_cast<std::int64_t>(b) * m_.vocab_size();
    const bool forks = s.forks_ahead();
    sample(s, row);
    sampled.push_back(&s);
    if (forks)
      for (Sequence* f : fork(s, row)) sampled.push_back(f);
  }
  rec.sampled = static_cast<std::int64_t>(sampled.size());
  rec.waiting = static_cast<std::int64_t>(scheduler_.waiting().size());
  rec.seconds = timer.seconds();
  clock_ += c_.clock == Clock::Measured ? rec.seconds : 1.0;
  rec.end = clock_;
  for (Sequence* s : sampled) {  // a token exists when its step ends
    s->token_times.push_back(clock_);
    if (s->first_token_time < 0) s->first_token_time = clock_;
    if (stops(*s)) finish_early(s);
  }
  if (!c_.keep_steps) steps_.clear();
  steps_.push_back(rec);
  return true;
}

void Engine::run() {
  while (step()) {
  }
}

// ---------------------------------------------------------------------------------------------
// The request alone: chapter 02's generate loop, with the request's sampler and stop ids.
Sequence run_alone(const models::Model& m, const Request& r) {
  Sequence s(r);
  if (m.context()) models::check_context(*m.context(), r.prompt.size(), r.max_new_tokens);
  const std::unique_ptr<models::Cache> cache = m.make_cache(s.max_tokens());
  std::vector<std::int32_t> feed = r.prompt;
  for (int i = 0; i < r.max_new_tokens; ++i) {
    std::vector<models::SequenceStep> one{{feed, cache.get(), false}};
    const Tensor logits = m.forward(one).to(Device::CPU);
    if (r.keep_logits) s.logits.push_back(logits.to_float_vector());
    s.tokens.push_back(s.sampler.sample(logits));
    feed = {s.tokens.back()};
    const auto& ids = r.stop_ids;
    if (std::find(ids.begin(), ids.end(), static_cast<std::int64_t>(s.tokens.back())) != ids.end()) break;
  }
  return s;
}

Sequence run_alone(const models::Llama& m, const Request& r) { return run_alone(LlamaRef(m), r); }

}  // namespace inferlab::ch11
