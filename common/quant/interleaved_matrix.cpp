#include "common/quant/interleaved_matrix.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::quant {
const QMatrix& qmatrix(const Linear& l, const std::string& what) {
  const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
  IL_CHECK(q != nullptr, what, " is not a quantised matrix");
  return *q;
}

namespace {

// q's values in one of common/quant/interleaved.h's layouts, where it has one: the GGUF block
// types as they are; int8 (tensor, rows, LLM.int8()) as int8 rows; int4 as its groups. fp8 has
// none (no integer product: its values are not multiples of one step within a block).
std::optional<Layout> layout_for(const QMatrix& q) {
  switch (q.spec.format) {
    case Format::Int8Tensor:
    case Format::Int8Row:
    case Format::LlmInt8: return Layout::int8_rows();
    case Format::Int4Sym:
    case Format::Int4Asym: return Layout::int4_groups(q.spec.group, q.spec.format == Format::Int4Asym);
    case Format::Fp8E4M3: return std::nullopt;
    default: return Layout::blocks(gguf_type(q.spec.format));
  }
}

// An int4 group in the row order interleaved.h reads: its scale, its zero point, its G/2 bytes.
std::int64_t int4_block_bytes(const QuantSpec& s) { return (s.format == Format::Int4Asym ? 5 : 4) + s.group / 2; }

Interleaved8 interleaved(const QMatrix& q) {
  IL_CHECK(interleavable(q),
           "interleaved blocks: need a CPU q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q4_k, q5_k, q6_k, iq4_xs, int8 or int4 ",
           "matrix with rows a multiple of 8 and n_in whole blocks of 32 (and a CPU with AVX2), got ", q.spec.name(), " ",
           q.rows, " × ", q.cols, " on ", device_name(q.device()));
  const Layout l = *layout_for(q);
  const auto* bytes = static_cast<const std::uint8_t*>(q.data.raw_data());  // int8 values or packed bytes
  if (l.kind == Layout::Kind::Int8Rows) {                                   // int8_tensor: its one scale for every row
    std::vector<float> s(static_cast<std::size_t>(q.rows), q.scales.data<float>()[0]);
    if (q.spec.format != Format::Int8Tensor) std::copy_n(q.scales.data<float>(), q.rows, s.begin());
    return Interleaved8(l, q.rows, q.cols, bytes, s.data());
  }
  if (l.kind == Layout::Kind::Blocks) return Interleaved8(l, q.rows, q.cols, bytes);
  const std::int64_t G = q.spec.group, groups = q.rows * (q.cols / G), bb = int4_block_bytes(q.spec);
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(groups * bb));
  for (std::int64_t j = 0; j < groups; ++j) {  // group j of the matrix: row j / (n_in / G)
    std::uint8_t* p = blocks.data() + j * bb;
    std::memcpy(p, q.scales.data<float>() + j, 4);
    if (l.zero_points) p[4] = q.zeros.data<std::uint8_t>()[j];
    std::memcpy(p + bb - G / 2, q.data.data<std::uint8_t>() + j * (G / 2), static_cast<std::size_t>(G / 2));
  }
  return Interleaved8(l, q.rows, q.cols, blocks.data());
}

}  // namespace

bool interleavable(const QMatrix& q) {
  const auto l = layout_for(q);
  return l && q.device() == Device::CPU && interleavable(*l, q.rows, q.cols);
}

InterleavedMatrix::InterleavedMatrix(const QMatrix& q) : spec_(q.spec), layout_(interleaved(q)) {}

QMatrix InterleavedMatrix::rows_in_order() const {
  const Tensor blocks = layout_.rows_in_order();
  const std::int64_t rows = layout_.rows(), cols = layout_.cols();
  switch (layout_.layout().kind) {
    case Layout::Kind::Blocks: return QMatrix(spec_, rows, cols, blocks);
    case Layout::Kind::Int8Rows: {
      Tensor data = Tensor::empty({rows, cols}, DType::I8);
      std::memcpy(data.raw_data(), blocks.raw_data(), blocks.nbytes());
      const Tensor& s = layout_.row_scales();
      return QMatrix(spec_, rows, cols, data, spec_.format == Format::Int8Tensor ? s.slice(0, 0, 1).clone() : s.clone());
    }
    case Layout::Kind::Int4Groups: break;
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

std::shared_ptr<const PackedMatrix> InterleavedMatrix::to_device(Device d) const {
  if (d == Device::CPU) return std::make_shared<InterleavedMatrix>(*this);
  return std::make_shared<QMatrix>(rows_in_order().to(d));
}

void InterleavedMatrix::matmul(const Tensor& x, Tensor& out) const {
  layout_.check_operands(x, out, spec_.name() + " (interleaved) product");
  // Every layout here multiplies x as integers (q8_0 blocks, or LLM.int8()'s rows), and casting
  // NaN or Inf to an integer is undefined.
  check_finite_activations(x, spec_.name());
  if (spec_.format == Format::LlmInt8) return llm_int8_interleaved(x, layout_, spec_.threshold, out);
  layout_.matmul(blocked_activations_fast(x), out.data<float>());
}

}  // namespace inferlab::quant
