// The stored formats of weight matrices: names, values, layout on the GPU, and the product dispatch.
#include "common/quant/qmatrix.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "common/gguf.h"
#include "common/lab.h"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::quant {

// --- names -----------------------------------------------------------------------------------
std::string QuantSpec::name() const {
  switch (format) {
    case Format::Int8Tensor: return "int8_tensor";
    case Format::Int8Row: return "int8_row";
    case Format::LlmInt8: return "llm_int8";
    case Format::Int4Sym: return "int4_g" + std::to_string(group) + "_sym";
    case Format::Int4Asym: return "int4_g" + std::to_string(group) + "_asym";
    case Format::Q8_0: return "q8_0";
    case Format::Q4_0: return "q4_0";
    case Format::Fp8E4M3: return "fp8_e4m3";
    case Format::Q4_K: return "q4_k";
    case Format::Q6_K: return "q6_k";
    case Format::Q4_1: return "q4_1";
    case Format::Q5_0: return "q5_0";
    case Format::Q5_1: return "q5_1";
    case Format::Q5_K: return "q5_k";
    case Format::Q2_K: return "q2_k";
    case Format::Q3_K: return "q3_k";
    case Format::IQ4_NL: return "iq4_nl";
    case Format::IQ4_XS: return "iq4_xs";
    case Format::F32: return "f32";
    case Format::F16: return "f16";
    case Format::BF16: return "bf16";
  }
  return "?";
}

QuantSpec QuantSpec::parse(const std::string& n) {
  for (const QuantSpec& s : all_specs())
    if (s.name() == n) return s;
  for (int g : {32, 64, 128})
    for (Format f : {Format::Int4Sym, Format::Int4Asym}) {
      QuantSpec s{f, g};
      if (s.name() == n) return s;
    }
  for (Format f : gguf_block_formats())  // the ones all_specs() does not list
    IL_CHECK(n != QuantSpec{f}.name(), "quantisation format '", n,
             "' is read from GGUF files (llama.cpp's quantiser "
             "makes it), not produced here");
  std::string names;
  for (const QuantSpec& s : all_specs()) names += (names.empty() ? "" : ", ") + s.name();
  fail("unknown quantisation format '", n, "' (known: ", names, ", and int4_g{32,64,128}_{sym,asym})");
}

std::vector<QuantSpec> all_specs() {
  return {{Format::Int8Tensor},   {Format::Int8Row},       {Format::LlmInt8},      {Format::Q8_0},
          {Format::Fp8E4M3},      {Format::Int4Sym, 32},   {Format::Int4Sym, 128}, {Format::Int4Asym, 32},
          {Format::Int4Asym, 64}, {Format::Int4Asym, 128}, {Format::Q4_0}};
}

// --- fp8 E4M3FN ------------------------------------------------------------------------------
float e4m3_to_f32(std::uint8_t b) {
  // EXERCISE 09.2 BEGIN: decoding an fp8 E4M3FN byte
  const int e = (b >> 3) & 15, m = b & 7;
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // subnormals: m · 2^-9
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  // EXERCISE 09.2 STUB
  // lab::not_done("09.2", "return the value of byte b: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; "
  //                       "exponent 0 holds the subnormals, and only S.1111.111 is NaN (no infinities)");
  // EXERCISE 09.2 END
}

// --- quantise / dequantise -------------------------------------------------------------------
std::int64_t block_values(Format f) { return gguf::block_values(gguf_type(f)); }
std::int64_t block_bytes(Format f) { return gguf::row_bytes(gguf_type(f), block_values(f)); }

std::vector<int> half_offsets(Format f) {
  switch (f) {
    case Format::Q4_1:
    case Format::Q5_1:
    case Format::Q4_K:
    case Format::Q5_K: return {0, 2};
    case Format::Q6_K: return {208};
    case Format::Q2_K: return {80, 82};
    case Format::Q3_K: return {108};
    default: return {0};
  }
}

float from_half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The scale for values of magnitude up to `range` on a grid of `steps`: range / steps, or 1 where
// that is 0 (all values 0, or so small that the division underflows). Values that small quantise
// to 0 either way, and dividing by a zero scale would give NaN, whose cast to an integer is
// undefined.
float scale_for(float range, float steps) {
  const float s = range / steps;
  return s > 0 ? s : 1.0f;
}

