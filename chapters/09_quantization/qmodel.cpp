#include "chapters/09_quantization/qmodel.h"

namespace inferlab::ch09 {

QLlama quantize_model(const ch01::Llama& m, const QuantSpec& spec) {
  QLlama q;
  q.config = m.config, q.rope_pairing = m.rope_pairing, q.source = m.source + " (" + spec.name() + ")";
  q.inv_freq = m.inv_freq, q.embed = m.embed, q.final_norm = m.final_norm;
  for (const auto& l : m.layers) {
    QLayer ql;
    ql.attn_norm = l.attn_norm, ql.mlp_norm = l.mlp_norm, ql.bq = l.bq, ql.bk = l.bk, ql.bv = l.bv;
    ql.wq = quantize(l.wq, spec), ql.wk = quantize(l.wk, spec), ql.wv = quantize(l.wv, spec);
    ql.wo = quantize(l.wo, spec);
    ql.w_gate = quantize(l.w_gate, spec), ql.w_up = quantize(l.w_up, spec), ql.w_down = quantize(l.w_down, spec);
    q.layers.push_back(std::move(ql));
  }
  q.lm_head = quantize(m.lm_head, spec);
  return q;
}

std::int64_t QLlama::matrix_bytes() const {
  std::int64_t b = lm_head.bytes();
  for (const auto& l : layers)
    for (const QMatrix* w : l.matrices()) b += w->bytes();
  return b;
}

std::int64_t QLlama::matrix_weights() const {
  std::int64_t n = lm_head.rows * lm_head.cols;
  for (const auto& l : layers)
    for (const QMatrix* w : l.matrices()) n += w->rows * w->cols;
  return n;
}

QLlama QLlama::to(Device d) const {
  QLlama q = *this;
  auto t = [&](const Tensor& x) { return x.defined() ? x.to(d) : x; };
  q.inv_freq = t(inv_freq), q.embed = t(embed), q.final_norm = t(final_norm), q.lm_head = lm_head.to(d);
  for (auto& l : q.layers) {
    l.attn_norm = t(l.attn_norm), l.mlp_norm = t(l.mlp_norm), l.bq = t(l.bq), l.bk = t(l.bk), l.bv = t(l.bv);
    for (QMatrix* w : l.matrices()) *w = w->to(d);
  }
  return q;
}

Tensor forward_all(const QLlama& m, const std::vector<std::int32_t>& tokens) {
  ch02::KVCache cache = ch02::KVCache::allocate(m.config, static_cast<std::int64_t>(tokens.size()), m.device());
  return ch02::forward_cached_with(m, cache, tokens, true);
}

}  // namespace inferlab::ch09
