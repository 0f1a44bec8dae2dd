#include "common/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/atomic_file.h"
#include "common/safetensors.h"

namespace inferlab::gguf {

std::int64_t row_bytes(Type t, std::int64_t n) {
  // n · 4 is the widest; checked so that a crafted shape cannot overflow it.
  IL_CHECK(n >= 0 && n <= INT64_MAX / 4, "gguf: a row of ", n, " values is out of range");
  switch (t) {
    case Type::F32: return n * 4;
    case Type::F16: return n * 2;
    case Type::BF16: return n * 2;
    case Type::Q8_0: return n / 32 * 34;
    case Type::Q4_0: return n / 32 * 18;
    case Type::Q4_1: return n / 32 * 20;
    case Type::Q5_0: return n / 32 * 22;
    case Type::Q5_1: return n / 32 * 24;
    case Type::Q2_K: return n / 256 * 84;
    case Type::Q3_K: return n / 256 * 110;
    case Type::Q4_K: return n / 256 * 144;
    case Type::Q5_K: return n / 256 * 176;
    case Type::Q6_K: return n / 256 * 210;
    case Type::IQ4_NL: return n / 32 * 18;
    case Type::IQ4_XS: return n / 256 * 136;
    default: break;
  }
  fail("gguf: ", type_name(t), " is not a tensor type of GGUF files");
}

std::int64_t block_values(Type t) {
  switch (t) {
    case Type::F32:
    case Type::F16:
    case Type::BF16: return 1;
    case Type::Q2_K:
    case Type::Q3_K:
    case Type::Q4_K:
    case Type::Q5_K:
    case Type::Q6_K:
    case Type::IQ4_XS: return 256;
    default: return 32;
  }
}

std::string ggml_type_name(std::uint32_t t) {
  // ggml.h's enum ggml_type, by number; "" where ggml has no type.
  static const char* const names[] = {"F32",
                                      "F16",
                                      "Q4_0",
                                      "Q4_1",
                                      "Q4_2 (retired)",
                                      "Q4_3 (retired)",
                                      "Q5_0",
                                      "Q5_1",
                                      "Q8_0",
                                      "Q8_1",
                                      "Q2_K",
                                      "Q3_K",
                                      "Q4_K",
                                      "Q5_K",
                                      "Q6_K",
                                      "Q8_K",
                                      "IQ2_XXS",
                                      "IQ2_XS",
                                      "IQ3_XXS",
                                      "IQ1_S",
                                      "IQ4_NL",
                                      "IQ3_S",
                                      "IQ2_S",
                                      "IQ4_XS",
                                      "I8",
                                      "I16",
                                      "I32",
                                      "I64",
                                      "F64",
                                      "IQ1_M",
                                      "BF16",
                                      "Q4_0_4_4 (retired)",
                                      "Q4_0_4_8 (retired)",
                                      "Q4_0_8_8 (retired)",
                                      "TQ1_0",
                                      "TQ2_0",
                                      "IQ4_NL_4_4 (retired)",
                                      "IQ4_NL_4_8 (retired)",
                                      "IQ4_NL_8_8 (retired)",
                                      "MXFP4",
                                      "NVFP4",
                                      "Q1_0"};
  return t < std::size(names) ? names[t] : "ggml type " + std::to_string(t) + " (unknown)";
}

std::string type_name(Type t) { return ggml_type_name(static_cast<std::uint32_t>(t)); }

std::string kind_name(Value::Kind k) {
  static const char* const names[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                      "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  const auto i = static_cast<std::uint32_t>(k);
  return i < std::size(names) ? names[i] : "type " + std::to_string(i);
}

namespace {

// Bytes of a tensor (dimensions already checked positive), or -1 past 2^62: more than any file.
std::int64_t tensor_bytes(const TensorInfo& t) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < t.shape.size(); ++d)
    if (__builtin_mul_overflow(rows, t.shape[d], &rows)) return -1;
  std::int64_t bytes;
  if (t.shape.back() > INT64_MAX / 4 || __builtin_mul_overflow(rows, row_bytes(t.type, t.shape.back()), &bytes) ||
      bytes > (std::int64_t{1} << 62))
    return -1;
  return bytes;
}

// A cursor over the mapped bytes that fails with the file's name when it runs out.
struct Reader {
  const unsigned char* p;
  std::size_t size, at = 0;
  const std::string& path;
  template <class T>
  T get(const char* what) {
    IL_CHECK(at + sizeof(T) <= size, path, ": truncated while reading ", what, " at byte ", at);
    T v;
    std::memcpy(&v, p + at, sizeof v);
    at += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    const auto n = get<std::uint64_t>(what);
    IL_CHECK(n <= size - at, path, ": ", what, " of ", n, " bytes runs past the end of the file");
    std::string s(reinterpret_cast<const char*>(p + at), static_cast<std::size_t>(n));
    at += static_cast<std::size_t>(n);
    return s;
  }
  Value value(Value::Kind k, const std::string& key, int depth = 0) {
    Value v;
    v.kind = k;
    switch (k) {
      case Value::Kind::U8: v.i = get<std::uint8_t>(key.c_str()); break;
      case Value::Kind::I8: v.i = get<std::int8_t>(key.c_str()); break;
      case Value::Kind::U16: v.i = get<std::uint16_t>(key.c_str()); break;
      case Value::Kind::I16: v.i = get<std::int16_t>(key.c_str()); break;
      case Value::Kind::U32: v.i = get<std::uint32_t>(key.c_str()); break;
      case Value::Kind::I32: v.i = get<std::int32_t>(key.c_str()); break;
      case Value::Kind::U64: {
        const auto u = get<std::uint64_t>(key.c_str());
        // Values are held as int64: refuse rather than wrap to a negative number.
        IL_CHECK(u <= static_cast<std::uint64_t>(INT64_MAX), path, ": metadata '", key, "' = ", u,
                 " is too large (UINT64 values must be below 2^63)");
        v.i = static_cast<std::int64_t>(u);
        break;
      }
      case Value::Kind::I64: v.i = get<std::int64_t>(key.c_str()); break;
      case Value::Kind::F32: v.f = get<float>(key.c_str()); break;
      case Value::Kind::F64: v.f = get<double>(key.c_str()); break;
      case Value::Kind::Bool: v.i = get<std::uint8_t>(key.c_str()) != 0; break;
      case Value::Kind::String: v.s = str(key.c_str()); break;
      case Value::Kind::Array: {
        IL_CHECK(depth == 0, path, ": metadata '", key, "' nests arrays, which is not supported");
        v.element = static_cast<Value::Kind>(get<std::uint32_t>(key.c_str()));
        const auto n = get<std::uint64_t>(key.c_str());
        IL_CHECK(n <= size - at, path, ": metadata '", key, "' claims ", n, " elements, more than the file holds");
        v.items.reserve(static_cast<std::size_t>(n));
        for (std::uint64_t i = 0; i < n; ++i) v.items.push_back(value(v.element, key, depth + 1));
        break;
      }
      default: fail(path, ": metadata '", key, "' has unknown type ", static_cast<std::uint32_t>(k));
    }
    return v;
  }
};

}  // namespace

