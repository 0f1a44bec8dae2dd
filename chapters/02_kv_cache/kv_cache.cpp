#include "chapters/02_kv_cache/kv_cache.h"

#include <algorithm>
#include <sstream>

#include "common/cuda/backend.h"

namespace inferlab::ch02 {

KVCache KVCache::allocate(const TransformerConfig& c, std::int64_t capacity, Device device, DType dtype) {
  IL_CHECK(capacity > 0, "KV cache: capacity must be positive, got ", capacity);
  KVCache cache;
  cache.capacity = capacity;
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    cache.k.push_back(Tensor::zeros({capacity, c.num_kv_heads, c.head_dim}, dtype, device));
    cache.v.push_back(Tensor::zeros({capacity, c.num_kv_heads, c.head_dim}, dtype, device));
  }
  return cache;
}

std::int64_t KVCache::bytes() const {
  std::int64_t n = 0;
  for (std::size_t l = 0; l < k.size(); ++l) n += static_cast<std::int64_t>(k[l].nbytes() + v[l].nbytes());
  return n;
}

std::string KVCache::layout() const {
  std::ostringstream os;
  os << k.size() << " layers × {K, V} × " << (k.empty() ? "[]" : k[0].describe()) << " = " << bytes() << " bytes";
  return os.str();
}

Tensor forward_cached(const ch01::Llama& m, KVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions) {
  return forward_cached_with(m, cache, tokens, all_positions);
}

double Timing::tpot_s() const {
  if (decode_step_s.empty()) return 0;
  double s = 0;
  for (double t : decode_step_s) s += t;
  return s / static_cast<double>(decode_step_s.size());
}

CachedGeneration generate_cached(const ch01::Llama& m, const std::vector<std::int32_t>& prompt, int max_new,
                                 Sampler& sampler, const std::vector<std::int64_t>& eos_ids,
                                 const ch01::OnToken& on_token) {
  ch01::check_context(m, prompt.size(), max_new);
  CachedGeneration out;
  ch01::Generation& g = out.gen;
  g.tokens = prompt;
  KVCache cache = KVCache::allocate(m.config, static_cast<std::int64_t>(prompt.size()) + max_new, m.device());
  metrics::Timer total;
  std::vector<std::int32_t> feed = prompt;  // prefill: the whole prompt; then one token at a time
  for (int i = 0; i < max_new; ++i) {
    ch01::Step s;
    s.tokens_in = static_cast<std::int64_t>(feed.size());
    metrics::Timer timer;
    {
      metrics::CountScope scope;
      s.token = sampler.sample(forward_cached(m, cache, feed));
      s.work = scope.work();
      if (auto it = scope.by_op().find("attention"); it != scope.by_op().end()) s.attention_flops = it->second.flops;
    }
    if (m.device() == Device::CUDA) cuda::synchronize();
    s.seconds = timer.seconds();
    (i == 0 ? out.timing.ttft_s : out.timing.decode_step_s.emplace_back()) = s.seconds;
    g.steps.push_back(s);
    g.tokens.push_back(s.token);
    g.generated.push_back(s.token);
    feed = {s.token};
    if (on_token) on_token(g);
    if (std::find(eos_ids.begin(), eos_ids.end(), s.token) != eos_ids.end()) {
      g.stopped_at_eos = true;
      break;
    }
  }
  out.timing.total_s = total.seconds();
  return out;
}

}  // namespace inferlab::ch02
