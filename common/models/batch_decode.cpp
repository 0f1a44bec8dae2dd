#include "common/models/batch_decode.h"

#include <memory>

namespace inferlab::models {

Tensor decode_step(const models::Llama& m, const std::vector<models::KVCache*>& caches,
                   const std::vector<std::int32_t>& tokens) {
  IL_CHECK(!tokens.empty() && caches.size() == tokens.size(), "decode_step: ", tokens.size(), " tokens for ", caches.size(),
           " caches");
  std::vector<models::SequenceStep> batch;
  for (std::size_t b = 0; b < tokens.size(); ++b) batch.push_back({{tokens[b]}, caches[b]});
  return forward(m, batch);
}

void fill_cache(models::ContiguousKVCache& cache, std::int64_t length, std::uint64_t seed) {
  IL_CHECK(cache.length() == 0 && length <= cache.capacity(), "fill_cache: ", length,
           " positions do not fit an empty cache of capacity ", cache.capacity());
  for (std::int64_t l = 0; l < cache.layers(); ++l) {
    Tensor k = cache.k(l).slice(0, 0, length), v = cache.v(l).slice(0, 0, length);
    fill_random(k, seed++);
    fill_random(v, seed++);
  }
  cache.commit(length);
}

ThroughputPoint measure_decode(const models::Llama& m, std::int64_t batch, std::int64_t context, int steps) {
  std::vector<std::unique_ptr<models::ContiguousKVCache>> caches;
  std::vector<models::KVCache*> views;
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(std::make_unique<models::ContiguousKVCache>(m.config, context + steps + 1, m.device()));
    fill_cache(*caches.back(), context, static_cast<std::uint64_t>(b) * 1000 + 1);
    views.push_back(caches.back().get());
  }
  const std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch), 3);
  const std::vector<std::int64_t> lengths(static_cast<std::size_t>(batch), context);
  return time_decode(batch, decode_step_bytes(static_cast<double>(m.step_weight_bytes()), m.config, lengths), steps,
                     m.device(), [&] { decode_step(m, views, tokens); });
}

}  // namespace inferlab::models
