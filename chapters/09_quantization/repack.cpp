#include "chapters/09_quantization/repack.h"

#include <omp.h>

#include <cstring>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFERLAB_REPACK_SIMD 1
#endif

#include "chapters/09_quantization/quant_impl.h"
#include "common/gguf.h"
#include "common/ops_cpu.h"

namespace inferlab::ch09 {

namespace {

constexpr std::int64_t kParallel = 1 << 18;  // multiply-adds below which one thread is faster
constexpr std::int64_t kDirectRows = 4;      // up to this many rows of x, products straight from the bytes

// A format's block: its quant bytes per row (q4_0: 16, two values a byte; q8_0: 32), the unit of
// eight rows' blocks, and the centre taken off each quant value (q4_0: 8; q8_0's stored w + 128: 128).
struct Layout {
  bool eight_bit;
  std::int64_t quant_bytes() const { return eight_bit ? 32 : 16; }
  std::int64_t unit() const { return 8 * (2 + quant_bytes()); }
  std::int32_t centre() const { return eight_bit ? 128 : 8; }
};

// Where byte t of row i's quants sits in its unit.
constexpr std::int64_t quant_byte(std::int64_t i, std::int64_t t) { return 16 + 32 * (t / 4) + 4 * i + t % 4; }

// q4_k: a super-block of eight rows (256 values each) is one unit of 1184 bytes: the eight d, the
// eight dmin (f16), each sub-block j's eight 6-bit scales and then its eight minimums unpacked to a
// byte (at 32 + 8j + i and 96 + 8j + i), then the quants. Row i's quant byte t (ggml's order: byte
// 32c + l holds value l of sub-block 2c in its low nibble, of sub-block 2c + 1 in its high one)
// sits in chunk c's 256 bytes in pieces of 4 as the 32-blocks' do.
constexpr std::int64_t kQ4kUnit = 1184;
constexpr std::int64_t q4k_quant_byte(std::int64_t i, std::int64_t t) { return 160 + 256 * (t / 32) + quant_byte(i, t % 32) - 16; }

// Rows 8g..8g+7 of W as floats (x rounded through q8_0 blocks multiplies them at prefill).
void unpack_group_q4k(const std::uint8_t* group, std::int64_t nsb, float* out /* [8, 256 · nsb] */) {
  for (std::int64_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* u = group + sb * kQ4kUnit;
    for (std::int64_t i = 0; i < 8; ++i) {
      const float d = from_half(u + 2 * i), dmin = from_half(u + 16 + 2 * i);
      float* row = out + i * 256 * nsb + 256 * sb;
      for (std::int64_t t = 0; t < 128; ++t) {
        const std::uint8_t q = u[q4k_quant_byte(i, t)];
        const std::int64_t j = 2 * (t / 32), l = t % 32;  // value l of sub-blocks j and j + 1
        for (const std::int64_t h : {0, 1}) {
          const float scale = d * static_cast<float>(u[32 + 8 * (j + h) + i]), minimum = dmin * static_cast<float>(u[96 + 8 * (j + h) + i]);
          row[32 * (j + h) + l] = scale * static_cast<float>(h ? q >> 4 : q & 15) - minimum;
        }
      }
    }
  }
}

// Rows 8g..8g+7 of W as floats (x rounded through q8_0 blocks multiplies them at prefill).
void unpack_group(Layout l, const std::uint8_t* group, std::int64_t nb, float* out /* [8, 32 · nb] */) {
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* u = group + b * l.unit();
    for (std::int64_t i = 0; i < 8; ++i) {
      const float d = from_half(u + 2 * i);
      float* row = out + i * 32 * nb + 32 * b;
      for (std::int64_t t = 0; t < l.quant_bytes(); ++t) {
        const std::uint8_t q = u[quant_byte(i, t)];
        if (l.eight_bit) {
          row[t] = d * static_cast<float>(q - 128);
        } else {
          row[t] = d * static_cast<float>((q & 15) - 8);
          row[t + 16] = d * static_cast<float>((q >> 4) - 8);
        }
      }
    }
  }
}

#if INFERLAB_REPACK_SIMD
// acc + the sums of four adjacent u8·i8 products per int32 lane. vpdpbusd sums in int32, exactly;
// without VNNI vpmaddubsw's int16 pairs must stay below 2^15, which q4_0's u ≤ 15 does and q8_0's
// w + 128 does not, so q8_0 multiplies |w| by x with w's sign there.
__m256i dot4_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

__m256i broadcast4(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// y[i] = Σ_b d_ib · dx_b · (Σ_k q_ik xq_k − centre · Σ_k xq_k) for the eight rows of one group.
template <bool kEightBit>
void group_dot(const std::uint8_t* group, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nb,
               float* y) {
  constexpr Layout l{kEightBit};
  const __m256i low = _mm256_set1_epi8(15);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // two chains: blocks alternate
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* u = group + b * l.unit();
    const std::int8_t* x = xq + 32 * b;
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < l.quant_bytes() / 4; ++j) {  // piece j of every row; four independent sums
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 16 + 32 * j));
      if constexpr (kEightBit) {
        if constexpr (kVnni) {
          s[j % 4] = dot4_acc(s[j % 4], v, broadcast4(x + 4 * j));
        } else {  // w·x as |w|·(x with w's sign), w = v − 128 (vpmaddubsw's pairs would overflow on v·x)
          const __m256i w = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
          s[j % 4] = dot4_acc(s[j % 4], _mm256_abs_epi8(w), _mm256_sign_epi8(broadcast4(x + 4 * j), w));
        }
      } else {
        s[j] = dot4_acc(s[j], _mm256_and_si256(v, low), broadcast4(x + 4 * j));
        s[j] = dot4_acc(s[j], _mm256_and_si256(_mm256_srli_epi16(v, 4), low), broadcast4(x + 16 + 4 * j));
      }
    }
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    if (!kEightBit || kVnni) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(l.centre() * xs[b]));  // exact
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
    acc[b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(dx[b])), acc[b & 1]);
  }
  _mm256_storeu_ps(y, _mm256_add_ps(acc[0], acc[1]));
}
// q4_k, eight rows: y[i] = Σ_sb d_i·Σ_j sc_ij·dx_j·S_ij − dmin_i·Σ_j m_ij·dx_j·Σx_j, with S_ij = Σ_k q·xq
// over sub-block j (exact, and exact times sc ≤ 63).
void group_dot_q4k(const std::uint8_t* group, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nsb,
                   float* y) {
  const __m256i low = _mm256_set1_epi8(15);
  __m256 out = _mm256_setzero_ps();
  for (std::int64_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* u = group + sb * kQ4kUnit;
    __m256 acc_d = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const std::int64_t j = 8 * sb + 2 * c;  // x's block for sub-block 2c; 2c + 1 follows it
      const std::int8_t* x = xq + 32 * j;
      __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int p = 0; p < 8; ++p) {  // low nibbles: sub-block 2c, high: 2c + 1; two sums each
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 160 + 256 * c + 32 * p));
        s[p & 1] = dot4_acc(s[p & 1], _mm256_and_si256(v, low), broadcast4(x + 4 * p));
        s[2 + (p & 1)] = dot4_acc(s[2 + (p & 1)], _mm256_and_si256(_mm256_srli_epi16(v, 4), low), broadcast4(x + 32 + 4 * p));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i sum = _mm256_add_epi32(s[2 * h], s[2 * h + 1]);
        auto bytes8 = [&](std::int64_t at) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + at))); };
        const __m256i sc = bytes8(32 + 8 * (2 * c + h)), mn = bytes8(96 + 8 * (2 * c + h));
        acc_d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(sum, sc)), _mm256_set1_ps(dx[j + h]), acc_d);
        acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mn), _mm256_set1_ps(dx[j + h] * static_cast<float>(xs[j + h])), acc_m);
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 16)));
    out = _mm256_fnmadd_ps(dmin, acc_m, _mm256_fmadd_ps(d, acc_d, out));
  }
  _mm256_storeu_ps(y, out);
}
#else
void group_dot_q4k(const std::uint8_t* group, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nsb,
                   float* y) {
  for (std::int64_t i = 0; i < 8; ++i) {
    float r = 0;
    for (std::int64_t sb = 0; sb < nsb; ++sb) {
      const std::uint8_t* u = group + sb * kQ4kUnit;
      float rd = 0, rm = 0;
      for (std::int64_t j = 0; j < 8; ++j) {
        std::int32_t s = 0;
        for (std::int64_t l = 0; l < 32; ++l) {
          const std::uint8_t q = u[q4k_quant_byte(i, 32 * (j / 2) + l)];
          s += (j % 2 ? q >> 4 : q & 15) * xq[256 * sb + 32 * j + l];
        }
        rd += static_cast<float>(s * u[32 + 8 * j + i]) * dx[8 * sb + j];
        rm += static_cast<float>(u[96 + 8 * j + i]) * (dx[8 * sb + j] * static_cast<float>(xs[8 * sb + j]));
      }
      r += from_half(u + 2 * i) * rd - from_half(u + 16 + 2 * i) * rm;
    }
    y[i] = r;
  }
}

