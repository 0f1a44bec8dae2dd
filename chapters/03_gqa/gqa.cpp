#include "chapters/03_gqa/gqa.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/cuda/backend.h"
#include "common/lab.h"

namespace inferlab::ch03 {

namespace {

// Rows of a [heads·H, D] projection as heads, averaged within each of `groups` consecutive groups.
Tensor pool_heads(const Tensor& w, std::int64_t heads, std::int64_t H, std::int64_t groups) {
  const Tensor src = w.to(Device::CPU).to(DType::F32);
  const std::int64_t D = src.size(1), per = heads / groups;
  Tensor out = Tensor::zeros({groups * H, D}, DType::F32);
  const float* s = src.data<float>();
  float* o = out.data<float>();
  // EXERCISE 03.2 BEGIN: mean pooling, head by head
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t k = 0; k < per; ++k)
      for (std::int64_t r = 0; r < H * D; ++r) o[g * H * D + r] += s[(g * per + k) * H * D + r];
  for (std::int64_t i = 0; i < out.numel(); ++i) o[i] /= static_cast<float>(per);
  // EXERCISE 03.2 STUB
  // (void)s, (void)o, (void)D, (void)per;
  // lab::not_done("03.2", "set head g of `out` (H rows of D floats) to the mean of heads g·per .. g·per + per - 1 "
  //                       "of the source: consecutive heads form a group");
  // EXERCISE 03.2 END
  return out.to(w.dtype()).to(w.device());
}

Tensor repeat_heads(const Tensor& w, std::int64_t kv_heads, std::int64_t H, std::int64_t group) {
  const Tensor src = w.to(Device::CPU).contiguous();
  const std::size_t block =
      static_cast<std::size_t>(H) * static_cast<std::size_t>(src.numel() / src.size(0)) * dtype_size(src.dtype());
  Shape shape = src.shape();
  shape[0] *= group;
  Tensor out = Tensor::empty(shape, src.dtype());
  // EXERCISE 03.1 BEGIN: which KV head each query head reads
  for (std::int64_t g = 0; g < kv_heads; ++g)
    for (std::int64_t r = 0; r < group; ++r)
      std::memcpy(static_cast<char*>(out.raw_data()) + (g * group + r) * block,
                  static_cast<const char*>(src.raw_data()) + g * block, block);
  // EXERCISE 03.1 STUB
  // (void)block;
  // lab::not_done("03.1", "give every query head its own copy of the KV head it reads: head h of `out` is "
  //                       "head h / group of the source, each head `block` bytes");
  // EXERCISE 03.1 END
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
    for (Linear* w : {&l.wk, &l.wv}) {
      IL_CHECK(!w->packed, "mean_pool_kv_heads: the model's weights are packed; pool before quantising");
      w->weight = pool_heads(w->weight, c.num_kv_heads, c.head_dim, kv_heads);
      if (w->bias.defined()) w->bias = pool_heads(w->bias.view({-1, 1}), c.num_kv_heads, c.head_dim, kv_heads).view({-1});
    }
  }
  out.source =
      m.source + " (KV heads mean-pooled " + std::to_string(c.num_kv_heads) + " -> " + std::to_string(kv_heads) + ")";
  return out;
}

ch01::Llama repeat_kv_heads(const ch01::Llama& m) {
  const auto& c = m.config;
  const std::int64_t group = c.num_heads / c.num_kv_heads;
  ch01::Llama out = m;
  out.config.num_kv_heads = c.num_heads;
  for (auto& l : out.layers) {
    for (Linear* w : {&l.wk, &l.wv}) {
      IL_CHECK(!w->packed, "repeat_kv_heads: the model's weights are packed; repeat before quantising");
      w->weight = repeat_heads(w->weight, c.num_kv_heads, c.head_dim, group);
      if (w->bias.defined()) w->bias = repeat_heads(w->bias.view({-1, 1}), c.num_kv_heads, c.head_dim, group).view({-1});
    }
  }
  return out;
}