void check_block_scales(const Tensor& blocks, Format format, const std::string& what) {
  const std::int64_t bb = block_bytes(format), bv = block_values(format), rows = blocks.size(0),
                     per_row = blocks.size(1) / bb;
  const Tensor h = blocks.to(Device::CPU).contiguous();
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t b = 0; b < per_row; ++b)
      for (const int at : half_offsets(format)) {
        const float d = from_half(h.data<std::uint8_t>() + n * blocks.size(1) + b * bb + at);
        IL_CHECK(std::isfinite(d), what, ": row ", n, ", block ", b, " (weights ", b * bv, "..", b * bv + bv - 1,
                 ") has scale ", d,
                 format == Format::Q8_0   ? " (max |w| / 127 as f16, whose largest value is 65504)"
                 : format == Format::Q4_0 ? " (max |w| / 8 as f16, whose largest value is 65504)"
                                          : " (an f16 that is not a number: the file is damaged)");
      }
}

// The value of weight (n, k), as the format defines it. The reference product and
// dequantize() both use it.
float weight_value(const QMatrix& q, std::int64_t n, std::int64_t k) {
  const std::int64_t n_in = q.cols;
  switch (q.spec.format) {
    case Format::Int8Tensor: return q.data.data<std::int8_t>()[n * n_in + k] * q.scales.data<float>()[0];
    case Format::Int8Row:
    case Format::LlmInt8: return q.data.data<std::int8_t>()[n * n_in + k] * q.scales.data<float>()[n];
    case Format::Int4Sym:
    case Format::Int4Asym: {
      const std::int64_t G = q.spec.group, g = n * (n_in / G) + k / G, i = k % G;
      const int v =
          (q.data.data<std::uint8_t>()[n * (n_in / 2) + (k / G) * (G / 2) + i % (G / 2)] >> (i < G / 2 ? 0 : 4)) & 15;
      const int z = q.spec.format == Format::Int4Sym ? 8 : q.zeros.data<std::uint8_t>()[g];
      return static_cast<float>(v - z) * q.scales.data<float>()[g];
    }
    case Format::Q8_0: {
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 32 * 34) + (k / 32) * 34;
      return from_half(b) * static_cast<float>(static_cast<std::int8_t>(b[2 + k % 32]));
    }
    case Format::Q4_0: {
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 32 * 18) + (k / 32) * 18;
      const int j = static_cast<int>(k % 32);
      const int v = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
      return from_half(b) * static_cast<float>(v - 8);
    }
    case Format::Fp8E4M3: return e4m3_to_f32(q.data.data<std::uint8_t>()[n * n_in + k]) * q.scales.data<float>()[0];
    case Format::Q4_K: {
      // Super-block of 256: 64-value pair j holds sub-block 2j in its 32 bytes' low nibbles and
      // 2j + 1 in their high ones; each sub-block has its 6-bit scale and min.
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 256 * 144) + (k / 256) * 144;
      const int i = static_cast<int>(k % 256), j = i / 64, l = i % 32, high = (i % 64) / 32;
      std::uint8_t sc, m;
      gguf::scale_min_k4(2 * j + high, b + 4, sc, m);
      const int v = (b[16 + 32 * j + l] >> (4 * high)) & 15;
      return from_half(b) * static_cast<float>(sc) * static_cast<float>(v) - from_half(b + 2) * static_cast<float>(m);
    }
    case Format::Q6_K: {
      // Super-block of 256 in two halves of 128; quarter r of a half takes the low (r = 0, 1) or
      // high (r = 2, 3) nibbles of ql[l] (r even) or ql[l + 32] (r odd), and bits 2r, 2r + 1 of qh[l].
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 256 * 210) + (k / 256) * 210;
      const int i = static_cast<int>(k % 256), half = i / 128, r = (i % 128) / 32, l = i % 32;
      const std::uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * half);
      const int v = (((ql[l + 32 * (r % 2)] >> (4 * (r / 2))) & 15) | (((qh[l] >> (2 * r)) & 3) << 4)) - 32;
      return from_half(b + 208) * static_cast<float>(sc[l / 16 + 2 * r]) * static_cast<float>(v);
    }
    case Format::Q4_1:
    case Format::Q5_0:
    case Format::Q5_1: {
      // Blocks of 32: element j < 16 in the low nibble of qs[j], j ≥ 16 in the high nibble of
      // qs[j − 16] (q4_0's order); q5_x add bit j of the 32-bit qh as the fifth bit.
      const std::int64_t bb = block_bytes(q.spec.format);
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 32 * bb) + (k / 32) * bb;
      const int j = static_cast<int>(k % 32);
      const bool has_min = q.spec.format != Format::Q5_0, five = q.spec.format != Format::Q4_1;
      const std::uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
      int v = (qs[j % 16] >> (j < 16 ? 0 : 4)) & 15;
      if (five) {
        std::uint32_t qh;
        std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
        v |= static_cast<int>((qh >> j) & 1) << 4;
      }
      if (!has_min) return from_half(b) * static_cast<float>(v - 16);
      return from_half(b) * static_cast<float>(v) + from_half(b + 2);
    }
    case Format::Q5_K: {
      // As q4_k, with qh[l] (32 bytes after the scales) giving sub-block s its fifth bit in bit s.
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 256 * 176) + (k / 256) * 176;
      const int i = static_cast<int>(k % 256), j = i / 64, l = i % 32, high = (i % 64) / 32, sub = 2 * j + high;
      std::uint8_t sc, m;
      gguf::scale_min_k4(sub, b + 4, sc, m);
      const int v = ((b[48 + 32 * j + l] >> (4 * high)) & 15) | (((b[16 + l] >> sub) & 1) << 4);
      return from_half(b) * static_cast<float>(sc) * static_cast<float>(v) - from_half(b + 2) * static_cast<float>(m);
    }
    case Format::Q2_K:
    case Format::Q3_K: {
      // Super-block of 256 in two halves of 128; quarter j of half h is bits 2j, 2j + 1 of the
      // half's 32 bytes qs[l], in two sub-blocks of 16 with a scale each. q2_k: scale byte i/16
      // holds sc (low nibble) and m; q3_k: bit 4h + j of hmask[l] set means q, clear q − 4.
      const bool two = q.spec.format == Format::Q2_K;
      const std::int64_t bb = two ? 84 : 110;
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / 256 * bb) + (k / 256) * bb;
      const int i = static_cast<int>(k % 256), h = i / 128, j = (i % 128) / 32, l = i % 32;
      const int v = (b[(two ? 16 : 32) + 32 * h + l] >> (2 * j)) & 3;
      if (two)
        return from_half(b + 80) * static_cast<float>(b[i / 16] & 15) * static_cast<float>(v) -
               from_half(b + 82) * static_cast<float>(b[i / 16] >> 4);
      return from_half(b + 108) * static_cast<float>(gguf::scale_q3_k(i / 16, b + 96)) *
             static_cast<float>(v - (((b[l] >> (4 * h + j)) & 1) ? 0 : 4));
    }
    case Format::IQ4_NL:
    case Format::IQ4_XS: {
      // A 32-value block (iq4_nl) or sub-block (iq4_xs) in q4_0's nibble order; the nibble indexes
      // the table of levels. iq4_xs's sub-block j has the scale d·(sc_j − 32).
      const bool xs = q.spec.format == Format::IQ4_XS;
      const std::int64_t bb = xs ? 136 : 18, bv = xs ? 256 : 32;
      const std::uint8_t* b = q.data.data<std::uint8_t>() + n * (n_in / bv * bb) + (k / bv) * bb;
      const int i = static_cast<int>(k % bv), j = i / 32, l = i % 32;
      const std::uint8_t* qs = b + (xs ? 8 + 16 * j : 2);
      const float d = xs ? from_half(b) * static_cast<float>(gguf::scale_iq4_xs(j, b)) : from_half(b);
      return d * static_cast<float>(gguf::kIq4nlValues[(qs[l % 16] >> (l < 16 ? 0 : 4)) & 15]);
    }
    default: break;  // a float type: not a QMatrix format
  }
  return 0;
}