File::File(const std::string& path) : path_(path), file_(std::make_shared<MappedFile>(path, "GGUF file")) {
  Reader r{file_->data(), file_->size(), 0, path_};
  IL_CHECK(file_->size() >= 4 && std::memcmp(file_->data(), "GGUF", 4) == 0, path, ": not a GGUF file (no 'GGUF' magic)");
  IL_CHECK(file_->size() >= 24, path, ": truncated after the magic (", file_->size(),
           " bytes; a GGUF header is 24: magic, version, tensor count, metadata count)");
  r.at = 4;
  const auto version = r.get<std::uint32_t>("version");
  IL_CHECK(version == 2 || version == 3, path, ": GGUF version ", version, " is not supported (2, 3)");
  const auto n_tensors = r.get<std::uint64_t>("tensor count"), n_kv = r.get<std::uint64_t>("metadata count");
  IL_CHECK(n_tensors < (1u << 24) && n_kv < (1u << 24), path, ": implausible counts (", n_tensors, " tensors, ", n_kv,
           " metadata entries)");
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.str("a metadata key");
    const auto kind = static_cast<Value::Kind>(r.get<std::uint32_t>(key.c_str()));
    metadata_.emplace_back(key, r.value(kind, key));
  }
  std::uint64_t alignment = 32;
  if (has("general.alignment"))  // a negative one must not wrap to a huge power of two
    alignment = checked_cast<std::uint64_t>(get_int("general.alignment"), path + ": general.alignment");
  // At least 8, so that every F32/F16 tensor starts aligned for its type.
  IL_CHECK(alignment >= 8 && (alignment & (alignment - 1)) == 0, path, ": general.alignment ", alignment,
           " is not a power of two of at least 8");
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = r.str("a tensor name");
    IL_CHECK(!t.name.empty(), path, ": tensor ", i, " of ", n_tensors, " has an empty name (is the tensor count right?)");
    for (const auto& other : tensors_) IL_CHECK(other.name != t.name, path, ": tensor '", t.name, "' appears twice");
    const auto dims = r.get<std::uint32_t>(t.name.c_str());
    IL_CHECK(dims >= 1 && dims <= 4, path, ": tensor '", t.name, "' has ", dims, " dimensions");
    std::vector<std::int64_t> ne(dims);
    for (auto& d : ne) {
      const auto u = r.get<std::uint64_t>(t.name.c_str());
      // Zero would divide by zero below; beyond 2^62 no file could hold it (and int64 would wrap).
      IL_CHECK(u > 0 && u <= (std::uint64_t{1} << 62), path, ": tensor '", t.name, "' has a dimension of ", u,
               " (dimensions must be in [1, 2^62])");
      d = static_cast<std::int64_t>(u);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    const auto type = r.get<std::uint32_t>(t.name.c_str());
    IL_CHECK(type <= 3 || (type >= 6 && type <= 8) || (type >= 10 && type <= 14) || type == 20 || type == 23 || type == 30,
             path, ": tensor '", t.name, "' is ", ggml_type_name(type),
             ggml_type_name(type).find("unknown") == std::string::npos ? " (ggml type " + std::to_string(type) + ")" : "",
             ", which this reader does not decode (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, "
             "Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS)");
    t.type = static_cast<Type>(type);
    IL_CHECK(ne[0] % block_values(t.type) == 0, path, ": tensor '", t.name, "' rows of ", ne[0], " are not whole blocks of ",
             block_values(t.type));
    t.offset = r.get<std::uint64_t>(t.name.c_str());
    // Misaligned F32/F16 data would be read through misaligned pointers.
    IL_CHECK(t.offset % alignment == 0, path, ": tensor '", t.name, "' has offset ", t.offset,
             ", not a multiple of the alignment ", alignment);
    tensors_.push_back(std::move(t));
  }
  const std::size_t size = file_->size();
  data_start_ = (r.at + alignment - 1) / alignment * alignment;
  IL_CHECK(tensors_.empty() || data_start_ <= size, path, ": the data section would start at byte ", data_start_,
           ", past the end of the file (", size, " bytes)");
  // Compared without adding to offset, which a crafted file can set near 2^64 to wrap the sum.
  const std::uint64_t room = tensors_.empty() ? 0 : size - data_start_;
  for (const auto& t : tensors_) {
    const std::int64_t bytes = tensor_bytes(t);
    IL_CHECK(bytes >= 0, path, ": tensor '", t.name, "' of shape ", shape_str(t.shape), " is implausibly large");
    IL_CHECK(t.offset <= room && static_cast<std::uint64_t>(bytes) <= room - t.offset, path, ": tensor '", t.name, "' (",
             bytes, " bytes at offset ", t.offset, ") runs past the end of the file (", size, " bytes, data from byte ",
             data_start_, ")");
  }
  if (tensors_.empty()) return;
  // What follows the entries is zero padding, then the tensors, apart, up to the end of the file.
  // A tensor count below the entries leaves the last entries in the padding and the data
  // section starting early, so every tensor would read the wrong bytes.
  for (std::size_t i = r.at; i < data_start_; ++i)
    IL_CHECK(file_->data()[i] == 0, path, ": non-zero byte ", i, " between the tensor entries and the data section",
             " (does the tensor count, ", n_tensors, ", match the entries?)");
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  std::uint64_t end = 0;  // of the previous tensor's bytes
  for (std::size_t i = 0; i < by_offset.size(); ++i) {
    IL_CHECK(i == 0 || by_offset[i]->offset >= end, path, ": tensors '", by_offset[i - 1]->name, "' and '",
             by_offset[i]->name, "' overlap");
    end = by_offset[i]->offset + static_cast<std::uint64_t>(tensor_bytes(*by_offset[i]));
  }
  IL_CHECK(room - end < alignment, path, ": ", room - end, " bytes after the last tensor '", by_offset.back()->name,
           "' belong to no tensor (does the tensor count, ", n_tensors, ", match the entries?)");
}

