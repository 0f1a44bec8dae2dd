#include "chapters/09_quantization/awq.h"
#include "chapters/01_naive_decode/generate.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace inferlab::ch09 {

namespace {

Tensor rows_concat(const std::vector<Tensor>& parts) {
  std::int64_t rows = 0;
  for (const auto& p : parts) rows += p.size(0);
  Tensor out = Tensor::empty({rows, parts[0].size(1)}, DType::F32);
  std::int64_t r = 0;
  for (const auto& p : parts) {
    out.slice(0, r, r + p.size(0)).copy_from(p);
    r += p.size(0);
  }
  return out;
}

// Mean squared error of X·Wᵀ against (X/s)·deq(quant(W·s))ᵀ over the group's matrices.
double group_loss(const Tensor& X, const std::vector<Tensor>& ws, const std::vector<float>& s, const QuantSpec& spec,
                  const std::vector<Tensor>& exact) {
  const std::int64_t T = X.size(0), C = X.size(1);
  Tensor Xs = X.clone();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < C; ++c) Xs.data<float>()[t * C + c] /= s[static_cast<std::size_t>(c)];
  double err = 0, n = 0;
  for (std::size_t i = 0; i < ws.size(); ++i) {
    Tensor w = ws[i].to(DType::F32).clone();
    for (std::int64_t r = 0; r < w.size(0); ++r)
      for (std::int64_t c = 0; c < C; ++c) w.data<float>()[r * C + c] *= s[static_cast<std::size_t>(c)];
    const Tensor y = ops::matmul(Xs, dequantize(quantize(w, spec)));
    for (std::int64_t j = 0; j < y.numel(); ++j) {
      const double d = static_cast<double>(y.data<float>()[j]) - exact[i].data<float>()[j];
      err += d * d;
    }
    n += static_cast<double>(y.numel());
  }
  return err / n;
}

// The search: α on a grid, s = mean|x|^α normalised to a geometric mean of 1 over its extremes.
std::vector<float> search(const Tensor& X, const std::vector<Tensor>& ws, const QuantSpec& spec, int grid, AwqGroup& g,
                          const std::vector<std::int64_t>* tie = nullptr) {
  const std::int64_t T = X.size(0), C = X.size(1);
  std::vector<double> act(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < C; ++c) act[static_cast<std::size_t>(c)] += std::fabs(X.data<float>()[t * C + c]) / T;
  if (tie) {  // channels that must share a scale (GQA: the query heads of one value head)
    std::vector<double> sum(static_cast<std::size_t>(C), 0.0), cnt(static_cast<std::size_t>(C), 0.0);
    for (std::int64_t c = 0; c < C; ++c) sum[(*tie)[c]] += act[c], cnt[(*tie)[c]] += 1;
    for (std::int64_t c = 0; c < C; ++c) act[c] = sum[(*tie)[c]] / cnt[(*tie)[c]];
  }
  std::vector<Tensor> exact;
  for (const auto& w : ws) exact.push_back(ops::matmul(X, w.to(DType::F32)));
  std::vector<float> best(static_cast<std::size_t>(C), 1.0f);
  for (int i = 0; i <= grid; ++i) {
    const double alpha = static_cast<double>(i) / grid;
    std::vector<float> s(static_cast<std::size_t>(C));
    double mx = 0, mn = 1e300;
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = std::max(std::pow(act[c], alpha), 1e-4);
      s[c] = static_cast<float>(v), mx = std::max(mx, v), mn = std::min(mn, v);
    }
    const double norm = std::sqrt(mx * mn);
    for (auto& v : s) v = static_cast<float>(v / norm);
    const double loss = group_loss(X, ws, s, spec, exact);
    if (i == 0) g.loss_rtn = loss, g.loss_awq = loss, g.alpha = 0;
    if (loss < g.loss_awq) g.loss_awq = loss, g.alpha = alpha, best = s;
  }
  return best;
}

Tensor scale_columns(const Tensor& w, const std::vector<float>& s) {  // W·diag(s)
  Tensor o = w.to(DType::F32).clone();
  const std::int64_t C = o.size(1);
  for (std::int64_t r = 0; r < o.size(0); ++r)
    for (std::int64_t c = 0; c < C; ++c) o.data<float>()[r * C + c] *= s[static_cast<std::size_t>(c)];
  return o.to(w.dtype());
}
Tensor scale_rows(const Tensor& w, const std::vector<float>& s, bool divide) {  // diag(s)⁻¹·W (one s per row)
  Tensor o = w.to(DType::F32).clone();
  const std::int64_t C = o.ndim() == 2 ? o.size(1) : 1;
  for (std::int64_t r = 0; r < o.size(0); ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      float& v = o.data<float>()[r * C + c];
      v = divide ? v / s[static_cast<std::size_t>(r)] : v * s[static_cast<std::size_t>(r)];
    }
  return o.to(w.dtype());
}

}  // namespace

