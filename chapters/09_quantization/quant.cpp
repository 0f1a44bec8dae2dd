// Chapter 09: quantise, and the products as plain loops (the formats themselves are the core's,
// common/quant/qmatrix.h).
#include "chapters/09_quantization/quant.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "chapters/09_quantization/quant_impl.h"
#include "common/error.h"
#include "common/gguf.h"
#include "common/lab.h"

namespace inferlab::ch09 {

using namespace quant;

namespace {
std::uint16_t to_half(float f) { return f32_to_f16(f); }
}  // namespace

std::uint8_t f32_to_e4m3(float f) {
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;  // saturate (E4M3FN has no infinity)
  // Values in [2^e, 2^(e+1)) are spaced 2^(e−3); below 2^-6 (subnormals) the spacing is 2^-9.
  const int e = a >= 0x1p-6f ? std::ilogb(a) : -6;
  const float step = std::ldexp(1.0f, e - 3);
  const float r = std::nearbyint(a / step) * step;  // round to nearest, ties to even
  if (r == 0) return sign;
  if (r < 0x1p-6f) return static_cast<std::uint8_t>(sign | static_cast<int>(r / 0x1p-9f));  // subnormal
  const int re = std::ilogb(r);
  const int m = static_cast<int>((r / std::ldexp(1.0f, re) - 1.0f) * 8.0f);
  return static_cast<std::uint8_t>(sign | ((re + 7) << 3) | m);
}

// Q8_0 and Q4_0 as llama.cpp's reference quantisers (and the gguf package) do them, for every
// block whose scale f16 can hold.
void quantize_q8_0_block(const float* x, std::uint8_t* out) {
  // EXERCISE 09.3 BEGIN: a llama.cpp Q8_0 block
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, id = inverse_scale(d);
  const std::uint16_t h = to_half(d);
  std::memcpy(out, &h, 2);
  for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(x[i] * id)));
  // EXERCISE 09.3 STUB
  // lab::not_done("09.3", "write the block as llama.cpp does: bytes 0-1 the f16 scale d = max |x| / 127 "
  //                       "(to_half), then the 32 values round(x / d) as int8 (multiply by inverse_scale(d))");
  // EXERCISE 09.3 END
}

void quantize_q4_0_block(const float* x, std::uint8_t* out) {
  float amax = 0, max = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];  // the first largest, with its sign
  const float d = max / -8.0f, id = inverse_scale(d);
  const std::uint16_t h = to_half(d);
  std::memcpy(out, &h, 2);
  for (int i = 0; i < 16; ++i) {
    const auto q0 = std::min<std::uint8_t>(15, static_cast<std::uint8_t>(std::trunc(x[i] * id + 8.5f)));
    const auto q1 = std::min<std::uint8_t>(15, static_cast<std::uint8_t>(std::trunc(x[i + 16] * id + 8.5f)));
    out[2 + i] = static_cast<std::uint8_t>(q0 | (q1 << 4));
  }
}