Tensor decode_step(const ch01::Llama& m, const std::vector<ch02::KVCache*>& caches,
                   const std::vector<std::int32_t>& tokens) {
  IL_CHECK(!tokens.empty() && caches.size() == tokens.size(), "decode_step: ", tokens.size(), " tokens for ", caches.size(),
           " caches");
  std::vector<ch02::SequenceStep> batch;
  for (std::size_t b = 0; b < tokens.size(); ++b) batch.push_back({{tokens[b]}, caches[b]});
  return ch02::forward(m, batch);
}

void fill_cache(ch02::ContiguousKVCache& cache, std::int64_t length, std::uint64_t seed) {
  IL_CHECK(cache.length() == 0 && length <= cache.capacity(), "fill_cache: ", length,
           " positions do not fit an empty cache of capacity ", cache.capacity());
  for (std::int64_t l = 0; l < cache.layers(); ++l) {
    Tensor k = cache.k(l).slice(0, 0, length), v = cache.v(l).slice(0, 0, length);
    fill_random(k, seed++);
    fill_random(v, seed++);
  }
  cache.commit(length);
}

void fill_random(Tensor& rows, std::uint64_t seed) {
  if (rows.is_cuda()) return cuda::fill_uniform(rows, seed, -1.0f, 1.0f);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  float* p = rows.data<float>();
  for (std::int64_t i = 0; i < rows.numel(); ++i) {  // xorshift: fast, not zeros, not cache-friendly
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

double decode_step_bytes(const ch01::Llama& m, const std::vector<std::int64_t>& lengths, DType cache_dtype) {
  // EXERCISE 03.3 BEGIN: the bytes one decode step reads
  double bytes = static_cast<double>(m.step_weight_bytes());
  for (std::int64_t len : lengths)
    bytes += static_cast<double>(m.config.kv_cache_bytes(len + 1, static_cast<std::int64_t>(dtype_size(cache_dtype))));
  return bytes;
  // EXERCISE 03.3 STUB
  // lab::not_done("03.3", "return the bytes one batched decode step reads: the weights once "
  //                       "(m.step_weight_bytes()), plus each sequence's whole cache after it has kept "
  //                       "its new token (config.kv_cache_bytes)");
  // EXERCISE 03.3 END
}

ThroughputPoint measure_decode(const ch01::Llama& m, std::int64_t batch, std::int64_t context, int steps) {
  std::vector<std::unique_ptr<ch02::ContiguousKVCache>> caches;
  std::vector<ch02::KVCache*> views;
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(std::make_unique<ch02::ContiguousKVCache>(m.config, context + steps + 1, m.device()));
    fill_cache(*caches.back(), context, static_cast<std::uint64_t>(b) * 1000 + 1);
    views.push_back(caches.back().get());
  }
  const std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch), 3);
  return time_decode(batch, decode_step_bytes(m, std::vector<std::int64_t>(static_cast<std::size_t>(batch), context)), steps,
                     m.device(), [&] { decode_step(m, views, tokens); });
}

nlohmann::json to_json(const ThroughputPoint& p, const metrics::ReadCeiling& read, double peak_flops) {
  return {{"batch", p.batch},
          {"tokens_per_s", p.tokens_per_s()},
          {"memory_model_tokens_per_s", p.memory_bound_tokens_per_s(read.bytes_per_s())},
          {"roofline_tokens_per_s", p.roofline_tokens_per_s(read.bytes_per_s(), peak_flops)},
          {"achieved_bytes_per_s", p.achieved_bytes_per_s()},
          {"bytes_per_step", p.bytes_per_step},
          {"flops_per_step", p.flops_per_step},
          {"seconds_per_step", p.seconds_per_step},
          {"read_ceiling", metrics::to_json(read)}};
}

ThroughputPoint time_decode(std::int64_t batch, double bytes_per_step, int steps, Device device,
                            const std::function<void()>& step) {
  ThroughputPoint p;
  p.batch = batch;
  p.bytes_per_step = bytes_per_step;
  {
    metrics::CountScope scope;
    step();  // warm-up, and the step's FLOPs
    p.flops_per_step = scope.work().flops;
  }
  if (device == Device::CUDA) cuda::synchronize();
  double best = 1e300;
  for (int s = 0; s < steps; ++s) {
    metrics::Timer t;
    step();
    if (device == Device::CUDA) cuda::synchronize();
    best = std::min(best, t.seconds());
  }
  p.seconds_per_step = best;
  return p;
}

}  // namespace inferlab::ch03
