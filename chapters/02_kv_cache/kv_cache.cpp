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

// Chapter 01's forward pass; the lines marked "cache" are what chapter 02 adds.
Tensor forward_cached(const ch01::Llama& m, KVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions) {
  const auto& c = m.config;
  const std::int64_t T = static_cast<std::int64_t>(tokens.size()), N = c.num_heads, K = c.num_kv_heads,
                     H = c.head_dim;
  const std::int64_t start = cache.length, end = start + T;  // cache: positions start .. end-1
  IL_CHECK(T > 0, "forward_cached: no tokens");
  IL_CHECK(end <= cache.capacity, "KV cache full: ", start, " positions cached + ", T, " new exceeds its capacity of ",
           cache.capacity);
  const Device dev = m.device();
  std::vector<std::int32_t> pos(tokens.size());
  for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(start + t);
  const Tensor ids = Tensor::from_vector(tokens, {T}).to(dev), positions = Tensor::from_vector(pos, {T}).to(dev);

  Tensor x = ops::embedding(m.embed, ids);
  for (std::size_t li = 0; li < m.layers.size(); ++li) {
    const ch01::LlamaLayer& l = m.layers[li];
    Tensor h = ops::rmsnorm(x, l.attn_norm, static_cast<float>(c.rms_norm_eps));
    Tensor q = ops::matmul(h, l.wq), k = ops::matmul(h, l.wk), v = ops::matmul(h, l.wv);
    if (l.bq.defined()) ops::add(q, l.bq, q), ops::add(k, l.bk, k), ops::add(v, l.bv, v);
    q = q.view({T, N, H}), k = k.view({T, K, H}), v = v.view({T, K, H});
    ops::rope(q, positions, m.inv_freq, m.rope_pairing);
    ops::rope(k, positions, m.inv_freq, m.rope_pairing);
    cache.k[li].slice(0, start, end).copy_from(k);  // cache: keep the new keys and values ...
    cache.v[li].slice(0, start, end).copy_from(v);
    AttentionParams p;
    p.q_offset = start;                             // cache: ... and attend over all of them
    Tensor a = ops::attention(q, cache.k[li].slice(0, 0, end), cache.v[li].slice(0, 0, end), p);
    ops::add(x, ops::matmul(a.view({T, N * H}), l.wo), x);
    h = ops::rmsnorm(x, l.mlp_norm, static_cast<float>(c.rms_norm_eps));
    ops::add(x, ops::matmul(ops::swiglu(ops::matmul(h, l.w_gate), ops::matmul(h, l.w_up)), l.w_down), x);
  }
  cache.length = end;  // cache
  if (!all_positions) x = x.slice(0, T - 1, T);
  return ops::matmul(ops::rmsnorm(x, m.final_norm, static_cast<float>(c.rms_norm_eps)), m.lm_head);
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