models::Llama awq_scale(const models::Llama& m_in, const std::vector<std::int32_t>& calibration, const QuantSpec& spec,
                        std::vector<AwqGroup>* report, int grid) {
  IL_CHECK(!calibration.empty(), "awq: no calibration tokens");
  const models::Llama m = m_in.to(Device::CPU, DType::F32);
  const auto& c = m.config;
  const std::int64_t L = c.num_layers, G = c.num_heads / c.num_kv_heads, H = c.head_dim;
  // 1. Collect each group's inputs on the calibration text.
  std::vector<std::vector<Tensor>> in_q(L), in_o(L), in_gate(L), in_down(L);
  // One input per group: q (shared with k and v), o, gate (shared with up), down.
  std::map<const Linear*, std::vector<Tensor>*> record;
  for (std::int64_t l = 0; l < L; ++l) {
    const auto& s = m.layers[l];
    record[&s.wq] = &in_q[l], record[&s.wo] = &in_o[l], record[&s.w_gate] = &in_gate[l], record[&s.w_down] = &in_down[l];
  }
  const LinearHook hook([&](const Linear& layer, const Tensor& x) {
    if (auto it = record.find(&layer); it != record.end()) it->second->push_back(x.clone());
  });
  const std::int64_t window = c.max_position_embeddings;
  for (std::size_t at = 0; at < calibration.size(); at += static_cast<std::size_t>(window)) {
    const std::vector<std::int32_t> part(calibration.begin() + static_cast<long>(at),
                                         calibration.begin() + static_cast<long>(std::min(calibration.size(), at + window)));
    ch01::forward(m, part, true);
  }
  // 2. Search each group's scales and fold them in. Groups of one layer see the inputs of the
  // original model: scaling is exact in real arithmetic, so they do not change.
  models::Llama out = m;
  std::vector<std::int64_t> v_channel(static_cast<std::size_t>(c.num_heads * H));
  for (std::int64_t j = 0; j < c.num_heads * H; ++j) v_channel[j] = (j / H) / G * H + j % H;
  for (std::int64_t l = 0; l < L; ++l) {
    auto& o = out.layers[l];
    AwqGroup a{"layer " + std::to_string(l) + " q/k/v"}, b{"layer " + std::to_string(l) + " gate/up"},
        d{"layer " + std::to_string(l) + " o"}, e{"layer " + std::to_string(l) + " down"};
    auto s = search(rows_concat(in_q[l]), {o.wq.weight, o.wk.weight, o.wv.weight}, spec, grid, a);
    for (Linear* w : {&o.wq, &o.wk, &o.wv}) w->weight = scale_columns(w->weight, s);
    o.attn_norm = scale_rows(o.attn_norm.view({-1, 1}), s, true).view({-1});
    s = search(rows_concat(in_gate[l]), {o.w_gate.weight, o.w_up.weight}, spec, grid, b);
    o.w_gate.weight = scale_columns(o.w_gate.weight, s), o.w_up.weight = scale_columns(o.w_up.weight, s);
    o.mlp_norm = scale_rows(o.mlp_norm.view({-1, 1}), s, true).view({-1});
    // o's input channel (head h, dim d) comes from v's row (kv head h/G, d): one scale per v row.
    s = search(rows_concat(in_o[l]), {o.wo.weight}, spec, grid, d, &v_channel);
    o.wo.weight = scale_columns(o.wo.weight, s);
    std::vector<float> sv(static_cast<std::size_t>(c.num_kv_heads * H));
    for (std::int64_t j = 0; j < c.num_heads * H; ++j) sv[static_cast<std::size_t>(v_channel[j])] = s[j];
    o.wv.weight = scale_rows(o.wv.weight, sv, true);
    if (o.wv.bias.defined()) o.wv.bias = scale_rows(o.wv.bias.view({-1, 1}), sv, true).view({-1});
    s = search(rows_concat(in_down[l]), {o.w_down.weight}, spec, grid, e);
    o.w_down.weight = scale_columns(o.w_down.weight, s);
    o.w_up.weight = scale_rows(o.w_up.weight, s, true);
    if (o.w_up.bias.defined()) o.w_up.bias = scale_rows(o.w_up.bias.view({-1, 1}), s, true).view({-1});
    if (report)
      for (auto* g : {&a, &b, &d, &e}) report->push_back(*g);
  }
  out.source = m_in.source + " (AWQ scales for " + spec.name() + ")";
  return out;
}

}  // namespace inferlab::ch09