std::int64_t File::get_int(const std::string& key) const {
  const Value& v = get(key);
  IL_CHECK(v.is_integer(), path_, ": metadata '", key, "' is ", kind_name(v.kind), ", expected an integer");
  return v.i;
}

double File::get_float(const std::string& key) const {
  const Value& v = get(key);
  IL_CHECK(v.is_float(), path_, ": metadata '", key, "' is ", kind_name(v.kind), ", expected FLOAT32 or FLOAT64");
  return v.f;
}

const std::string& File::get_string(const std::string& key) const {
  const Value& v = get(key);
  IL_CHECK(v.kind == Value::Kind::String, path_, ": metadata '", key, "' is ", kind_name(v.kind), ", expected STRING");
  return v.s;
}

bool File::has(const std::string& key) const {
  for (const auto& [k, v] : metadata_)
    if (k == key) return true;
  return false;
}

const Value& File::get(const std::string& key) const {
  for (const auto& [k, v] : metadata_)
    if (k == key) return v;
  fail(path_, ": missing metadata '", key, "'");
}

bool File::contains(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return true;
  return false;
}

const TensorInfo& File::info(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  fail(path_, ": no tensor '", name, "'");
}

Tensor File::tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  IL_CHECK(t.type == Type::F32 || t.type == Type::F16 || t.type == Type::BF16, path_, ": tensor '", name, "' is ",
           type_name(t.type), "; use raw() for block formats");
  auto* p = const_cast<unsigned char*>(file_->data() + data_start_ + t.offset);
  const DType d = t.type == Type::F32 ? DType::F32 : t.type == Type::F16 ? DType::F16 : DType::BF16;
  return Tensor::wrap(p, t.shape, d, Device::CPU, file_);
}

