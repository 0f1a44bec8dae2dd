#include "common/dtype.h"

#include <Eigen/Core>

#include "common/error.h"

namespace inferlab {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  fail("unknown dtype ", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

// Eigen's half and bfloat16 types implement the IEEE round-to-nearest-even conversions; we use
// them rather than re-deriving the bit manipulation.
std::uint16_t f32_to_bf16(float f) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f)); }
float f16_to_f32(std::uint16_t h) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(h)); }
std::uint16_t f32_to_f16(float f) { return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f)); }

double unit_roundoff(DType t) {
  switch (t) {
    case DType::F64: return 0x1p-53;
    case DType::F32: return 0x1p-24;
    case DType::F16: return 0x1p-11;
    case DType::BF16: return 0x1p-8;
    default: fail("unit_roundoff: ", dtype_name(t), " is not a floating-point type");
  }
}

}  // namespace inferlab
