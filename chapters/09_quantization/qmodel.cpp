#include "chapters/09_quantization/qmodel.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "chapters/09_quantization/quant_impl.h"

namespace inferlab::ch09 {

std::int64_t width_multiple(const QuantSpec& s) {
  if (s.format == Format::Int4Sym || s.format == Format::Int4Asym) return s.group;
  return blocks_activations(s.format) ? 32 : 1;
}

models::Llama quantize_model(const models::Llama& m, const QuantSpec& spec, std::vector<std::string>* kept) {
  auto keep = [&](const Linear& w, const std::string& name) {
    if (kept == nullptr || w.in_features() % width_multiple(spec) == 0) return false;
    if (std::find(kept->begin(), kept->end(), name) == kept->end()) kept->push_back(name);
    return true;
  };
  models::Llama q = m;
  q.source = m.source + " (" + spec.name() + ")";
  // Errors name the matrix as the checkpoint does, in the order of LlamaLayer::linears().
  const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (std::size_t i = 0; i < q.layers.size(); ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    for (std::size_t j = 0; j < 7; ++j) {
      Linear& w = *q.layers[i].linears()[j];
      if (!w.defined() || keep(w, names[j])) continue;  // undefined: an MoE layer's MLP
      w = quantize(w, spec, m.source + ": " + spec.name() + " of " + layer + names[j] + ".weight");
    }
    // An MoE layer's experts (and shared experts) as the projections; the router stays as it is,
    // as llama.cpp keeps ffn_gate_inp in F32.
    MoeFfn& f = q.layers[i].moe;
    for (std::size_t e = 0; f.defined() && e <= f.experts.size(); ++e) {
      Expert& x = e < f.experts.size() ? f.experts[e] : f.shared;
      if (!x.defined()) continue;
      const std::string name = e < f.experts.size() ? "expert " + std::to_string(e) : "shared expert";
      for (Linear* w : {&x.gate, &x.up, &x.down})
        if (!keep(*w, layer + name)) *w = quantize(*w, spec, m.source + ": " + spec.name() + " of " + layer + name);
    }
  }
  if (!keep(m.lm_head, "lm_head"))
    q.lm_head =
        quantize(m.lm_head, spec,
                 m.source + ": " + spec.name() + " of lm_head.weight");  // a tied head becomes its own quantised copy
  return q;
}

std::int64_t matrix_weights(const models::Llama& m) {
  std::int64_t n = m.lm_head.out_features() * m.lm_head.in_features();
  for (const auto& l : m.layers) {
    for (const Linear* w : l.linears()) n += w->defined() ? w->out_features() * w->in_features() : 0;
    if (l.moe.defined())
      for (const Linear* w : l.moe.linears()) n += w->out_features() * w->in_features();
  }
  return n;
}

}  // namespace inferlab::ch09
