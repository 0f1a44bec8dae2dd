#pragma once
/// @file format.h
/// @brief The one list of the ways a weight matrix is stored.
///
/// A GGUF file names its tensors' types by ggml's numbers, chapter 09 makes formats of its own,
/// and the CUDA product's version 2 multiplies some of either: one enum for all of them. The GGUF
/// types keep ggml's numbers (so that a file's type reads straight into it, gguf::Type is this
/// enum); chapter 09's own formats are numbered from 1000, where ggml has none.

#include <cstdint>

namespace inferlab::quant {

enum class Format : std::uint32_t {
  // ggml's tensor types that GGUF files hold and this project reads
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  // chapter 09's formats (common/quant/qmatrix.h's table)
  Int8Tensor = 1000,
  Int8Row = 1001,
  LlmInt8 = 1002,
  Int4Sym = 1003,
  Int4Asym = 1004,
  Fp8E4M3 = 1005,
};

}  // namespace inferlab::quant