Tensor File::raw(const std::string& name) const {
  const TensorInfo& t = info(name);
  const std::int64_t rows = shape_numel(t.shape) / t.shape.back();
  auto* p = const_cast<unsigned char*>(file_->data() + data_start_ + t.offset);
  return Tensor::wrap(p, {rows, row_bytes(t.type, t.shape.back())}, DType::U8, Device::CPU, file_);
}

// ---------------------------------------------------------------------------------------------
// The block types' decoders: one block at a time, in ggml's float operations.
namespace {

float half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void block_32(Type t, const std::uint8_t* b, float* y) {
  switch (t) {
    case Type::Q4_0: {
      const float d = half(b);
      for (int j = 0; j < 16; ++j)
        y[j] = d * static_cast<float>((b[2 + j] & 0xF) - 8), y[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
      return;
    }
    case Type::Q8_0: {
      const float d = half(b);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<std::int8_t>(b[2 + j]));
      return;
    }
    case Type::Q4_1: {
      const float d = half(b), m = half(b + 2);
      for (int j = 0; j < 16; ++j)
        y[j] = d * static_cast<float>(b[4 + j] & 0xF) + m, y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
      return;
    }
    case Type::Q5_0:
    case Type::Q5_1: {
      const bool one = t == Type::Q5_1;
      const float d = half(b), m = one ? half(b + 2) : 0.0f;
      std::uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const std::uint8_t* qs = b + (one ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
        if (one) y[j] = d * static_cast<float>(lo) + m, y[j + 16] = d * static_cast<float>(hi) + m;
        else y[j] = d * static_cast<float>(lo - 16), y[j + 16] = d * static_cast<float>(hi - 16);
      }
      return;
    }
    case Type::IQ4_NL: {
      const float d = half(b);
      for (int j = 0; j < 16; ++j)
        y[j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 0xF]),
        y[j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
      return;
    }
    default: fail("gguf: ", type_name(t), " is not a 32-value block type");
  }
}

void block_256(Type t, const std::uint8_t* b, float* y) {
  if (t == Type::IQ4_XS) {
    // 8 sub-blocks of 32, each as an IQ4_NL block whose scale is d·(sc − 32): 16 bytes of
    // nibbles (low: values 0-15, high: 16-31) from byte 8 on.
    const float d = half(b);
    for (int j = 0; j < 8; ++j, y += 32) {
      const float dl = d * static_cast<float>(scale_iq4_xs(j, b));
      const std::uint8_t* qs = b + 8 + 16 * j;
      for (int l = 0; l < 16; ++l)
        y[l] = dl * static_cast<float>(kIq4nlValues[qs[l] & 0xF]),
        y[l + 16] = dl * static_cast<float>(kIq4nlValues[qs[l] >> 4]);
    }
    return;
  }
  if (t == Type::Q2_K || t == Type::Q3_K) {
    // Two halves of 128; quarter j of a half is the 2-bit field 2j of the half's 32 bytes qs, in
    // two sub-blocks of 16, each with its scale: Q2_K (d·sc)·q − (dmin·m), sc and m the nibbles of
    // a byte; Q3_K (d·(sc − 32))·(q − 4), the 6-bit sc packed in 12 bytes and bit 4n + j of
    // hmask[l] cancelling the − 4.
    const bool two = t == Type::Q2_K;
    const std::uint8_t* qs = b + (two ? 16 : 32);
    const float d = half(b + (two ? 80 : 108)), dmin = two ? half(b + 82) : 0.0f;
    for (int i = 0; i < 256; ++i) {
      const int n = i / 128, j = (i % 128) / 32, l = i % 32;
      const int q = (qs[32 * n + l] >> (2 * j)) & 3;
      if (two) {
        const float dl = d * static_cast<float>(b[i / 16] & 0xF), ml = dmin * static_cast<float>(b[i / 16] >> 4);
        y[i] = dl * static_cast<float>(q) - ml;
      } else {
        const float dl = d * static_cast<float>(scale_q3_k(i / 16, b + 96));
        y[i] = dl * static_cast<float>(q - (((b[l] >> (4 * n + j)) & 1) ? 0 : 4));
      }
    }
    return;
  }
  if (t == Type::Q6_K) {
    const std::uint8_t *ql = b, *qh = b + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    const float d = half(b + 208);
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128)
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32,
                  q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
                  q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    return;
  }
  IL_CHECK(t == Type::Q4_K || t == Type::Q5_K, "gguf: ", type_name(t), " is not a 256-value block type");
  const bool five = t == Type::Q5_K;
  const float d = half(b), dmin = half(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 4; ++j, qs += 32) {  // 64 values: sub-blocks 2j (low nibbles) and 2j + 1 (high)
    std::uint8_t sc1, m1, sc2, m2;
    scale_min_k4(2 * j, scales, sc1, m1);
    scale_min_k4(2 * j + 1, scales, sc2, m2);
    const float d1 = d * static_cast<float>(sc1), dm1 = dmin * static_cast<float>(m1);
    const float d2 = d * static_cast<float>(sc2), dm2 = dmin * static_cast<float>(m2);
    for (int l = 0; l < 32; ++l) {
      int lo = qs[l] & 0xF, hi = qs[l] >> 4;
      if (five) lo |= ((qh[l] >> (2 * j)) & 1) << 4, hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
      y[64 * j + l] = d1 * static_cast<float>(lo) - dm1;
      y[64 * j + 32 + l] = d2 * static_cast<float>(hi) - dm2;
    }
  }
}

}  // namespace

