#include "chapters/09_quantization/qmodel.h"

#include <algorithm>

#include "chapters/09_quantization/quant_impl.h"

namespace inferlab::ch09 {

std::int64_t width_multiple(const QuantSpec& s) {
  if (s.format == Format::Int4Sym || s.format == Format::Int4Asym) return s.group;
  return blocks_activations(s.format) ? 32 : 1;
}

ch01::Llama quantize_model(const ch01::Llama& m, const QuantSpec& spec, std::vector<std::string>* kept) {
  auto keep = [&](const Linear& w, const std::string& name) {
    if (kept == nullptr || w.in_features() % width_multiple(spec) == 0) return false;
    if (std::find(kept->begin(), kept->end(), name) == kept->end()) kept->push_back(name);
    return true;
  };
  ch01::Llama q = m;
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

std::int64_t matrix_weights(const ch01::Llama& m) {
  std::int64_t n = m.lm_head.out_features() * m.lm_head.in_features();
  for (const auto& l : m.layers) {
    for (const Linear* w : l.linears()) n += w->defined() ? w->out_features() * w->in_features() : 0;
    if (l.moe.defined())
      for (const Linear* w : l.moe.linears()) n += w->out_features() * w->in_features();
  }
  return n;
}

const QMatrix& qmatrix(const Linear& l, const std::string& what) {
  const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
  IL_CHECK(q != nullptr, what, " is not a quantised matrix");
  return *q;
}

bool interleavable(const QMatrix& q) {
  return blocks_activations(q.spec.format) && q.device() == Device::CPU &&
         quant::interleavable(gguf_type(q.spec.format), q.rows, q.cols);
}

namespace {
quant::Interleaved8 layout_of(const QMatrix& q) {
  IL_CHECK(interleavable(q),
           "interleaved blocks: need a CPU q4_0, q8_0, iq4_nl, q4_k, q6_k or iq4_xs matrix with rows a multiple of 8 ",
           "(and a CPU with AVX2), got ", q.spec.name(), " ", q.rows, " × ", q.cols, " on ", device_name(q.device()));
  return quant::Interleaved8(gguf_type(q.spec.format), q.rows, q.cols, q.data.data<std::uint8_t>());
}
}  // namespace

Interleaved8::Interleaved8(const QMatrix& q) : spec_(q.spec), layout_(layout_of(q)) {}

QMatrix Interleaved8::rows_in_order() const {
  return QMatrix(spec_, layout_.rows(), layout_.cols(), layout_.rows_in_order());
}

std::shared_ptr<const PackedMatrix> Interleaved8::to_device(Device d) const {
  if (d == Device::CPU) return std::make_shared<Interleaved8>(*this);
  return std::make_shared<QMatrix>(rows_in_order().to(d));
}

void Interleaved8::matmul(const Tensor& x, Tensor& out) const {
  layout_.check_operands(x, out, spec_.name() + " (interleaved) product");
  check_finite_activations(x, spec_.name());
  layout_.matmul(blocked_activations_fast(x), out.data<float>());
}

void interleave_blocks(ch01::Llama& m, int* count) {
  int n = 0;
  auto swap = [&](Linear& l) {
    const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
    if (q == nullptr || !interleavable(*q)) return;
    l.packed = std::make_shared<Interleaved8>(*q);
    ++n;
  };
  for (auto& layer : m.layers)
    for (Linear* w : layer.linears()) swap(*w);
  swap(m.lm_head);
  if (count) *count = n;
}

}  // namespace inferlab::ch09
