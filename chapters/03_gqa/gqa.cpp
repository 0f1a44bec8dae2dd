#include "chapters/03_gqa/gqa.h"

#include <algorithm>
#include <cstring>

#include "common/cuda/backend.h"

namespace inferlab::ch03 {

namespace {

// Rows of a [heads·H, D] projection as heads, averaged within each of `groups` consecutive groups.
Tensor pool_heads(const Tensor& w, std::int64_t heads, std::int64_t H, std::int64_t groups) {
  const Tensor src = w.to(Device::CPU).to(DType::F32);
  const std::int64_t D = src.size(1), per = heads / groups;
  Tensor out = Tensor::zeros({groups * H, D}, DType::F32);
  const float* s = src.data<float>();
  float* o = out.data<float>();
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t k = 0; k < per; ++k)
      for (std::int64_t r = 0; r < H * D; ++r) o[g * H * D + r] += s[(g * per + k) * H * D + r];
  for (std::int64_t i = 0; i < out.numel(); ++i) o[i] /= static_cast<float>(per);
  return out.to(w.dtype()).to(w.device());
}

Tensor repeat_heads(const Tensor& w, std::int64_t kv_heads, std::int64_t H, std::int64_t group) {
  const Tensor src = w.to(Device::CPU).contiguous();
  const std::size_t block = static_cast<std::size_t>(H) * static_cast<std::size_t>(src.numel() / src.size(0)) *
                            dtype_size(src.dtype());
  Shape shape = src.shape();
  shape[0] *= group;
  Tensor out = Tensor::empty(shape, src.dtype());
  for (std::int64_t g = 0; g < kv_heads; ++g)
    for (std::int64_t r = 0; r < group; ++r)
      std::memcpy(static_cast<char*>(out.raw_data()) + (g * group + r) * block,
                  static_cast<const char*>(src.raw_data()) + g * block, block);
  return out.to(w.device());
}

}  // namespace

ch01::Llama mean_pool_kv_heads(const ch01::Llama& m, std::int64_t kv_heads) {
  const auto& c = m.config;
  IL_CHECK(kv_heads > 0 && c.num_kv_heads % kv_heads == 0, "mean_pool_kv_heads: ", c.num_kv_heads,
           " KV heads cannot be pooled into ", kv_heads, " groups");
  ch01::Llama out = m;
  out.config.num_kv_heads = kv_heads;
  for (auto& l : out.layers) {
    l.wk = pool_heads(l.wk, c.num_kv_heads, c.head_dim, kv_heads);
    l.wv = pool_heads(l.wv, c.num_kv_heads, c.head_dim, kv_heads);
    if (l.bk.defined()) {
      l.bk = pool_heads(l.bk.view({-1, 1}), c.num_kv_heads, c.head_dim, kv_heads).view({-1});
      l.bv = pool_heads(l.bv.view({-1, 1}), c.num_kv_heads, c.head_dim, kv_heads).view({-1});
    }
  }
  out.source = m.source + " (KV heads mean-pooled " + std::to_string(c.num_kv_heads) + " -> " + std::to_string(kv_heads) + ")";
  return out;
}

ch01::Llama repeat_kv_heads(const ch01::Llama& m) {
  const auto& c = m.config;
  const std::int64_t group = c.num_heads / c.num_kv_heads;
  ch01::Llama out = m;
  out.config.num_kv_heads = c.num_heads;
  for (auto& l : out.layers) {
    l.wk = repeat_heads(l.wk, c.num_kv_heads, c.head_dim, group);
    l.wv = repeat_heads(l.wv, c.num_kv_heads, c.head_dim, group);
    if (l.bk.defined()) {
      l.bk = repeat_heads(l.bk.view({-1, 1}), c.num_kv_heads, c.head_dim, group).view({-1});
      l.bv = repeat_heads(l.bv.view({-1, 1}), c.num_kv_heads, c.head_dim, group).view({-1});
    }
  }
  return out;
}