QMatrix quantize(const Tensor& w_in, const QuantSpec& spec, const std::string& what) {
  IL_CHECK(w_in.ndim() == 2, what, ": weights must be a matrix, got ", w_in.describe());
  const Tensor w = w_in.to(Device::CPU).to(DType::F32);
  const std::int64_t n_out = w.size(0), n_in = w.size(1);
  const float* W = w.data<float>();
  // A NaN or infinity would poison a whole scale (or, in fp8, become the NaN byte that the fast
  // decoder does not look for): refuse it and name it.
  for (std::int64_t i = 0; i < n_out * n_in; ++i)
    IL_CHECK(std::isfinite(W[i]), what, ": weight (", i / n_in, ", ", i % n_in, ") is ", W[i],
             "; only finite weights can be quantised");
  QMatrix q;
  q.spec = spec, q.rows = n_out, q.cols = n_in;
  switch (spec.format) {
    case Format::Int8Tensor:
    case Format::Int8Row:
    case Format::LlmInt8: {
      const bool per_row = spec.format != Format::Int8Tensor;
      q.data = Tensor::empty({n_out, n_in}, DType::I8);
      q.scales = Tensor::empty({per_row ? n_out : 1}, DType::F32);
      float amax = 0;
      for (std::int64_t i = 0; i < n_out * n_in && !per_row; ++i) amax = std::max(amax, std::fabs(W[i]));
      for (std::int64_t n = 0; n < n_out; ++n) {
        float a = amax;
        if (per_row) {
          a = 0;
          for (std::int64_t k = 0; k < n_in; ++k) a = std::max(a, std::fabs(W[n * n_in + k]));
        }
        // EXERCISE 09.1 BEGIN: absmax int8: the scale, and every weight on its grid
        const float s = scale_for(a, 127.0f);  // absmax: the largest magnitude maps to ±127
        if (per_row || n == 0) q.scales.data<float>()[per_row ? n : 0] = s;
        for (std::int64_t k = 0; k < n_in; ++k)
          q.data.data<std::int8_t>()[n * n_in + k] =
              static_cast<std::int8_t>(std::clamp(std::round(W[n * n_in + k] / s), -127.0f, 127.0f));
        // EXERCISE 09.1 STUB
        // (void)a;
        // lab::not_done("09.1", "row n's scale s (its largest magnitude a maps to 127; scale_for avoids a zero "
        //                       "scale) into q.scales, then each weight of the row as round(w / s), clamped to "
        //                       "[-127, 127], into q.data");
        // EXERCISE 09.1 END
      }
      return q;
    }
    case Format::Int4Sym:
    case Format::Int4Asym: {
      const std::int64_t G = spec.group;
      IL_CHECK(G > 0 && G % 32 == 0, what, ": int4 group size must be a positive multiple of 32, got ", G);
      IL_CHECK(n_in % G == 0, what, ": the input width n_in = ", n_in, " is not a multiple of the group size ", G);
      const bool sym = spec.format == Format::Int4Sym;
      q.data = Tensor::zeros({n_out, n_in / 2}, DType::U8);
      q.scales = Tensor::empty({n_out, n_in / G}, DType::F32);
      if (!sym) q.zeros = Tensor::empty({n_out, n_in / G}, DType::U8);
      for (std::int64_t n = 0; n < n_out; ++n)
        for (std::int64_t g = 0; g < n_in / G; ++g) {
          const float* x = W + n * n_in + g * G;
          float mn = x[0], mx = x[0], amax = 0;
          for (std::int64_t i = 0; i < G; ++i)
            mn = std::min(mn, x[i]), mx = std::max(mx, x[i]), amax = std::max(amax, std::fabs(x[i]));
          // The range always holds 0, so that z = round(−min/s) lies in [0, 15]: a group of
          // one sign would otherwise get a clamped zero point and collapse to one value.
          mn = std::min(mn, 0.0f), mx = std::max(mx, 0.0f);
          float s, z = 0;
          if (sym) {
            s = scale_for(amax, 7.0f);  // q ∈ [−7, 7] ⊂ [−8, 7]
          } else {
            s = scale_for(mx - mn, 15.0f);
            IL_CHECK(std::isfinite(s), what, ": row ", n, ", group ", g, " spans [", mn, ", ", mx,
                     "], wider than a float scale can hold");
            z = std::clamp(std::round(-mn / s), 0.0f, 15.0f);
            q.zeros.data<std::uint8_t>()[n * (n_in / G) + g] = static_cast<std::uint8_t>(z);
          }
          q.scales.data<float>()[n * (n_in / G) + g] = s;
          // Element i of the group goes to byte i mod G/2: the low nibble for the first half of the
          // group, the high nibble for the second (Q4_0's order: unpacking needs no shuffles).
          for (std::int64_t i = 0; i < G; ++i) {
            const float v = sym ? std::clamp(std::round(x[i] / s), -8.0f, 7.0f) + 8.0f
                                : std::clamp(std::round(x[i] / s) + z, 0.0f, 15.0f);
            const std::int64_t byte = n * (n_in / 2) + g * (G / 2) + i % (G / 2);
            q.data.data<std::uint8_t>()[byte] |= static_cast<std::uint8_t>(static_cast<int>(v) << (i < G / 2 ? 0 : 4));
          }
        }
      return q;
    }
    case Format::Q8_0:
    case Format::Q4_0: {
      IL_CHECK(n_in % 32 == 0, what, ": ", spec.name(), " needs the input width n_in to be a multiple of 32, got ", n_in);
      const std::int64_t bb = block_bytes(spec.format), row = n_in / 32 * bb;
      q.data = Tensor::empty({n_out, row}, DType::U8);
      for (std::int64_t n = 0; n < n_out; ++n)
        for (std::int64_t b = 0; b < n_in / 32; ++b) {
          std::uint8_t* out = q.data.data<std::uint8_t>() + n * row + b * bb;
          if (spec.format == Format::Q8_0) quantize_q8_0_block(W + n * n_in + b * 32, out);
          else quantize_q4_0_block(W + n * n_in + b * 32, out);
        }
      check_block_scales(q.data, spec.format, what);  // an f16 scale overflows above 65504
      return q;
    }
    case Format::Q2_K:
    case Format::Q3_K:
    case Format::Q4_K:
    case Format::Q5_K:
    case Format::Q6_K:
    case Format::Q4_1:
    case Format::Q5_0:
    case Format::Q5_1:
    case Format::IQ4_NL:
    case Format::IQ4_XS: fail(what, ": ", spec.name(), " is read from GGUF files, not produced here");
    case Format::F32:
    case Format::F16:
    case Format::BF16: fail(what, ": ", spec.name(), " is a float type, not a quantised format");
    case Format::Fp8E4M3: {
      float amax = 0;
      for (std::int64_t i = 0; i < n_out * n_in; ++i) amax = std::max(amax, std::fabs(W[i]));
      const float s = scale_for(amax, 448.0f);
      q.data = Tensor::empty({n_out, n_in}, DType::U8);
      q.scales = Tensor::from_vector(std::vector<float>{s}, {1});
      for (std::int64_t i = 0; i < n_out * n_in; ++i) q.data.data<std::uint8_t>()[i] = f32_to_e4m3(W[i] / s);
      return q;
    }
  }
  fail("quantize: unknown format");
}