template <bool kEightBit>
void group_dot(const std::uint8_t* group, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nb,
               float* y) {
  constexpr Layout l{kEightBit};
  for (std::int64_t i = 0; i < 8; ++i) {
    float r = 0;
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::uint8_t* u = group + b * l.unit();
      std::int32_t s = 0;
      for (std::int64_t t = 0; t < l.quant_bytes(); ++t) {
        const std::uint8_t q = u[quant_byte(i, t)];
        if (kEightBit) s += q * xq[32 * b + t];
        else s += (q & 15) * xq[32 * b + t] + (q >> 4) * xq[32 * b + 16 + t];
      }
      r += static_cast<float>(s - l.centre() * xs[b]) * (from_half(u + 2 * i) * dx[b]);
    }
    y[i] = r;
  }
}
#endif

Layout layout_of(const QuantSpec& s) { return Layout{s.format == Format::Q8_0}; }

}  // namespace

bool interleavable(const QMatrix& q) {
  const Format f = q.spec.format;
  return (f == Format::Q4_0 || f == Format::Q8_0 || f == Format::Q4_K) && q.device() == Device::CPU && q.rows % 8 == 0 &&
         q.cols % (f == Format::Q4_K ? 256 : 32) == 0;
}

Interleaved8::Interleaved8(const QMatrix& q) : spec_(q.spec), rows_(q.rows), cols_(q.cols) {
  IL_CHECK(interleavable(q), "interleaved blocks: need a CPU q4_0, q8_0 or q4_k matrix with rows a multiple of 8, got ",
           q.spec.name(), " ", q.rows, " × ", q.cols, " on ", device_name(q.device()));
  if (spec_.format == Format::Q4_K) {
    const std::int64_t nsb = cols_ / 256;
    data_ = Tensor::empty({rows_ / 8 * nsb * kQ4kUnit}, DType::U8);
    for (std::int64_t g = 0; g < rows_ / 8; ++g)
      for (std::int64_t sb = 0; sb < nsb; ++sb) {
        std::uint8_t* u = data_.data<std::uint8_t>() + (g * nsb + sb) * kQ4kUnit;
        for (std::int64_t i = 0; i < 8; ++i) {
          const std::uint8_t* blk = q.data.data<std::uint8_t>() + ((8 * g + i) * nsb + sb) * 144;  // d, dmin, scales[12], qs[128]
          std::memcpy(u + 2 * i, blk, 2);
          std::memcpy(u + 16 + 2 * i, blk + 2, 2);
          for (int j = 0; j < 8; ++j) gguf::scale_min_k4(j, blk + 4, u[32 + 8 * j + i], u[96 + 8 * j + i]);
          for (std::int64_t t = 0; t < 128; ++t) u[q4k_quant_byte(i, t)] = blk[16 + t];
        }
      }
    return;
  }
  const Layout l = layout_of(spec_);
  const std::int64_t nb = cols_ / 32, block = 2 + l.quant_bytes();
  const std::uint8_t offset = l.eight_bit ? 0x80 : 0;  // q8_0's int8 w stored as w + 128
  data_ = Tensor::empty({rows_ / 8 * nb * l.unit()}, DType::U8);
  const std::uint8_t* src = q.data.data<std::uint8_t>();
  std::uint8_t* dst = data_.data<std::uint8_t>();
  for (std::int64_t g = 0; g < rows_ / 8; ++g)
    for (std::int64_t b = 0; b < nb; ++b) {
      std::uint8_t* u = dst + (g * nb + b) * l.unit();
      for (std::int64_t i = 0; i < 8; ++i) {
        const std::uint8_t* blk = src + ((8 * g + i) * nb + b) * block;  // the f16 d, then the quant bytes
        std::memcpy(u + 2 * i, blk, 2);
        for (std::int64_t t = 0; t < l.quant_bytes(); ++t) u[quant_byte(i, t)] = blk[2 + t] ^ offset;
      }
    }
}