Tensor forward_batch(const ch01::Llama& m, std::vector<ch02::KVCache>& caches, const std::vector<std::int32_t>& tokens) {
  const auto& c = m.config;
  const std::int64_t B = static_cast<std::int64_t>(tokens.size()), N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  IL_CHECK(B > 0 && caches.size() == tokens.size(), "forward_batch: ", tokens.size(), " tokens for ", caches.size(),
           " caches");
  for (std::int64_t b = 0; b < B; ++b)
    IL_CHECK(caches[b].length < caches[b].capacity, "KV cache full: sequence ", b, " has ", caches[b].length,
             " of ", caches[b].capacity, " positions");
  const Device dev = m.device();
  std::vector<Tensor> pos;
  for (std::int64_t b = 0; b < B; ++b)
    pos.push_back(Tensor::from_vector(std::vector<std::int32_t>{static_cast<std::int32_t>(caches[b].length)}, {1}).to(dev));
  Tensor x = ops::embedding(m.embed, Tensor::from_vector(tokens, {B}).to(dev));  // [B, D]: one row per sequence
  Tensor a = Tensor::empty({B, N * H}, DType::F32, dev);
  for (std::size_t li = 0; li < m.layers.size(); ++li) {
    const ch01::LlamaLayer& l = m.layers[li];
    Tensor h = ops::rmsnorm(x, l.attn_norm, static_cast<float>(c.rms_norm_eps));
    Tensor q = ops::matmul(h, l.wq), k = ops::matmul(h, l.wk), v = ops::matmul(h, l.wv);  // shared weights
    if (l.bq.defined()) ops::add(q, l.bq, q), ops::add(k, l.bk, k), ops::add(v, l.bv, v);
    for (std::int64_t b = 0; b < B; ++b) {  // attention: each sequence against its own cache
      ch02::KVCache& cache = caches[static_cast<std::size_t>(b)];
      const std::int64_t p = cache.length;
      Tensor qb = q.slice(0, b, b + 1).view({1, N, H}), kb = k.slice(0, b, b + 1).view({1, K, H});
      ops::rope(qb, pos[static_cast<std::size_t>(b)], m.inv_freq, m.rope_pairing);
      ops::rope(kb, pos[static_cast<std::size_t>(b)], m.inv_freq, m.rope_pairing);
      cache.k[li].slice(0, p, p + 1).copy_from(kb);
      cache.v[li].slice(0, p, p + 1).copy_from(v.slice(0, b, b + 1).view({1, K, H}));
      AttentionParams ap;
      ap.q_offset = p;
      Tensor ab = a.slice(0, b, b + 1).view({1, N, H});
      ops::attention(qb, cache.k[li].slice(0, 0, p + 1), cache.v[li].slice(0, 0, p + 1), ab, ap);
    }
    ops::add(x, ops::matmul(a, l.wo), x);
    h = ops::rmsnorm(x, l.mlp_norm, static_cast<float>(c.rms_norm_eps));
    ops::add(x, ops::matmul(ops::swiglu(ops::matmul(h, l.w_gate), ops::matmul(h, l.w_up)), l.w_down), x);
  }
  for (auto& cache : caches) cache.length += 1;
  return ops::matmul(ops::rmsnorm(x, m.final_norm, static_cast<float>(c.rms_norm_eps)), m.lm_head);
}

void fill_cache(ch02::KVCache& cache, std::int64_t length, std::uint64_t seed) {
  IL_CHECK(length <= cache.capacity, "fill_cache: ", length, " positions exceed the capacity of ", cache.capacity);
  for (std::size_t l = 0; l < cache.k.size(); ++l)
    for (Tensor* t : {&cache.k[l], &cache.v[l]}) {
      Tensor part = t->slice(0, 0, length);
      if (t->is_cuda()) {
        cuda::fill_uniform(part, seed++, -1.0f, 1.0f);
        continue;
      }
      std::uint64_t s = seed++ * 0x9E3779B97F4A7C15ull + 1;
      float* p = part.data<float>();
      for (std::int64_t i = 0; i < part.numel(); ++i) {  // xorshift: fast, not zeros, not cache-friendly
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
      }
    }
  cache.length = length;
}

double decode_step_bytes(const ch01::Llama& m, const std::vector<ch02::KVCache>& caches) {
  const auto& c = m.config;
  double bytes = static_cast<double>(m.weight_bytes());
  for (const auto& cache : caches)
    bytes += 2.0 * static_cast<double>(cache.length + 1) * c.num_kv_heads * c.head_dim * c.num_layers *
             static_cast<double>(dtype_size(cache.k[0].dtype()));
  return bytes;
}

ThroughputPoint measure_decode(const ch01::Llama& m, std::int64_t batch, std::int64_t context, int steps) {
  std::vector<ch02::KVCache> caches;
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(ch02::KVCache::allocate(m.config, context + steps + 1, m.device()));
    fill_cache(caches.back(), context, static_cast<std::uint64_t>(b) * 1000 + 1);
  }
  const std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch), 3);
  ThroughputPoint p;
  p.batch = batch;
  p.bytes_per_step = decode_step_bytes(m, caches);
  {
    metrics::CountScope scope;
    forward_batch(m, caches, tokens);  // warm-up, and the step's FLOPs
    p.flops_per_step = scope.work().flops;
  }
  if (m.device() == Device::CUDA) cuda::synchronize();
  double best = 1e300;
  for (int s = 0; s < steps; ++s) {
    metrics::Timer t;
    forward_batch(m, caches, tokens);
    if (m.device() == Device::CUDA) cuda::synchronize();
    best = std::min(best, t.seconds());
  }
  p.seconds_per_step = best;
  return p;
}

}  // namespace inferlab::ch03
