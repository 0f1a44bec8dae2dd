#pragma once
/// @file gguf.h
/// @brief GGUF files (llama.cpp's format): reading tensors and metadata, writing them.
///
/// Layout (version 3, little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count;
/// the metadata as (string key, u32 type, value) entries; per tensor a string name, u32 number of
/// dimensions, u64 sizes innermost first, u32 ggml type, u64 offset into the data section; padding
/// to `general.alignment` (default 32); the data section, each tensor padded to the alignment.
/// Strings are a u64 length and the bytes; arrays a u32 element type, u64 count and the elements.
/// Tensor types read and written here: F32 (0), F16 (1), Q4_0 (2), Q8_0 (8), BF16 (30); read, with
/// their ref:: decoders (dequantize_rows): Q4_1 (3), Q5_0 (6), Q5_1 (7), Q2_K (10), Q3_K (11), Q4_K (12),
/// Q5_K (13), Q6_K (14), IQ4_NL (20), IQ4_XS (23).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/quant/format.h"
#include "common/tensor.h"

namespace inferlab {

class MappedFile;

namespace gguf {

/// A tensor's stored type: ggml's number, as the one list of formats has it (common/quant/format.h).
using Type = quant::Format;

/// Values per block of a type (1 for the float types, 32 for Q4_0 … Q8_0 and IQ4_NL, 256 for the
/// k-quants and IQ4_XS).
std::int64_t block_values(Type t);

/// The values of a block type's rows, F32 [rows, cols], from their packed bytes [rows, row_bytes],
/// decoded as ggml-quants.c does (the same float operations in the same order):
/// - Q4_1: d·q + m, q a nibble; Q5_0: d·(q − 16) and Q5_1: d·q + m, q a nibble and one bit of qh;
/// - Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes, each value
///   (d·sc)·q − (dmin·m), q 4 bits (and one more from qh for Q5_K);
/// - Q6_K: 16 sub-blocks of 16 with int8 scales, (d·sc)·(q − 32), q 4 bits of ql and 2 of qh;
/// - Q2_K: 16 sub-blocks of 16, a byte each of 4-bit scale and min, (d·sc)·q − (dmin·m), q 2 bits;
/// - Q3_K: 16 sub-blocks of 16 with 6-bit scales, (d·(sc − 32))·(q − 4), q 2 bits of qs and one of
///   hmask (a set bit cancels the − 4);
/// - IQ4_NL: blocks of 32, d·kIq4nlValues[q], q a nibble (q4_0's order: an index into the table);
/// - IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (low nibbles in scales_l, top bits in the u16
///   scales_h), (d·(sc − 32))·kIq4nlValues[q], q a nibble.
/// Also Q8_0 and Q4_0. The ref:: decoders of the GGUF types (a model runs them packed, chapter 09).
Tensor dequantize_rows(Type t, const Tensor& raw, std::int64_t cols);
/// One block of a block type (block_values(t) values from row_bytes(t, block_values(t)) bytes),
/// decoded as dequantize_rows does.
void dequantize_block(Type t, const std::uint8_t* block, float* out);
/// IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl): a nibble is an index into them, so the
/// levels crowd near 0, where most weights are, instead of lying evenly spaced as Q4_0's q − 8 do.
inline constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/// IQ4_XS's 6-bit scale of sub-block j (0-7), less 32 (so in [−32, 31]): the low 4 bits in nibble
/// j mod 2 of scales_l[j / 2] (4 bytes at offset 4 of the block), the top 2 in bits 2j, 2j + 1 of
/// the u16 scales_h (offset 2).
inline int scale_iq4_xs(int j, const std::uint8_t* block) {
  const int scales_h = block[2] | (block[3] << 8);
  return (((block[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
}
/// Q4_K's and Q5_K's packed sub-block scale and min: sub-block j (0-7) of the 12 bytes `q`.
inline void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// Q3_K's sub-block scale j (0-15) from its 12 packed bytes `s`, less 32 (so in [−32, 31]): the
/// low 4 bits in a nibble of byte j mod 8 (low for j < 8), the high 2 bits in field j / 4 of
/// byte 8 + j mod 4.
inline int scale_q3_k(int j, const std::uint8_t* s) {
  const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4, high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

/// Bytes of n values of a tensor type (n a multiple of 32 for the block types); throws for a
/// negative n or one whose byte count would not fit an int64.
std::int64_t row_bytes(Type t, std::int64_t n);
/// The name of a type this reader decodes ("Q4_K"): ggml_type_name of its number.
std::string type_name(Type t);
/// The name ggml gives type number `t` in its enum ggml_type ("IQ4_NL" for 20, "IQ4_XS" for 23),
/// whether this reader decodes it or not, so that an error names a type as llama.cpp's tools do:
/// the numbers ggml retired read "Q4_2 (retired)", one past them "ggml type 99 (unknown)".
std::string ggml_type_name(std::uint32_t t);

/// A metadata value: integers, floats, booleans and strings, or arrays of them.
struct Value {
  enum class Kind : std::uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12
  } kind = Kind::U32;
  std::int64_t i = 0;        ///< integers and booleans (a u64 of 2^63 or more is an error)
  double f = 0;              ///< floats
  std::string s;             ///< strings
  Kind element = Kind::U32;  ///< arrays: the element kind
  std::vector<Value> items;  ///< arrays: the elements
  static Value u32(std::uint32_t v) {
    Value x;
    x.kind = Kind::U32, x.i = v;
    return x;
  }
  static Value f32(float v) {
    Value x;
    x.kind = Kind::F32, x.f = v;
    return x;
  }
  static Value str(std::string v) {
    Value x;
    x.kind = Kind::String, x.s = std::move(v);
    return x;
  }
  static Value array(Kind element, std::vector<Value> items) {
    Value x;
    x.kind = Kind::Array, x.element = element, x.items = std::move(items);
    return x;
  }
  bool is_integer() const { return kind <= Kind::I32 || kind == Kind::U64 || kind == Kind::I64; }
  bool is_float() const { return kind == Kind::F32 || kind == Kind::F64; }
};

/// The name of a metadata kind as the GGUF spec writes it ("UINT32", "STRING", ...).
std::string kind_name(Value::Kind k);

struct TensorInfo {
  std::string name;
  Type type;
  Shape shape;           ///< outermost first, as a Tensor's (GGUF stores innermost first)
  std::uint64_t offset;  ///< into the data section
};

class File {
 public:
  /// Opens and validates a GGUF file; errors name the file and what is wrong.
  explicit File(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  /// The value of a key; throws "<file>: missing metadata '<key>'".
  const Value& get(const std::string& key) const;
  bool has(const std::string& key) const;
  /// Typed reads of a key: throw naming the file and key when it is missing or holds another
  /// kind (get_float takes F32 and F64, get_int any integer kind but BOOL).
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& info(const std::string& name) const;
  bool contains(const std::string& name) const;
  /// F32, F16 and BF16 tensors as Tensors (views of the mapping).
  Tensor tensor(const std::string& name) const;
  /// The raw bytes of a tensor: [rows, row_bytes] U8 (rows = product of all but the innermost
  /// dimension), for the block types.
  Tensor raw(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::size_t data_start_ = 0;
};

/// One tensor to write: its type, shape (outermost first) and bytes (row-major; for the block
/// types the packed blocks of each row).
struct Output {
  std::string name;
  Type type;
  Shape shape;
  Tensor bytes;  ///< U8 (any shape) holding exactly row_bytes(type, innermost) × rows bytes
};

/// Writes a GGUF v3 file with the metadata in the given order and the tensors in order, as the
/// gguf Python package's GGUFWriter lays it out (alignment 32).
void write(const std::string& path, const std::vector<std::pair<std::string, Value>>& metadata,
           const std::vector<Output>& tensors);

}  // namespace gguf
}  // namespace inferlab
