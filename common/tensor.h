#pragma once
/// @file tensor.h
/// @brief Tensor: a shape, strides, an element type and a device over shared bytes.
///
/// A Tensor is a handle (copying it shares the bytes, like a PyTorch tensor). It is either
/// owning (allocated by empty()/zeros()) or a view (slice(), view(), wrap() over memory that
/// somebody else keeps alive, such as an mmap-ed safetensors file). Strides are in elements.
/// Ops in ops.h want contiguous row-major tensors and say so when they get something else.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"

namespace inferlab {

using Shape = std::vector<std::int64_t>;

/// Number of elements of a shape (1 for a scalar shape {}).
std::int64_t shape_numel(const Shape& s);
/// "[2, 3, 4]"
std::string shape_str(const Shape& s);

/// The DType that stores C++ type T (std::uint16_t stands for both F16 and BF16).
template <class T>
constexpr bool dtype_matches(DType d) {
  if constexpr (std::is_same_v<T, float>) return d == DType::F32;
  else if constexpr (std::is_same_v<T, double>) return d == DType::F64;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return d == DType::F16 || d == DType::BF16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return d == DType::I8;
  else if constexpr (std::is_same_v<T, std::int32_t>) return d == DType::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return d == DType::I64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return d == DType::U8;
  else return false;
}

class Tensor {
 public:
  /// An undefined tensor (defined() is false).
  Tensor() = default;

  /// Uninitialised contiguous tensor. On CUDA this fails with "no CUDA device available: ..."
  /// when there is none.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  /// Contiguous tensor of zeros.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  /// A CPU tensor holding a copy of `values` (size must equal the shape's element count).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  /// A contiguous view over memory that `owner` keeps alive (no copy).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device, std::shared_ptr<const void> owner);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  const Shape& shape() const { return shape_; }
  /// Size of dimension d; negative d counts from the end.
  std::int64_t size(int d) const;
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return shape_numel(shape_); }
  const std::vector<std::int64_t>& strides() const { return strides_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  bool is_cuda() const { return device_ == Device::CUDA; }

  /// Pointer to the first element (a device pointer for CUDA tensors).
  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }
  /// Typed pointer to the first element; throws if T does not match dtype().
  template <class T>
  T* data() {
    check_type<T>();
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    check_type<T>();
    return static_cast<const T*>(data_);
  }
  /// Element access on a CPU tensor through the strides. Indices are bounds-checked in debug
  /// builds (NDEBUG unset); in release builds this is plain pointer arithmetic.
  template <class T>
  T& at(std::initializer_list<std::int64_t> index) {
    return static_cast<T*>(data_)[offset_of<T>(index)];
  }
  template <class T>
  const T& at(std::initializer_list<std::int64_t> index) const {
    return static_cast<const T*>(data_)[offset_of<T>(index)];
  }

  /// Same bytes, new shape (contiguous tensors only). One dimension may be -1.
  Tensor view(Shape shape) const;
  /// Elements [begin, end) along dimension d (a view; negative d counts from the end).
  Tensor slice(int d, std::int64_t begin, std::int64_t end) const;
  /// Index i along dimension d, which is dropped (a view).
  Tensor select(int d, std::int64_t i) const;
  /// A contiguous copy (or *this if already contiguous).
  Tensor contiguous() const;
  /// A contiguous copy on the same device.
  Tensor clone() const;
  /// A contiguous copy on `device`.
  Tensor to(Device device) const;
  /// A contiguous copy converted to `dtype` (float types between each other, integer types
  /// between each other; a CUDA tensor is converted through the host).
  Tensor to(DType dtype) const;
  /// Copies `src` (same shape and dtype, any device, any strides) into this tensor.
  void copy_from(const Tensor& src);
  /// All elements as float on the host (any float dtype, any device). For tests and printing.
  std::vector<float> to_float_vector() const;
  /// As to_float_vector, in double (exact for every float dtype).
  std::vector<double> to_double_vector() const;
  /// "f32[2, 3] cpu"
  std::string describe() const;

 private:
  template <class T>
  void check_type() const {
    if (!dtype_matches<T>(dtype_)) type_mismatch(typeid(T).name());
  }
  [[noreturn]] void type_mismatch(const char* cpp_type) const;
  template <class T>
  std::int64_t offset_of(std::initializer_list<std::int64_t> index) const {
#ifndef NDEBUG
    check_type<T>();
    check_index(index);
#endif
    std::int64_t off = 0;
    int d = 0;
    for (std::int64_t i : index) off += i * strides_[static_cast<std::size_t>(d++)];
    return off;
  }
  void check_index(std::initializer_list<std::int64_t> index) const;

  std::shared_ptr<const void> keep_;  // keeps the bytes alive
  void* data_ = nullptr;              // first element
  Shape shape_;
  std::vector<std::int64_t> strides_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

/// Contiguous row-major strides for a shape.
std::vector<std::int64_t> contiguous_strides(const Shape& shape);

/// Returns `t` when every value is finite; else throws "<what>: element [i, j] is nan (weights
/// must be finite numbers)". Loaders call it on every weight: a NaN or infinity would turn
/// every later activation into NaN, or, cast to an integer by a quantised product, silently
/// into 0. Integer tensors always pass.
const Tensor& check_finite(const Tensor& t, const std::string& what);

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  IL_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values for shape ", shape_str(shape));
  DType d;
  if constexpr (std::is_same_v<T, float>) d = DType::F32;
  else if constexpr (std::is_same_v<T, double>) d = DType::F64;
  else if constexpr (std::is_same_v<T, std::int8_t>) d = DType::I8;
  else if constexpr (std::is_same_v<T, std::int32_t>) d = DType::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>) d = DType::I64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) d = DType::U8;
  else static_assert(sizeof(T) == 0, "from_vector: unsupported element type");
  Tensor t = empty(shape, d);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace inferlab