// Q4_K and Q5_K pack 8 six-bit scales and 8 six-bit mins in 12 bytes: j < 4 in the low 6 bits of
// bytes j and j + 4; j >= 4 in a nibble of byte j + 4 and the top 2 bits of bytes j − 4 and j.
void dequantize_block(Type t, const std::uint8_t* block, float* out) {
  const std::int64_t bv = block_values(t);
  IL_CHECK(bv > 1, "gguf: ", type_name(t), " is not a block type");
  if (bv == 32) block_32(t, block, out);
  else block_256(t, block, out);
}

Tensor dequantize_rows(Type t, const Tensor& raw, std::int64_t cols) {
  const std::int64_t bv = block_values(t);
  IL_CHECK(bv > 1, "gguf: ", type_name(t), " is not a block type");
  IL_CHECK(cols > 0 && cols % bv == 0, "gguf: rows of ", cols, " values are not whole ", type_name(t), " blocks of ", bv);
  IL_CHECK(raw.dtype() == DType::U8 && raw.ndim() == 2 && raw.size(1) == row_bytes(t, cols), "gguf: ", type_name(t),
           " rows of ", cols, " values are ", row_bytes(t, cols), " bytes, got ", raw.describe());
  const Tensor src = raw.to(Device::CPU).contiguous();
  Tensor out = Tensor::empty({raw.size(0), cols}, DType::F32);
  const std::int64_t per = row_bytes(t, bv);
  for (std::int64_t r = 0; r < raw.size(0); ++r)
    for (std::int64_t k = 0; k < cols / bv; ++k) {
      const auto* b = src.data<std::uint8_t>() + r * src.size(1) + k * per;
      float* y = out.data<float>() + r * cols + k * bv;
      dequantize_block(t, b, y);
    }
  return out;
}

