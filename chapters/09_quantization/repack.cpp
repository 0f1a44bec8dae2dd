#include "chapters/09_quantization/repack.h"

#include <omp.h>

#include <cstring>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFERLAB_REPACK_SIMD 1
#endif

#include "chapters/09_quantization/quant_impl.h"
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
#else
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
  return (q.spec.format == Format::Q4_0 || q.spec.format == Format::Q8_0) && q.device() == Device::CPU && q.rows % 8 == 0 &&
         q.cols % 32 == 0;
}

Interleaved8::Interleaved8(const QMatrix& q) : spec_(q.spec), rows_(q.rows), cols_(q.cols) {
  IL_CHECK(interleavable(q), "interleaved blocks: need a CPU q4_0 or q8_0 matrix with rows a multiple of 8, got ",
           q.spec.name(), " ", q.rows, " × ", q.cols, " on ", device_name(q.device()));
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
  const Layout l = layout_of(spec_);
  const std::int64_t M = a.rows, nb = cols_ / 32, groups = rows_ / 8, group_bytes = nb * l.unit();
  const std::uint8_t* W = data_.data<std::uint8_t>();
  float* Y = out.data<float>();
  if (M <= kDirectRows) {
    const auto dot = l.eight_bit ? group_dot<true> : group_dot<false>;
#pragma omp parallel for schedule(static) if (M * rows_ * cols_ >= kParallel)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t m = 0; m < M; ++m) {
        float y[8];
        dot(W + g * group_bytes, a.q.data() + m * cols_, a.d.data() + m * nb, a.sum.data() + m * nb, nb, y);
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
      unpack_group(l, W + g * group_bytes, nb, w.data());
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
