// Quantisation formats: quantise, dequantise, and products that read the packed weights.
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
  for (const auto& [f, type] : gguf_formats())  // the ones all_specs() does not list
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

// --- quantise / dequantise -------------------------------------------------------------------
namespace {
std::uint16_t to_half(float f) { return f32_to_f16(f); }
// Bytes and values of one block of the block formats.
std::int64_t block_values(Format f) { return gguf::block_values(gguf_type(f)); }
std::int64_t block_bytes(Format f) { return gguf::row_bytes(gguf_type(f), block_values(f)); }
}  // namespace

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

namespace {

// The scale for values of magnitude up to `range` on a grid of `steps`: range / steps, or 1 where
// that is 0 (all values 0, or so small that the division underflows). Values that small quantise
// to 0 either way, and dividing by a zero scale would give NaN, whose cast to an integer is
// undefined.
float scale_for(float range, float steps) {
  const float s = range / steps;
  return s > 0 ? s : 1.0f;
}

}  // namespace

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

QMatrix QMatrix::to(Device d) const {
  QMatrix q = *this;
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

namespace {
int g_qgemv_version = 0;  // 0 until chosen: then INFERLAB_QGEMV_VERSION, or 2
}  // namespace

void set_qgemv_version(int version) {
  IL_CHECK(version == 1 || version == 2, "set_qgemv_version: no quantised GEMV version ", version, " (there are 1 and 2)");
  g_qgemv_version = version;
}

int qgemv_version() {
  if (g_qgemv_version == 0) {
    const char* env = std::getenv("INFERLAB_QGEMV_VERSION");
    const std::string v = env ? env : "";
    IL_CHECK(v.empty() || v == "1" || v == "2", "INFERLAB_QGEMV_VERSION=", v, ": expected 1 or 2");
    g_qgemv_version = v.empty() ? 2 : v[0] - '0';
  }
  return g_qgemv_version;
}

// --- the products -----------------------------------------------------------------------------
namespace {

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

}  // namespace

void check_finite_activations(const Tensor& x, const std::string& format) {
  const float* p = x.data<float>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i)
    IL_CHECK(std::isfinite(p[i]), "qmatmul (", format, "): the activations hold ", p[i], " at row ", i / x.size(1),
             ", column ", i % x.size(1), "; the model's output overflowed before this layer");
}

// The GGUF block formats, each with the tensor type whose blocks it holds.
const std::vector<std::pair<Format, gguf::Type>>& gguf_formats() {
  static const std::vector<std::pair<Format, gguf::Type>> t = {
      {Format::Q8_0, gguf::Type::Q8_0}, {Format::Q4_0, gguf::Type::Q4_0},     {Format::Q4_1, gguf::Type::Q4_1},
      {Format::Q5_0, gguf::Type::Q5_0}, {Format::Q5_1, gguf::Type::Q5_1},     {Format::Q2_K, gguf::Type::Q2_K},
      {Format::Q3_K, gguf::Type::Q3_K}, {Format::Q4_K, gguf::Type::Q4_K},     {Format::Q5_K, gguf::Type::Q5_K},
      {Format::Q6_K, gguf::Type::Q6_K}, {Format::IQ4_NL, gguf::Type::IQ4_NL}, {Format::IQ4_XS, gguf::Type::IQ4_XS}};
  return t;
}

bool blocks_activations(Format f) {
  const auto& t = gguf_formats();
  return std::any_of(t.begin(), t.end(), [f](const auto& e) { return e.first == f; });
}

gguf::Type gguf_type(Format f) {
  for (const auto& [fmt, type] : gguf_formats())
    if (fmt == f) return type;
  fail("gguf_type: ", QuantSpec{f}.name(), " is not a GGUF block format");
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

Linear quantize(const Linear& w, const QuantSpec& spec, const std::string& what) {
  IL_CHECK(!w.packed, what, ": the matrix is already packed (", w.packed ? w.packed->format() : "", ")");
  return Linear(std::make_shared<QMatrix>(quantize(w.weight, spec, what)), w.bias);
}

}  // namespace inferlab::ch09