namespace {

struct Writer {
  std::string out;
  template <class T>
  void put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    out += s;
  }
  // A value is written in its kind's width; one that does not fit it is an error naming the key.
  void value(const Value& v, bool with_kind, const std::string& key) {
    const std::string what = "gguf::write: metadata '" + key + "'";
    if (with_kind) put<std::uint32_t>(static_cast<std::uint32_t>(v.kind));
    switch (v.kind) {
      case Value::Kind::U8: put(checked_cast<std::uint8_t>(v.i, what)); break;
      case Value::Kind::I8: put(checked_cast<std::int8_t>(v.i, what)); break;
      case Value::Kind::U16: put(checked_cast<std::uint16_t>(v.i, what)); break;
      case Value::Kind::I16: put(checked_cast<std::int16_t>(v.i, what)); break;
      case Value::Kind::U32: put(checked_cast<std::uint32_t>(v.i, what)); break;
      case Value::Kind::I32: put(checked_cast<std::int32_t>(v.i, what)); break;
      case Value::Kind::U64: put<std::uint64_t>(static_cast<std::uint64_t>(v.i)); break;  // i holds its 64 bits
      case Value::Kind::I64: put<std::int64_t>(v.i); break;
      case Value::Kind::F32: put<float>(static_cast<float>(v.f)); break;
      case Value::Kind::F64: put<double>(v.f); break;
      case Value::Kind::Bool: put<std::uint8_t>(v.i ? 1 : 0); break;
      case Value::Kind::String: str(v.s); break;
      case Value::Kind::Array:
        put<std::uint32_t>(static_cast<std::uint32_t>(v.element));
        put<std::uint64_t>(v.items.size());
        for (std::size_t i = 0; i < v.items.size(); ++i) value(v.items[i], false, key + "[" + std::to_string(i) + "]");
        break;
    }
  }
  void pad(std::size_t alignment) { out.append((alignment - out.size() % alignment) % alignment, '\0'); }
};

}  // namespace

void write(const std::string& path, const std::vector<std::pair<std::string, Value>>& metadata,
           const std::vector<Output>& tensors) {
  constexpr std::size_t kAlign = 32;
  Writer w;
  w.out = "GGUF";
  w.put<std::uint32_t>(3);
  w.put<std::uint64_t>(tensors.size());
  w.put<std::uint64_t>(metadata.size());
  for (const auto& [k, v] : metadata) {
    w.str(k);
    w.value(v, true, k);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    IL_CHECK(!t.shape.empty(), "gguf::write: tensor '", t.name, "' has no shape");
    for (auto d : t.shape)  // what the reader accepts
      IL_CHECK(d > 0, "gguf::write: tensor '", t.name, "' has shape ", shape_str(t.shape), " (dimensions must be positive)");
    const std::int64_t rows = shape_numel(t.shape) / t.shape.back(), bytes = rows * row_bytes(t.type, t.shape.back());
    IL_CHECK(static_cast<std::int64_t>(t.bytes.nbytes()) == bytes, "gguf::write: tensor '", t.name, "' holds ",
             t.bytes.nbytes(), " bytes, ", type_name(t.type), shape_str(t.shape), " needs ", bytes);
    w.str(t.name);
    w.put(checked_cast<std::uint32_t>(t.shape.size(), "gguf::write: tensor '" + t.name + "' dimensions"));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) w.put<std::uint64_t>(static_cast<std::uint64_t>(*it));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(t.type));
    w.put<std::uint64_t>(offset);
    offset += (static_cast<std::uint64_t>(bytes) + kAlign - 1) / kAlign * kAlign;
  }
  w.pad(kAlign);
  for (const auto& t : tensors) {
    const Tensor b = t.bytes.to(Device::CPU).contiguous();
    w.out.append(static_cast<const char*>(b.raw_data()), b.nbytes());
    w.pad(kAlign);
  }
  write_file_atomically(path, w.out);
}

}  // namespace inferlab::gguf