Tensor dequantize(const QMatrix& q_in) {
  const QMatrix q = q_in.to(Device::CPU);
  Tensor w = Tensor::empty({q.rows, q.cols}, DType::F32);
  for (std::int64_t n = 0; n < q.rows; ++n)
    for (std::int64_t k = 0; k < q.cols; ++k) w.data<float>()[n * q.cols + k] = weight_value(q, n, k);
  return w;
}

std::int64_t QMatrix::bytes() const {
  std::int64_t b = static_cast<std::int64_t>(data.nbytes());
  if (scales.defined()) b += static_cast<std::int64_t>(scales.nbytes());
  if (zeros.defined()) b += static_cast<std::int64_t>(zeros.nbytes());
  return b;
}

QMatrix QMatrix::to(Device d, int version) const {
  IL_CHECK(version >= 0 && version <= 2, "QMatrix::to: no quantised GEMV version ", version, " (there are 1 and 2)");
  QMatrix q = *this;
  if (version != 0) q.gemv_version = version;
  if (data.device() == d) return q;
  q.data = data.to(d);
  if (scales.defined()) q.scales = scales.to(d);
  if (zeros.defined()) q.zeros = zeros.to(d);
  q.gpu_quants = q.gpu_scales = q.gpu_sub = Tensor{};
  const auto kind = qgemv_kind(spec.format);
  if (d == Device::CUDA && kind && quant::qgemv::repacked(*kind, spec.group)) {
    // Version 2's layout, made once here on the CPU (the same functions a CPU test checks).
    using namespace quant::qgemv;
    const Tensor host = data.to(Device::CPU);
    Tensor quants = Tensor::empty({rows, row_bytes(*kind, cols)}, DType::U8);
    Tensor d16 = Tensor::empty({rows, std::max<std::int64_t>(1, half_scales(*kind, cols))}, DType::F16);
    Tensor sub = Tensor::empty({rows, std::max<std::int64_t>(1, sub_scale_bytes(*kind, cols))}, DType::U8);
    repack(*kind, spec.group, static_cast<const std::uint8_t*>(host.raw_data()), rows, cols, quants.data<std::uint8_t>(),
           static_cast<std::uint16_t*>(d16.raw_data()), sub.data<std::uint8_t>());
    q.gpu_quants = quants.to(d);
    if (half_scales(*kind, cols) > 0) q.gpu_scales = d16.to(d);
    if (sub_scale_bytes(*kind, cols) > 0) q.gpu_sub = sub.to(d);
  }
  return q;
}

