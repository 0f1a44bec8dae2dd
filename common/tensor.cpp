#include "common/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/device_memory.h"

namespace inferlab {

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

namespace {
// The index of the first value whose exponent bits are all set (NaN or ±infinity), or -1.
template <class U>
std::int64_t first_nonfinite(const U* p, std::int64_t n, U exponent) {
  bool any = false;
  for (std::int64_t i = 0; i < n; ++i) any |= (p[i] & exponent) == exponent;  // no early exit: vectorises
  if (any)
    for (std::int64_t i = 0; i < n; ++i)
      if ((p[i] & exponent) == exponent) return i;
  return -1;
}
}  // namespace

const Tensor& check_finite(const Tensor& t, const std::string& what) {
  if (!is_float(t.dtype()) || t.numel() == 0) return t;
  const Tensor h = t.to(Device::CPU).contiguous();
  std::int64_t bad = -1;
  switch (h.dtype()) {
    case DType::F32:
      bad = first_nonfinite(static_cast<const std::uint32_t*>(h.raw_data()), h.numel(), std::uint32_t{0x7F800000});
      break;
    case DType::F64:
      bad = first_nonfinite(static_cast<const std::uint64_t*>(h.raw_data()), h.numel(), std::uint64_t{0x7FF0000000000000});
      break;
    case DType::F16:
      bad = first_nonfinite(static_cast<const std::uint16_t*>(h.raw_data()), h.numel(), std::uint16_t{0x7C00});
      break;
    case DType::BF16:
      bad = first_nonfinite(static_cast<const std::uint16_t*>(h.raw_data()), h.numel(), std::uint16_t{0x7F80});
      break;
    default: break;
  }
  if (bad < 0) return t;
  Shape index(t.shape().size());
  for (std::int64_t i = static_cast<std::int64_t>(index.size()) - 1, rest = bad; i >= 0; --i)
    index[static_cast<std::size_t>(i)] = rest % t.size(i), rest /= t.size(i);
  const double v = h.view({-1}).slice(0, bad, bad + 1).to(DType::F32).data<float>()[0];
  fail(what, ": element ", shape_str(index), " is ", v, " (weights must be finite numbers)");
}

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  std::vector<std::int64_t> st(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

namespace {
constexpr std::size_t kAlign = 64;  // a cache line; also enough for any SIMD load

// A failed host allocation says what it was for (`tensor`: "[1024, 128] f32"); whoever knows
// the tensor's name adds it (with_context in the loaders, caches and conversions).
template <class Describe>
std::shared_ptr<void> allocate(std::size_t bytes, Device device, const Describe& tensor) {
  if (device == Device::CUDA) {
    void* p = cuda::device_malloc(std::max<std::size_t>(bytes, 1));
    return std::shared_ptr<void>(p, [](void* q) { cuda::device_free(q); });
  }
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  IL_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes for a ", tensor(), " tensor");
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void check_shape(const Shape& shape) {
  for (auto d : shape) IL_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
}

int norm_dim(int d, int ndim, const char* what) {
  int r = d < 0 ? d + ndim : d;
  IL_CHECK(r >= 0 && r < ndim, what, ": dimension ", d, " out of range for a ", ndim, "-d tensor");
  return r;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  auto mem = allocate(t.nbytes(), device, [&] { return shape_str(shape) + " " + std::string(dtype_name(dtype)); });
  t.data_ = mem.get();
  t.keep_ = std::move(mem);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device == Device::CUDA) cuda::memset_zero(t.data_, t.nbytes());
  else std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device, std::shared_ptr<const void> owner) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  t.keep_ = std::move(owner);
  return t;
}

std::int64_t Tensor::size(int d) const { return shape_[static_cast<std::size_t>(norm_dim(d, ndim(), "size"))]; }

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_) || numel() <= 1; }

void Tensor::type_mismatch(const char* cpp_type) const { fail("tensor ", describe(), " accessed as C++ type ", cpp_type); }

void Tensor::check_index(std::initializer_list<std::int64_t> index) const {
  IL_CHECK(static_cast<int>(index.size()) == ndim(), "at(): ", index.size(), " indices for a tensor of shape ",
           shape_str(shape_));
  IL_CHECK(device_ == Device::CPU, "at(): element access on a ", device_name(device_), " tensor");
  int d = 0;
  for (auto i : index) {
    IL_CHECK(i >= 0 && i < shape_[static_cast<std::size_t>(d)], "at(): index ", i, " out of range for dimension ", d,
             " of shape ", shape_str(shape_));
    ++d;
  }
}