BlockedActivations q8_0_blocks(const Tensor& x) {
  BlockedActivations a(x.size(0), x.size(1));
  std::uint8_t blk[34];
  for (std::int64_t b = 0; b < a.rows * a.cols / 32; ++b) {
    quantize_q8_0_block(x.data<float>() + 32 * b, blk);
    a.d[static_cast<std::size_t>(b)] = from_half(blk);
    std::memcpy(a.q.data() + 32 * b, blk + 2, 32);
    a.sum_block(b);
  }
  return a;
}

Tensor q8_0_activations(const Tensor& x_in) {
  IL_CHECK(x_in.ndim() == 2, "q8_0_activations: x must be a matrix, got ", x_in.describe());
  const Tensor x = x_in.to(Device::CPU).to(DType::F32).contiguous();
  const BlockedActivations a = q8_0_blocks(x);
  Tensor out = Tensor::empty({a.rows, a.cols}, DType::F32);
  for (std::int64_t m = 0; m < a.rows; ++m)
    for (std::int64_t k = 0; k < a.cols; ++k) out.data<float>()[m * a.cols + k] = a.value(m, k);
  return out;
}

void qmatmul_ref(const Tensor& x, const QMatrix& w, Tensor& out) {
  check_product(x, w, out);
  IL_CHECK(!x.is_cuda(), "qmatmul_ref runs on the CPU only");
  const std::int64_t M = x.size(0), n_in = x.size(1), n_out = w.rows;
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  if (w.spec.format == Format::LlmInt8) {
    // y = s_x[m]·s_w[n]·Σ_{k ∉ O} xq·wq (int32)  +  Σ_{k ∈ O} f16(x)·f16(w)   (Dettmers et al. 2022, eq. 3)
    const auto O = outlier_columns(x, w.spec.threshold);
    std::vector<std::int8_t> xq;
    std::vector<float> sx;
    quantize_rows_int8(x, O, xq, sx);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < n_out; ++n) {
        std::int32_t acc = 0;
        float hi = 0.0f;
        for (std::int64_t k = 0; k < n_in; ++k) {
          if (O[static_cast<std::size_t>(k)])
            hi += f16_to_f32(f32_to_f16(X[m * n_in + k])) * f16_to_f32(f32_to_f16(weight_value(w, n, k)));
          else
            acc += static_cast<std::int32_t>(xq[static_cast<std::size_t>(m * n_in + k)]) *
                   w.data.data<std::int8_t>()[n * n_in + k];
        }
        Y[m * n_out + n] = static_cast<float>(acc) * sx[static_cast<std::size_t>(m)] * w.scales.data<float>()[n] + hi;
      }
    return;
  }
  if (w.spec.format == Format::Q8_0) {
    // llama.cpp: x quantised to q8_0 blocks too; per block an int32 sum, scaled by d_w·d_x.
    std::vector<std::uint8_t> xq(static_cast<std::size_t>(n_in / 32 * 34));
    for (std::int64_t m = 0; m < M; ++m) {
      for (std::int64_t b = 0; b < n_in / 32; ++b) quantize_q8_0_block(X + m * n_in + b * 32, xq.data() + b * 34);
      for (std::int64_t n = 0; n < n_out; ++n) {
        float y = 0.0f;
        for (std::int64_t b = 0; b < n_in / 32; ++b) {
          const std::uint8_t* wb = w.data.data<std::uint8_t>() + n * (n_in / 32 * 34) + b * 34;
          const std::uint8_t* xb = xq.data() + b * 34;
          std::int32_t sumi = 0;
          for (int i = 0; i < 32; ++i) sumi += static_cast<std::int8_t>(wb[2 + i]) * static_cast<std::int8_t>(xb[2 + i]);
          y += static_cast<float>(sumi) * (from_half(wb) * from_half(xb));
        }
        Y[m * n_out + n] = y;
      }
    }
    return;
  }
  // q4_0 and the other GGUF block formats: y = Σ_k x̂_k · w(n, k), x̂ = x rounded through q8_0 blocks. The fast path
  // sums the same products in int32 per block, so only the float rounding differs.
  if (blocks_activations(w.spec.format)) {
    const BlockedActivations a = q8_0_blocks(x);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < n_out; ++n) {
        float y = 0.0f;
        for (std::int64_t k = 0; k < n_in; ++k) y += a.value(m, k) * weight_value(w, n, k);
        Y[m * n_out + n] = y;
      }
    return;
  }
  // Weight-only formats: y = Σ_k x_k · w(n, k), x in f32.
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < n_out; ++n) {
      float y = 0.0f;
      for (std::int64_t k = 0; k < n_in; ++k) y += X[m * n_in + k] * weight_value(w, n, k);
      Y[m * n_out + n] = y;
    }
}

Linear quantize(const Linear& w, const QuantSpec& spec, const std::string& what) {
  IL_CHECK(!w.packed, what, ": the matrix is already packed (", w.packed ? w.packed->format() : "", ")");
  return Linear(std::make_shared<QMatrix>(quantize(w.weight, spec, what)), w.bias);
}

}  // namespace inferlab::ch09
