#pragma once
// The values of llama.cpp's block types on the GPU, eight weights at a time: the device side of
// blocks.h, for the CUDA products that multiply them with x rounded through q8_0 blocks (chapter
// 09's quant_cuda.cu). Each decodes as gguf::dequantize_block does. Include it in one .cu file:
// it defines the levels of iq4_nl and iq4_xs in constant memory.
#include <cuda_fp16.h>

#include <cstdint>

#include "common/gguf.h"

namespace inferlab::quant {

// iq4_nl's and iq4_xs's levels (gguf::kIq4nlValues), in constant memory.
__constant__ std::int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The f16 at p, as a float.
__device__ inline float half_at(const std::uint8_t* p) {
  __half h;
  memcpy(&h, p, 2);
  return __half2float(h);
}

// The 8 weights of row n starting at column k (k a multiple of 8) of a K-wide matrix of type T
// whose rows of blocks start at `data`, as floats.
template <gguf::Type T>
__device__ inline void block_values8(const std::uint8_t* data, long long n, int K, int k, float* w) {
  using Type = gguf::Type;
  if constexpr (T == Type::Q4_1 || T == Type::Q5_0 || T == Type::Q5_1) {
    // 8 weights of one block of 32: nibbles as q4_0, the fifth bit from qh (the ref:: decoder in common/gguf.cpp).
    constexpr bool kMin = T != Type::Q5_0, kFive = T != Type::Q4_1;
    constexpr int kBytes = 18 + (kMin ? 2 : 0) + (kFive ? 4 : 0), kQh = kMin ? 4 : 2, kQs = kQh + (kFive ? 4 : 0);
    const std::uint8_t* b = data + n * (K / 32 * kBytes) + (k / 32) * kBytes;
    const float d = half_at(b), m = kMin ? half_at(b + 2) : 0.0f;
    const int o = k % 32;
    unsigned qh = 0;
    if (kFive) memcpy(&qh, b + kQh, 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int q = o < 16 ? (b[kQs + o + j] & 15) : (b[kQs + o - 16 + j] >> 4);
      if (kFive) q |= static_cast<int>((qh >> (o + j)) & 1) << 4;
      w[j] = kMin ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
    }
  } else if constexpr (T == Type::Q4_K || T == Type::Q5_K) {
    // 8 weights of one 32-value sub-block: one 6-bit scale and min (the ref:: decoder in common/gguf.cpp);
    // q5_k's fifth bit of sub-block s is bit s of qh[l].
    constexpr bool kFive = T == Type::Q5_K;
    constexpr int kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
    const std::uint8_t* b = data + n * (K / 256 * kBytes) + (k / 256) * kBytes;
    const int i = k % 256, j = i / 64, l = i % 32, high = (i % 64) / 32, sub = 2 * j + high;
    const std::uint8_t* q = b + 4;
    const int sc = sub < 4 ? q[sub] & 63 : (q[sub + 4] & 0xF) | ((q[sub - 4] >> 6) << 4);
    const int mn = sub < 4 ? q[sub + 4] & 63 : (q[sub + 4] >> 4) | ((q[sub] >> 6) << 4);
    const float d = half_at(b) * static_cast<float>(sc), m = half_at(b + 2) * static_cast<float>(mn);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      int qv = (b[kQs + 32 * j + l + t] >> (4 * high)) & 15;
      if (kFive) qv |= ((b[16 + l + t] >> sub) & 1) << 4;
      w[t] = d * static_cast<float>(qv) - m;
    }
  } else if constexpr (T == Type::Q6_K) {
    // 8 weights of one 16-value scale group of one quarter (the ref:: decoder in common/gguf.cpp).
    const std::uint8_t* b = data + n * (K / 256 * 210) + (k / 256) * 210;
    const int i = k % 256, half = i / 128, r = (i % 128) / 32, l = i % 32;
    const std::uint8_t *ql = b + 64 * half + 32 * (r % 2), *qh = b + 128 + 32 * half;
    const float d =
        half_at(b + 208) * static_cast<float>(reinterpret_cast<const std::int8_t*>(b + 192 + 8 * half)[l / 16 + 2 * r]);
#pragma unroll
    for (int t = 0; t < 8; ++t)
      w[t] = d * static_cast<float>((((ql[l + t] >> (4 * (r / 2))) & 15) | (((qh[l + t] >> (2 * r)) & 3) << 4)) - 32);
  } else if constexpr (T == Type::Q2_K || T == Type::Q3_K) {
    // 8 weights of one 16-value group of quarter j of half h (the ref:: decoder in common/gguf.cpp).
    constexpr bool kTwo = T == Type::Q2_K;
    constexpr int kBytes = kTwo ? 84 : 110, kQs = kTwo ? 16 : 32;
    const std::uint8_t* b = data + n * (K / 256 * kBytes) + (k / 256) * kBytes;
    const int i = k % 256, h = i / 128, j = (i % 128) / 32, l = i % 32, g = i / 16;
    float d, m = 0.0f;
    if (kTwo) {
      d = half_at(b + 80) * static_cast<float>(b[g] & 15), m = half_at(b + 82) * static_cast<float>(b[g] >> 4);
    } else {
      const int low = g < 8 ? b[96 + g] & 15 : b[96 + g - 8] >> 4, high = (b[104 + g % 4] >> (2 * (g / 4))) & 3;
      d = half_at(b + 108) * static_cast<float>((low | (high << 4)) - 32);
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int q = (b[kQs + 32 * h + l + t] >> (2 * j)) & 3;
      w[t] = kTwo ? d * static_cast<float>(q) - m : d * static_cast<float>(q - (((b[l + t] >> (4 * h + j)) & 1) ? 0 : 4));
    }
  } else if constexpr (T == Type::IQ4_NL || T == Type::IQ4_XS) {
    // 8 weights of one 32-value block (iq4_nl) or sub-block (iq4_xs), nibbles as q4_0; each
    // indexes the table of levels (the ref:: decoder in common/gguf.cpp).
    constexpr bool kXs = T == Type::IQ4_XS;
    constexpr int kBytes = kXs ? 136 : 18, kValues = kXs ? 256 : 32;
    const std::uint8_t* b = data + n * (K / kValues * kBytes) + (k / kValues) * kBytes;
    const int i = k % kValues, j = i / 32, o = i % 32;
    const std::uint8_t* qs = b + (kXs ? 8 + 16 * j : 2);
    float d = half_at(b);
    if (kXs) {
      const int high = ((b[2] | (b[3] << 8)) >> (2 * j)) & 3, low = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
      d *= static_cast<float>((low | (high << 4)) - 32);
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int q = o < 16 ? (qs[o + t] & 15) : (qs[o - 16 + t] >> 4);
      w[t] = d * static_cast<float>(kIq4nl[q]);
    }
  }
}

}  // namespace inferlab::quant
