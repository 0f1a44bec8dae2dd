#pragma once
/// @file error.h
/// @brief The one exception type InferLab throws, and the checks that build its messages.
///
/// Every error names what is wrong in words a user can act on ("model.safetensors: tensor
/// 'lm_head.weight': data_offsets end 4096 past the data section (2048 bytes)"). Executables
/// catch it at the top (see cli.h) and print it; nothing is allowed to crash instead.

#include <cstdint>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace inferlab {

/// A user-facing error: a bad file, a bad shape, an unavailable device.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws inferlab::Error with the streamed arguments as the message.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(detail::concat(args...));
}

/// a · b, or an error naming `what` when the product does not fit in 64 bits (sizes computed
/// from user input: a context length times the bytes per token, ...).
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(what, ": ", a, " × ", b, " overflows 64 bits");
  return r;
}

/// a + b, or an error naming `what` when the sum does not fit in 64 bits.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(what, ": ", a, " + ", b, " overflows 64 bits");
  return r;
}

/// `v` as type T, or an error naming `what` when it does not fit. Every id, count, size and
/// offset read from a file goes through it: a plain cast would wrap (2^32 + 7 becomes 7, 2^31 a
/// negative index) and the file would silently mean something else.
template <class T, class U>
T checked_cast(U v, const std::string& what) {
  static_assert(std::is_integral_v<T> && std::is_integral_v<U>, "checked_cast converts integers");
  const T t = static_cast<T>(v);
  // It fits when the round trip gives v back and the sign survived (C++17: CUDA compiles this too).
  if (static_cast<U>(t) != v || (v < U{}) != (t < T{}))
    // Unary + prints 8-bit types as numbers, not as characters.
    fail(what, " = ", +v, " is out of range [", +std::numeric_limits<T>::min(), ", ", +std::numeric_limits<T>::max(), "]");
  return t;
}

/// Runs `f()` and returns its result; if it fails, says where. The few places that know what is
/// being worked on (a loader at one tensor of one file, the generate loop at one token, a cache
/// being allocated) wrap their work in it, so the checks deep inside (a dtype conversion, the
/// sampler, an allocation) need not know:
///
///     with_context([&] { return path + ": tensor '" + name + "'"; }, [&] { return load(name); });
///
/// An inferlab::Error from `f` is thrown again as "<where>: <its message>", unless the message
/// already contains `where`. Running out of memory (std::bad_alloc, or std::length_error from a
/// container asked for more than it can hold) becomes an Error "<where>: out of host memory".
/// `where` is a string, or a callable returning one, which is only called when `f` throws.
template <class Where, class F>
decltype(auto) with_context(const Where& where, F&& f) {
  auto where_text = [&]() -> std::string {
    if constexpr (std::is_invocable_v<const Where&>) return where();
    else return std::string(where);
  };
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    const std::string w = where_text(), what = e.what();
    if (what.find(w) != std::string::npos) throw;
    throw Error(w + ": " + what);
  } catch (const std::bad_alloc&) {
    throw Error(where_text() + ": out of host memory");
  } catch (const std::length_error& e) {
    throw Error(where_text() + ": out of host memory (" + e.what() + ")");
  }
}

}  // namespace inferlab

/// Checks a condition that depends on user input; throws inferlab::Error with the message.
#define IL_CHECK(cond, ...)                     \
  do {                                          \
    if (!(cond)) ::inferlab::fail(__VA_ARGS__); \
  } while (0)