Tensor Tensor::view(Shape shape) const {
  IL_CHECK(is_contiguous(), "view(): tensor ", describe(), " is not contiguous");
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      IL_CHECK(infer < 0, "view(): more than one -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    IL_CHECK(known > 0 && numel() % known == 0, "view(): cannot view ", describe(), " as ", shape_str(shape));
    shape[static_cast<std::size_t>(infer)] = numel() / known;
  }
  IL_CHECK(shape_numel(shape) == numel(), "view(): cannot view ", describe(), " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::slice(int d, std::int64_t begin, std::int64_t end) const {
  int dd = norm_dim(d, ndim(), "slice");
  std::int64_t n = shape_[static_cast<std::size_t>(dd)];
  IL_CHECK(0 <= begin && begin <= end && end <= n, "slice(): [", begin, ", ", end, ") out of range for dimension ", d,
           " of ", describe());
  Tensor t = *this;
  t.shape_[static_cast<std::size_t>(dd)] = end - begin;
  t.data_ = static_cast<char*>(data_) +
            begin * strides_[static_cast<std::size_t>(dd)] * static_cast<std::int64_t>(dtype_size(dtype_));
  return t;
}

Tensor Tensor::select(int d, std::int64_t i) const {
  int dd = norm_dim(d, ndim(), "select");
  Tensor t = slice(dd, i, i + 1);
  t.shape_.erase(t.shape_.begin() + dd);
  t.strides_.erase(t.strides_.begin() + dd);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_ && is_contiguous()) return clone();
  Tensor src = contiguous();
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(src);
  return t;
}

namespace {
// Copies a strided CPU tensor's elements into contiguous order.
void gather_strided(const char* src, char* dst, const Shape& shape, const std::vector<std::int64_t>& strides,
                    std::size_t esize) {
  const std::int64_t n = shape_numel(shape);
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    std::memcpy(dst + k * static_cast<std::int64_t>(esize), src + off * static_cast<std::int64_t>(esize), esize);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  IL_CHECK(src.shape_ == shape_, "copy_from: shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  IL_CHECK(src.dtype_ == dtype_, "copy_from: dtype ", dtype_name(src.dtype_), " into ", dtype_name(dtype_));
  IL_CHECK(is_contiguous(), "copy_from: destination ", describe(), " is not contiguous");
  if (numel() == 0) return;
  if (!src.is_contiguous()) {
    IL_CHECK(src.device_ == Device::CPU, "copy_from: strided CUDA source ", src.describe(), " is not supported");
    Tensor tmp = empty(shape_, dtype_, Device::CPU);
    gather_strided(static_cast<const char*>(src.data_), static_cast<char*>(tmp.data_), shape_, src.strides_,
                   dtype_size(dtype_));
    copy_from(tmp);
    return;
  }
  if (device_ == Device::CPU && src.device_ == Device::CPU) {
    std::memmove(data_, src.data_, nbytes());
  } else {
    cuda::memcpy(data_, src.data_, nbytes());
  }
}

namespace {
template <class Out>
Out load_elem(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<Out>(static_cast<const float*>(p)[i]);
    case DType::F64: return static_cast<Out>(static_cast<const double*>(p)[i]);
    case DType::F16: return static_cast<Out>(f16_to_f32(static_cast<const std::uint16_t*>(p)[i]));
    case DType::BF16: return static_cast<Out>(bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]));
    case DType::I8: return static_cast<Out>(static_cast<const std::int8_t*>(p)[i]);
    case DType::I32: return static_cast<Out>(static_cast<const std::int32_t*>(p)[i]);
    case DType::I64: return static_cast<Out>(static_cast<const std::int64_t*>(p)[i]);
    case DType::U8: return static_cast<Out>(static_cast<const std::uint8_t*>(p)[i]);
  }
  return Out{};
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
  if (device_ == Device::CUDA) return to(Device::CPU).to(dtype).to(Device::CUDA);
  Tensor src = contiguous();
  if (dtype == dtype_) return src.clone();
  IL_CHECK(is_float(dtype) == is_float(dtype_), "to(): cannot convert ", dtype_name(dtype_), " to ", dtype_name(dtype),
           " (float and integer types do not mix)");
  Tensor t = empty(shape_, dtype, Device::CPU);
  const std::int64_t n = numel();
  const void* s = src.data_;
  switch (dtype) {
    case DType::F32:
      for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = load_elem<float>(s, dtype_, i);
      break;
    case DType::F64:
      for (std::int64_t i = 0; i < n; ++i) t.data<double>()[i] = load_elem<double>(s, dtype_, i);
      break;
    case DType::F16:
      for (std::int64_t i = 0; i < n; ++i) t.data<std::uint16_t>()[i] = f32_to_f16(load_elem<float>(s, dtype_, i));
      break;
    case DType::BF16:
      for (std::int64_t i = 0; i < n; ++i) t.data<std::uint16_t>()[i] = f32_to_bf16(load_elem<float>(s, dtype_, i));
      break;
    case DType::I8:
    case DType::I32:
    case DType::I64:
    case DType::U8:
      for (std::int64_t i = 0; i < n; ++i) {
        auto v = load_elem<std::int64_t>(s, dtype_, i);
        switch (dtype) {
          case DType::I8: t.data<std::int8_t>()[i] = static_cast<std::int8_t>(v); break;
          case DType::I32: t.data<std::int32_t>()[i] = static_cast<std::int32_t>(v); break;
          case DType::I64: t.data<std::int64_t>()[i] = v; break;
          default: t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(v); break;
        }
      }
      break;
  }
  return t;
}

std::vector<double> Tensor::to_double_vector() const {
  if (device_ == Device::CUDA) return to(Device::CPU).to_double_vector();
  Tensor src = contiguous();
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_elem<double>(src.data_, dtype_, static_cast<std::int64_t>(i));
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  auto d = to_double_vector();
  return std::vector<float>(d.begin(), d.end());
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype_) << shape_str(shape_) << ' ' << device_name(device_);
  if (!is_contiguous()) os << " (strided)";
  return os.str();
}

}  // namespace inferlab
