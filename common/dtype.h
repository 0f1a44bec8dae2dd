#pragma once
/// @file dtype.h
/// @brief Element types and devices, with their sizes, names and the 16-bit float conversions.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace inferlab {

/// Element type of a Tensor. Activations are F32 throughout the core; weights may be F32, F16,
/// BF16 or I8 (quantised formats arrive in chapter 09 as their own packed types). F64 and I64
/// exist so that golden files written by Python (float64 logits, int64 token ids) load as is.
enum class DType : std::uint8_t { F32, F64, F16, BF16, I8, I32, I64, U8 };

/// Where a tensor's bytes live.
enum class Device : std::uint8_t { CPU, CUDA };

/// Bytes per element.
std::size_t dtype_size(DType t);
/// Short lower-case name: "f32", "bf16", ...
std::string_view dtype_name(DType t);
/// "cpu" or "cuda".
std::string_view device_name(Device d);
/// True for the floating-point types.
bool is_float(DType t);

/// bfloat16 is the top half of a float32: widening is exact.
inline float bf16_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
/// float32 to bfloat16, rounding to nearest even (NaN stays NaN).
std::uint16_t f32_to_bf16(float f);
/// IEEE binary16 to float32 (exact).
float f16_to_f32(std::uint16_t h);
/// float32 to IEEE binary16, rounding to nearest even; overflow gives infinity.
std::uint16_t f32_to_f16(float f);

/// Unit roundoff u = 2^-p of a floating-point type: the bound on the relative error of one
/// rounding. Tests derive their tolerances from it (f32: 2^-24, bf16: 2^-8, f16: 2^-11).
double unit_roundoff(DType t);

}  // namespace inferlab
