#include "chapters/09_quantization/qmodel.h"

namespace inferlab::ch09 {

ch01::Llama quantize_model(const ch01::Llama& m, const QuantSpec& spec) {
  ch01::Llama q = m;
  q.source = m.source + " (" + spec.name() + ")";
  // Errors name the matrix as the checkpoint does, in the order of LlamaLayer::linears().
  const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (std::size_t i = 0; i < q.layers.size(); ++i)
    for (std::size_t j = 0; j < 7; ++j) {
      Linear& w = *q.layers[i].linears()[j];
      w = quantize(w, spec, m.source + ": " + spec.name() + " of model.layers." + std::to_string(i) + "." + names[j] + ".weight");
    }
  q.lm_head = quantize(m.lm_head, spec, m.source + ": " + spec.name() + " of lm_head.weight");  // a tied head becomes its own quantised copy
  return q;
}

std::int64_t matrix_weights(const ch01::Llama& m) {
  std::int64_t n = m.lm_head.out_features() * m.lm_head.in_features();
  for (const auto& l : m.layers)
    for (const Linear* w : l.linears()) n += w->out_features() * w->in_features();
  return n;
}

const QMatrix& qmatrix(const Linear& l, const std::string& what) {
  const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
  IL_CHECK(q != nullptr, what, " is not a quantised matrix");
  return *q;
}

}  // namespace inferlab::ch09