std::optional<quant::qgemv::Kind> qgemv_kind(Format f) {
  using quant::qgemv::Kind;
  switch (f) {
    case Format::Int8Row: return Kind::Int8Row;
    case Format::Q8_0: return Kind::Q8_0;
    case Format::Q4_0: return Kind::Q4_0;
    case Format::Int4Sym: return Kind::Int4Sym;
    case Format::Int4Asym: return Kind::Int4Asym;
    case Format::Q4_K: return Kind::Q4_K;
    default: return std::nullopt;
  }
}

bool has_qgemv_v2(const QuantSpec& spec) { return qgemv_kind(spec.format).has_value(); }

int default_qgemv_version() {
  static const int version = [] {
    const char* env = std::getenv("INFERLAB_QGEMV_VERSION");
    const std::string v = env ? env : "";
    IL_CHECK(v.empty() || v == "1" || v == "2", "INFERLAB_QGEMV_VERSION=", v, ": expected 1 or 2");
    return v.empty() ? 2 : v[0] - '0';
  }();
  return version;
}

// --- the products -----------------------------------------------------------------------------
void check_product(const Tensor& x, const QMatrix& w, const Tensor& out) {
  IL_CHECK(x.ndim() == 2 && x.dtype() == DType::F32 && x.is_contiguous(),
           "qmatmul: x must be contiguous f32 [M, n_in], got ", x.describe());
  IL_CHECK(x.size(1) == w.cols, "qmatmul: x ", x.describe(), " and a ", w.rows, " × ", w.cols,
           " weight disagree on the input width n_in");
  IL_CHECK(out.ndim() == 2 && out.size(0) == x.size(0) && out.size(1) == w.rows && out.dtype() == DType::F32 &&
               out.is_contiguous(),
           "qmatmul: out ", out.describe(), " should be contiguous f32 [", x.size(0), ", ", w.rows, "]");
  IL_CHECK(x.device() == w.device() && out.device() == x.device(), "qmatmul: x, weights and out must share a device");
  // The formats that quantise x too (llm_int8 and the q8_0-block ones) would cast a NaN or Inf to an integer, which
  // is undefined on the CPU: refuse it here, where the f32-activation formats let it reach the
  // sampler's check.
  if (x.device() == Device::CPU && (blocks_activations(w.spec.format) || w.spec.format == Format::LlmInt8))
    check_finite_activations(x, w.spec.name());
}

