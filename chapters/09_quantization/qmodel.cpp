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

const QMatrix& qmatrix(const Linear& l, const std::string& what) {
  const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
  IL_CHECK(q != nullptr, what, " is not a quantised matrix");
  return *q;
}

namespace {

// q's values in one of common/quant/interleaved.h's layouts, where it has one: the GGUF block
// types as they are; int8 (tensor, rows, LLM.int8()) as int8 rows; int4 as its groups. fp8 has
// none (no integer product: its values are not multiples of one step within a block).
std::optional<quant::Layout> layout_for(const QMatrix& q) {
  switch (q.spec.format) {
    case Format::Int8Tensor:
    case Format::Int8Row:
    case Format::LlmInt8: return quant::Layout::int8_rows();
    case Format::Int4Sym:
    case Format::Int4Asym: return quant::Layout::int4_groups(q.spec.group, q.spec.format == Format::Int4Asym);
    case Format::Fp8E4M3: return std::nullopt;
    default: return quant::Layout::blocks(gguf_type(q.spec.format));
  }
}

// An int4 group in the row order interleaved.h reads: its scale, its zero point, its G/2 bytes.
std::int64_t int4_block_bytes(const QuantSpec& s) { return (s.format == Format::Int4Asym ? 5 : 4) + s.group / 2; }

quant::Interleaved8 interleaved(const QMatrix& q) {
  IL_CHECK(interleavable(q),
           "interleaved blocks: need a CPU q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q4_k, q5_k, q6_k, iq4_xs, int8 or int4 ",
           "matrix with rows a multiple of 8 and n_in whole blocks of 32 (and a CPU with AVX2), got ", q.spec.name(), " ",
           q.rows, " × ", q.cols, " on ", device_name(q.device()));
  const quant::Layout l = *layout_for(q);
  const auto* bytes = static_cast<const std::uint8_t*>(q.data.raw_data());  // int8 values or packed bytes
  if (l.kind == quant::Layout::Kind::Int8Rows) {                            // int8_tensor: its one scale for every row
    std::vector<float> s(static_cast<std::size_t>(q.rows), q.scales.data<float>()[0]);
    if (q.spec.format != Format::Int8Tensor) std::copy_n(q.scales.data<float>(), q.rows, s.begin());
    return quant::Interleaved8(l, q.rows, q.cols, bytes, s.data());
  }
  if (l.kind == quant::Layout::Kind::Blocks) return quant::Interleaved8(l, q.rows, q.cols, bytes);
  const std::int64_t G = q.spec.group, groups = q.rows * (q.cols / G), bb = int4_block_bytes(q.spec);
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(groups * bb));
  for (std::int64_t j = 0; j < groups; ++j) {  // group j of the matrix: row j / (n_in / G)
    std::uint8_t* p = blocks.data() + j * bb;
    std::memcpy(p, q.scales.data<float>() + j, 4);
    if (l.zero_points) p[4] = q.zeros.data<std::uint8_t>()[j];
    std::memcpy(p + bb - G / 2, q.data.data<std::uint8_t>() + j * (G / 2), static_cast<std::size_t>(G / 2));
  }
  return quant::Interleaved8(l, q.rows, q.cols, blocks.data());
}

}  // namespace

bool interleavable(const QMatrix& q) {
  const auto l = layout_for(q);
  return l && q.device() == Device::CPU && quant::interleavable(*l, q.rows, q.cols);
}

Interleaved8::Interleaved8(const QMatrix& q) : spec_(q.spec), layout_(interleaved(q)) {}

QMatrix Interleaved8::rows_in_order() const {
  const Tensor blocks = layout_.rows_in_order();
  const std::int64_t rows = layout_.rows(), cols = layout_.cols();
  switch (layout_.layout().kind) {
    case quant::Layout::Kind::Blocks: return QMatrix(spec_, rows, cols, blocks);
    case quant::Layout::Kind::Int8Rows: {
      Tensor data = Tensor::empty({rows, cols}, DType::I8);
      std::memcpy(data.raw_data(), blocks.raw_data(), blocks.nbytes());
      const Tensor& s = layout_.row_scales();
      return QMatrix(spec_, rows, cols, data, spec_.format == Format::Int8Tensor ? s.slice(0, 0, 1).clone() : s.clone());
    }
    case quant::Layout::Kind::Int4Groups: break;
  }
  const std::int64_t G = spec_.group, ng = cols / G, bb = int4_block_bytes(spec_);
  Tensor data = Tensor::empty({rows, cols / 2}, DType::U8), scales = Tensor::empty({rows, ng}, DType::F32), zeros;
  if (spec_.format == Format::Int4Asym) zeros = Tensor::empty({rows, ng}, DType::U8);
  for (std::int64_t j = 0; j < rows * ng; ++j) {
    const std::uint8_t* p = blocks.data<std::uint8_t>() + j * bb;
    std::memcpy(scales.data<float>() + j, p, 4);
    if (zeros.defined()) zeros.data<std::uint8_t>()[j] = p[4];
    std::memcpy(data.data<std::uint8_t>() + j * (G / 2), p + bb - G / 2, static_cast<std::size_t>(G / 2));
  }
  return QMatrix(spec_, rows, cols, data, scales, zeros);
}

std::shared_ptr<const PackedMatrix> Interleaved8::to_device(Device d) const {
  if (d == Device::CPU) return std::make_shared<Interleaved8>(*this);
  return std::make_shared<QMatrix>(rows_in_order().to(d));
}

void Interleaved8::matmul(const Tensor& x, Tensor& out) const {
  layout_.check_operands(x, out, spec_.name() + " (interleaved) product");
  // Every layout here multiplies x as integers (q8_0 blocks, or LLM.int8()'s rows), and casting
  // NaN or Inf to an integer is undefined.
  check_finite_activations(x, spec_.name());
  if (spec_.format == Format::LlmInt8) return llm_int8_interleaved(x, layout_, spec_.threshold, out);
  layout_.matmul(blocked_activations_fast(x), out.data<float>());
}

void interleave_blocks(models::Llama& m, int* count) {
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
