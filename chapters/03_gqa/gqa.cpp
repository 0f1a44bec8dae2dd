#include "chapters/03_gqa/gqa.h"

#include <cstring>

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

models::Llama mean_pool_kv_heads(const models::Llama& m, std::int64_t kv_heads) {
  const auto& c = m.config;
  IL_CHECK(kv_heads > 0 && c.num_kv_heads % kv_heads == 0, "mean_pool_kv_heads: ", c.num_kv_heads,
           " KV heads cannot be pooled into ", kv_heads, " groups");
  models::Llama out = m;
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

models::Llama repeat_kv_heads(const models::Llama& m) {
  const auto& c = m.config;
  const std::int64_t group = c.num_heads / c.num_kv_heads;
  models::Llama out = m;
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

}  // namespace inferlab::ch03