void check_finite_activations(const Tensor& x, const std::string& format) {
  const float* p = x.data<float>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i)
    IL_CHECK(std::isfinite(p[i]), "qmatmul (", format, "): the activations hold ", p[i], " at row ", i / x.size(1),
             ", column ", i % x.size(1), "; the model's output overflowed before this layer");
}

// The GGUF block formats: a file's tensor type is one of them, or a float type.
const std::vector<Format>& gguf_block_formats() {
  static const std::vector<Format> t = {Format::Q8_0, Format::Q4_0, Format::Q4_1,   Format::Q5_0,
                                        Format::Q5_1, Format::Q2_K, Format::Q3_K,   Format::Q4_K,
                                        Format::Q5_K, Format::Q6_K, Format::IQ4_NL, Format::IQ4_XS};
  return t;
}

bool blocks_activations(Format f) {
  const auto& t = gguf_block_formats();
  return std::find(t.begin(), t.end(), f) != t.end();
}

gguf::Type gguf_type(Format f) {
  IL_CHECK(blocks_activations(f), "gguf_type: ", QuantSpec{f}.name(), " is not a GGUF block format");
  return f;
}

// LLM.int8()'s decomposition, shared by every implementation: the outlier columns of x (any
// |x| ≥ threshold in that column), and each row's absmax scale over the other columns.
std::vector<char> outlier_columns(const Tensor& x, float threshold) {
  const std::int64_t M = x.size(0), n_in = x.size(1);
  std::vector<char> out(static_cast<std::size_t>(n_in), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < n_in; ++k)
      out[static_cast<std::size_t>(k)] |= std::fabs(x.data<float>()[m * n_in + k]) >= threshold;
  return out;
}

void quantize_rows_int8(const Tensor& x, const std::vector<char>& skip, std::vector<std::int8_t>& q, std::vector<float>& s) {
  const std::int64_t M = x.size(0), n_in = x.size(1);
  q.assign(static_cast<std::size_t>(M * n_in), 0);
  s.assign(static_cast<std::size_t>(M), 1.0f);
  for (std::int64_t m = 0; m < M; ++m) {
    const float* r = x.data<float>() + m * n_in;
    float a = 0;
    for (std::int64_t k = 0; k < n_in; ++k)
      if (!skip[static_cast<std::size_t>(k)]) a = std::max(a, std::fabs(r[k]));
    const float sc = scale_for(a, 127.0f);
    s[static_cast<std::size_t>(m)] = sc;
    for (std::int64_t k = 0; k < n_in; ++k)
      if (!skip[static_cast<std::size_t>(k)])
        q[static_cast<std::size_t>(m * n_in + k)] =
            static_cast<std::int8_t>(std::clamp(std::round(r[k] / sc), -127.0f, 127.0f));
  }
}

void qmatmul(const Tensor& x, const QMatrix& w, Tensor& out) {
  check_product(x, w, out);
  if (x.is_cuda()) return cuda_qmatmul(x, w, out);
  qmatmul_fast(x, w, out);
}

Tensor qmatmul(const Tensor& x, const QMatrix& w) {
  Tensor out = Tensor::empty({x.size(0), w.rows}, DType::F32, x.device());
  qmatmul(x, w, out);
  return out;
}

void QMatrix::matmul(const Tensor& x, Tensor& out) const { qmatmul(x, *this, out); }

}  // namespace inferlab::quant
