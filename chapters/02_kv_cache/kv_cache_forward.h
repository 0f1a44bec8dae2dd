#pragma once
// The body of forward_cached_with (see kv_cache.h): chapter 01's forward pass with the lines
// marked "cache" added. Included at the end of kv_cache.h.
#include "chapters/02_kv_cache/kv_cache.h"

namespace inferlab::ch02 {

// Chapter 01's forward pass; the lines marked "cache" are what chapter 02 adds.
template <class Model>
Tensor forward_cached_with(const Model& m, KVCache& cache, const std::vector<std::int32_t>& tokens,
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
    const auto& l = m.layers[li];
    Tensor h = ops::rmsnorm(x, l.attn_norm, static_cast<float>(c.rms_norm_eps));
    Tensor q = linear(h, l.wq), k = linear(h, l.wk), v = linear(h, l.wv);
    if (l.bq.defined()) ops::add(q, l.bq, q), ops::add(k, l.bk, k), ops::add(v, l.bv, v);
    q = q.view({T, N, H}), k = k.view({T, K, H}), v = v.view({T, K, H});
    ops::rope(q, positions, m.inv_freq, m.rope_pairing);
    ops::rope(k, positions, m.inv_freq, m.rope_pairing);
    cache.k[li].slice(0, start, end).copy_from(k);  // cache: keep the new keys and values ...
    cache.v[li].slice(0, start, end).copy_from(v);
    AttentionParams p;
    p.q_offset = start;                             // cache: ... and attend over all of them
    Tensor a = ops::attention(q, cache.k[li].slice(0, 0, end), cache.v[li].slice(0, 0, end), p);
    ops::add(x, linear(a.view({T, N * H}), l.wo), x);
    h = ops::rmsnorm(x, l.mlp_norm, static_cast<float>(c.rms_norm_eps));
    ops::add(x, linear(ops::swiglu(linear(h, l.w_gate), linear(h, l.w_up)), l.w_down), x);
  }
  cache.length = end;  // cache
  if (!all_positions) x = x.slice(0, T - 1, T);
  return linear(ops::rmsnorm(x, m.final_norm, static_cast<float>(c.rms_norm_eps)), m.lm_head);
}

}  // namespace inferlab::ch02