QMatrix Interleaved8::rows_in_order() const {
  if (spec_.format == Format::Q4_K) {
    const std::int64_t nsb = cols_ / 256;
    Tensor bytes = Tensor::empty({rows_ * nsb * 144}, DType::U8);
    for (std::int64_t g = 0; g < rows_ / 8; ++g)
      for (std::int64_t sb = 0; sb < nsb; ++sb) {
        const std::uint8_t* u = data_.data<std::uint8_t>() + (g * nsb + sb) * kQ4kUnit;
        for (std::int64_t i = 0; i < 8; ++i) {
          std::uint8_t* blk = bytes.data<std::uint8_t>() + ((8 * g + i) * nsb + sb) * 144;
          std::memcpy(blk, u + 2 * i, 2);
          std::memcpy(blk + 2, u + 16 + 2 * i, 2);
          std::uint8_t* sc = blk + 4;  // scale_min_k4's packing undone: 6-bit values, j ≥ 4 split over three bytes
          for (int j = 0; j < 4; ++j) {
            const std::uint8_t s0 = u[32 + 8 * j + i], m0 = u[96 + 8 * j + i], s1 = u[32 + 8 * (j + 4) + i], m1 = u[96 + 8 * (j + 4) + i];
            sc[j] = static_cast<std::uint8_t>(s0 | (s1 >> 4) << 6);
            sc[j + 4] = static_cast<std::uint8_t>(m0 | (m1 >> 4) << 6);
            sc[j + 8] = static_cast<std::uint8_t>((s1 & 15) | (m1 & 15) << 4);
          }
          for (std::int64_t t = 0; t < 128; ++t) blk[16 + t] = u[q4k_quant_byte(i, t)];
        }
      }
    return QMatrix(spec_, rows_, cols_, bytes);
  }
  const Layout l = layout_of(spec_);
  const std::int64_t nb = cols_ / 32, block = 2 + l.quant_bytes();
  const std::uint8_t offset = l.eight_bit ? 0x80 : 0;
  Tensor bytes = Tensor::empty({rows_ * nb * block}, DType::U8);
  const std::uint8_t* src = data_.data<std::uint8_t>();
  std::uint8_t* dst = bytes.data<std::uint8_t>();
  for (std::int64_t g = 0; g < rows_ / 8; ++g)
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::uint8_t* u = src + (g * nb + b) * l.unit();
      for (std::int64_t i = 0; i < 8; ++i) {
        std::uint8_t* blk = dst + ((8 * g + i) * nb + b) * block;
        std::memcpy(blk, u + 2 * i, 2);
        for (std::int64_t t = 0; t < l.quant_bytes(); ++t) blk[2 + t] = u[quant_byte(i, t)] ^ offset;
      }
    }
  return QMatrix(spec_, rows_, cols_, bytes);
}

