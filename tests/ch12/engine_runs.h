#pragma once
// Chapter 11's engine serving a few requests of real text, for the tests that compare two ways of
// running it (paged and contiguous caches, batched and cache-by-cache attention, CPU and GPU).
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/11_continuous_batching/engine.h"
#include "common/eval.h"

namespace inferlab::test {

/// Ten requests of 3 to 39 prompt tokens and 10 to 49 new ones, arriving over seven steps (so that
/// prefill chunks share steps with decode rows), the odd ones sampled at temperature 0.8 with
/// their own seeds; every sampled token's logits kept.
inline std::vector<ch11::Request> mixed_requests(const std::string& data) {
  const auto text = eval::validation_tokens(data, 4000);
  std::vector<ch11::Request> out;
  for (int i = 0; i < 10; ++i) {
    ch11::Request r;
    r.id = i;
    const std::size_t p = 3 + static_cast<std::size_t>((i * 11) % 37), at = static_cast<std::size_t>(i) * 307;
    r.prompt.assign(text.begin() + static_cast<long>(at), text.begin() + static_cast<long>(at + p));
    r.max_new_tokens = 10 + (i * 17) % 40;
    if (i % 2) r.sampling.temperature = 0.8f, r.sampling.seed = 3 + static_cast<std::uint64_t>(i);
    r.sampling.vocab = 988;
    r.arrival = static_cast<double>((i * 3) % 7);
    r.keep_logits = true;
    out.push_back(std::move(r));
  }
  return out;
}

/// What a request got: its tokens and the logits of each sampled one.
struct Served {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

/// The requests through m on pool, continuous batching (6 sequences, 24 tokens a step, the clock
/// in steps), attending by `path`; indexed by request id. `preemptions`: where to put how many
/// there were.
inline std::vector<Served> serve(const models::Llama& m, ch11::KVPool& pool, const std::vector<ch11::Request>& requests,
                                 models::AttendPath path = models::AttendPath::Batched,
                                 std::int64_t* preemptions = nullptr) {
  ch11::EngineConfig c;
  c.scheduler = {ch11::Policy::Continuous, 6, 24};
  c.clock = ch11::Clock::Steps;
  c.attend_path = path;
  ch11::Engine e(m, pool, c);
  for (const auto& r : requests) e.add(r);
  e.run();
  if (preemptions) *preemptions = e.scheduler().preemptions();
  std::vector<Served> out(requests.size());
  for (const auto& s : e.finished()) out[static_cast<std::size_t>(s->request.id)] = {s->tokens, s->logits};
  return out;
}

}  // namespace inferlab::test
