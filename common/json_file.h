#pragma once
/// @file json_file.h
/// @brief Reading JSON files (nlohmann_json) with errors that name the file and the field.

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace inferlab {

/// Parses a JSON file; throws "cannot open <path>" (also for a FIFO, a directory, ...) or
/// "<path>: not valid JSON: <parser's words>".
nlohmann::json load_json(const std::string& path);

/// An integer JSON value as T; throws naming `what` unless it is an integer that fits T
/// (nlohmann's own get<T>() would wrap 2^32 + 7 to 7 without a word).
template <class T>
T json_integer(const nlohmann::json& v, const std::string& what) {
  IL_CHECK(v.is_number_integer(), what, " must be an integer, got ", v.dump());
  return v.is_number_unsigned() ? checked_cast<T>(v.get<std::uint64_t>(), what)
                                : checked_cast<T>(v.get<std::int64_t>(), what);
}

/// A JSON value as an error message quotes it: at most 60 characters of its text.
inline std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

/// Typed access to the fields of one JSON object; every error names `context` (usually the
/// file) and the field.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string context) : j_(j), ctx_(std::move(context)) {
    IL_CHECK(j_.is_object(), ctx_, ": expected a JSON object");
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  /// The field, which must exist and have type T (std::int64_t, double, bool, std::string).
  template <class T>
  T get(const std::string& key) const {
    IL_CHECK(has(key), ctx_, ": missing field '", key, "'");
    return convert<T>(key, j_[key]);
  }
  /// The field, or `fallback` when it is absent or null.
  template <class T>
  T get_or(const std::string& key, T fallback) const {
    return has(key) ? convert<T>(key, j_[key]) : fallback;
  }
  /// The field as it is, of any JSON type; an error naming it when it is absent or null.
  const nlohmann::json& at(const std::string& key) const {
    IL_CHECK(has(key), ctx_, ": missing field '", key, "'");
    return j_[key];
  }
  /// The field, which must be a JSON array (a list): "missing field" when absent, otherwise the
  /// value it holds instead.
  const nlohmann::json& array(const std::string& key) const {
    const nlohmann::json& v = at(key);
    IL_CHECK(v.is_array(), ctx_, ": field '", key, "' must be a list, got ", json_brief(v));
    return v;
  }
  /// The field, which must be a JSON object.
  const nlohmann::json& object(const std::string& key) const {
    const nlohmann::json& v = at(key);
    IL_CHECK(v.is_object(), ctx_, ": field '", key, "' must be an object, got ", json_brief(v));
    return v;
  }
  const nlohmann::json& json() const { return j_; }
  const std::string& context() const { return ctx_; }

 private:
  template <class T>
  struct is_vector : std::false_type {};
  template <class E>
  struct is_vector<std::vector<E>> : std::true_type {};

  template <class T>
  T convert(const std::string& key, const nlohmann::json& v) const {
    return convert_as<T>("field '" + key + "'", v);
  }
  // `what` is "field 'x'", or "field 'x' entry 3" for a list's entry.
  template <class T>
  T convert_as(const std::string& what, const nlohmann::json& v) const {
    if constexpr (is_vector<T>::value) {
      // A list: each entry of the element's type, checked as a field is (nlohmann would read 2.5
      // as the integer 2, and throw its own type error for a string among integers).
      IL_CHECK(v.is_array(), ctx_, ": ", what, " must be a list, got ", json_brief(v));
      T out;
      for (std::size_t i = 0; i < v.size(); ++i)
        out.push_back(convert_as<typename T::value_type>(what + " entry " + std::to_string(i), v[i]));
      return out;
    } else if constexpr (std::is_same_v<T, bool>) {
      IL_CHECK(v.is_boolean(), ctx_, ": ", what, " must be true or false, got ", v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      IL_CHECK(v.is_number_integer(), ctx_, ": ", what, " must be an integer, got ", v.dump());
      return json_integer<T>(v, ctx_ + ": " + what);
    } else if constexpr (std::is_floating_point_v<T>) {
      IL_CHECK(v.is_number(), ctx_, ": ", what, " must be a number, got ", v.dump());
    } else if constexpr (std::is_same_v<T, std::string>) {
      IL_CHECK(v.is_string(), ctx_, ": ", what, " must be a string, got ", v.dump());
    }
    return v.get<T>();
  }
  const nlohmann::json& j_;
  std::string ctx_;
};

}  // namespace inferlab