std::shared_ptr<const PackedMatrix> Interleaved8::to_device(Device d) const {
  if (d == Device::CPU) return std::make_shared<Interleaved8>(*this);
  return std::make_shared<QMatrix>(rows_in_order().to(d));
}

void Interleaved8::matmul(const Tensor& x, Tensor& out) const {
  const std::string what = spec_.name() + " (interleaved) product";
  IL_CHECK(x.ndim() == 2 && x.dtype() == DType::F32 && x.is_contiguous() && x.device() == Device::CPU && x.size(1) == cols_,
           what, ": x must be contiguous f32 [M, ", cols_, "] on the CPU, got ", x.describe());
  IL_CHECK(out.ndim() == 2 && out.size(0) == x.size(0) && out.size(1) == rows_ && out.dtype() == DType::F32 &&
               out.is_contiguous() && out.device() == Device::CPU,
           what, ": out ", out.describe(), " should be contiguous f32 [", x.size(0), ", ", rows_, "]");
  check_finite_activations(x, spec_.name());
  const BlockedActivations a = blocked_activations_fast(x);
  const bool k4 = spec_.format == Format::Q4_K;
  const Layout l = layout_of(spec_);
  const std::int64_t M = a.rows, nb = cols_ / 32, groups = rows_ / 8;
  const std::int64_t group_bytes = k4 ? cols_ / 256 * kQ4kUnit : nb * l.unit(), units = k4 ? cols_ / 256 : nb;
  const std::uint8_t* W = data_.data<std::uint8_t>();
  float* Y = out.data<float>();
  if (M <= kDirectRows) {
    const auto dot = k4 ? group_dot_q4k : l.eight_bit ? group_dot<true> : group_dot<false>;
#pragma omp parallel for schedule(static) if (M * rows_ * cols_ >= kParallel)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t m = 0; m < M; ++m) {
        float y[8];
        dot(W + g * group_bytes, a.q.data() + m * cols_, a.d.data() + m * nb, a.sum.data() + m * nb, units, y);
        std::memcpy(Y + m * rows_ + 8 * g, y, sizeof y);
      }
    return;
  }
  std::vector<float> xh(static_cast<std::size_t>(M * cols_));  // x rounded through its blocks, as at prefill in row order
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < cols_; ++k) xh[static_cast<std::size_t>(m * cols_ + k)] = a.value(m, k);
#pragma omp parallel if (M * rows_ * cols_ >= kParallel)
  {
    std::vector<float> w(static_cast<std::size_t>(8 * cols_));
#pragma omp for schedule(static)
    for (std::int64_t g = 0; g < groups; ++g) {
      if (k4) unpack_group_q4k(W + g * group_bytes, units, w.data());
      else unpack_group(l, W + g * group_bytes, nb, w.data());
      for (std::int64_t i = 0; i < 8; ++i) cpu::dot_rows(xh.data(), M, cols_, w.data() + i * cols_, Y + 8 * g + i, rows_);
    }
  }
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
