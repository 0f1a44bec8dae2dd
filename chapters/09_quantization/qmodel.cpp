#include "chapters/09_quantization/qmodel.h"

namespace inferlab::ch09 {

ch01::Llama quantize_model(const ch01::Llama& m, const QuantSpec& spec) {
  ch01::Llama q = m;
  q.source = m.source + " (" + spec.name() + ")";
  for (auto& l : q.layers)
    for (Linear* w : l.linears()) *w = quantize(*w, spec);
  q.lm_head = quantize(m.lm_head, spec);  // a tied head becomes its own quantised copy
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
