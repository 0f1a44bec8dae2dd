// A Jinja subset interpreter for chat templates (what it covers: chat_template.h). Hand-written
// because Debian packages no C++ Jinja library. Three stages: the lexer cuts the source into
// text and tags, applying Jinja's whitespace rules as transformers configures them; the parser
// builds a tree and refuses what the interpreter does not implement; the interpreter walks the
// tree over JSON values, with Python's semantics for the operations templates use.
#include "common/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <utf8proc.h>

#include "common/error.h"
#include "common/gguf.h"
#include "common/json_file.h"
#include "common/regex.h"

namespace inferlab {
namespace chat_detail {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Text helpers: UTF-8 code points and Python's notion of whitespace.

// The code point at s[i] and its length in bytes (a malformed byte reads as itself, length 1).
std::pair<char32_t, std::size_t> decode_at(const std::string& s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  if (n == 1) return {b, 1};
  char32_t cp = b & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return {cp, n};
}

// Byte offsets where each code point of s starts, and s.size() at the end.
std::vector<std::size_t> code_point_starts(const std::string& s) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < s.size(); i += decode_at(s, i).second) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

// str.isspace() of Python.
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip / lstrip / rstrip of Python: whitespace, or the code points of `chars`.
std::string py_strip(const std::string& s, bool left, bool right, const std::string* chars = nullptr) {
  std::vector<char32_t> set;
  if (chars)
    for (std::size_t i = 0; i < chars->size();) {
      auto [c, n] = decode_at(*chars, i);
      set.push_back(c), i += n;
    }
  auto strip_it = [&](char32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c); };
  const auto starts = code_point_starts(s);
  std::size_t a = 0, b = starts.size() - 1;  // code point indices [a, b)
  if (left)
    while (a < b && strip_it(decode_at(s, starts[a]).first)) ++a;
  if (right)
    while (b > a && strip_it(decode_at(s, starts[b - 1]).first)) --b;
  return s.substr(starts[a], starts[b] - starts[a]);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Code points whose case mapping in Python is not Unicode's simple one (SpecialCasing.txt: ß to
// "SS", the ligatures, Greek with iota subscript, final sigma, dotted İ): refused rather than
// mapped differently.
bool special_casing(char32_t c) {
  return c == 0xDF || c == 0x130 || c == 0x149 || c == 0x1F0 || c == 0x390 || c == 0x3A3 || c == 0x3B0 || c == 0x587 ||
         (c >= 0x1E96 && c <= 0x1E9A) || (c >= 0x1F50 && c <= 0x1F56) || (c >= 0x1F80 && c <= 0x1FFC) ||
         (c >= 0xFB00 && c <= 0xFB06) || (c >= 0xFB13 && c <= 0xFB17);
}

// Title: str.title(); JinjaTitle: Jinja's title filter, which starts a word after a run of
// whitespace, '-', '(', '{', '[' or '<' only (so "it's" stays "It's").
enum class Case { Upper, Lower, Capitalize, Title, JinjaTitle };

// str.upper / lower / capitalize / title of Python, with Unicode's simple case mappings
// (utf8proc); throws `fail_special` for a code point that needs Python's special casing.
template <class Fail>
std::string change_case(const std::string& s, Case mode, Fail fail_special) {
  std::string out;
  bool first = true, prev_cased = false, word_start = true;
  for (std::size_t i = 0; i < s.size();) {
    auto [c, n] = decode_at(s, i);
    i += n;
    if (special_casing(c)) fail_special(c);
    const auto cp = static_cast<utf8proc_int32_t>(c);
    const bool cased = utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
    utf8proc_int32_t m = cp;
    switch (mode) {
      case Case::Upper: m = utf8proc_toupper(cp); break;
      case Case::Lower: m = utf8proc_tolower(cp); break;
      case Case::Capitalize: m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
      case Case::Title: m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp); break;
      case Case::JinjaTitle: m = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp); break;
    }
    word_start = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    append_utf8(out, static_cast<char32_t>(m));
    first = false, prev_cased = cased;
  }
  return out;
}

// repr() of a Python float: the shortest digits that read back, fixed notation for exponents in
// [-4, 16), otherwise d.ddde+XX.
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const std::size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e), sign;
  if (mant[0] == '-') sign = "-", mant = mant.substr(1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else {
      const auto point = static_cast<std::size_t>(exp + 1);
      if (digits.size() <= point) out = digits + std::string(point - digits.size(), '0') + ".0";
      else out = digits.substr(0, point) + "." + digits.substr(point);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + ebuf;
}

// repr() of a Python str.
std::string py_repr_str(const std::string& s) {
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned char>(c));
      out += b;
    } else {
      out += c;
    }
  }
  return out + q;
}

// Python tuples (`(a, b)`, what dict.items() yields) are JSON arrays wrapped in an object under
// this key, so that str() prints them as Python does; every other reader sees the array.
const char* const kTupleKey = "\x01tuple";
bool is_tuple(const Json& j) { return j.is_object() && j.size() == 1 && j.contains(kTupleKey); }
Json make_tuple(Json items) {
  Json t = Json::object();
  t[kTupleKey] = std::move(items);
  return t;
}
const Json& unwrap(const Json& j) { return is_tuple(j) ? j.at(kTupleKey) : j; }

std::string py_repr(const Json& j);

// str() of a Python value made from JSON.
std::string py_str(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  return py_repr(j);
}

std::string py_repr(const Json& j) {
  if (is_tuple(j)) {
    const Json& items = unwrap(j);
    std::string out = "(";
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + py_repr(items[i]);
    return out + (items.size() == 1 ? ",)" : ")");
  }
  switch (j.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<std::int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<std::uint64_t>());
    case Json::value_t::number_float: return py_float(j.get<double>());
    case Json::value_t::string: return py_repr_str(j.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : j.items()) out += (first ? "" : ", ") + py_repr_str(k) + ": " + py_repr(v), first = false;
      return out + "}";
    }
    default: return "";
  }
}

// json.dumps as transformers' tojson filter calls it (ensure_ascii off unless asked).
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    auto [cp, n] = decode_at(s, i);
    i += n;
    char b[16];
    if (cp == '"') out += "\\\"";
    else if (cp == '\\') out += "\\\\";
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (cp == '\b') out += "\\b";
    else if (cp == '\f') out += "\\f";
    else if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += b;
    } else {
      append_utf8(out, cp);
    }
  }
  out += '"';
}

void py_json_dumps(std::string& out, const Json& j, int indent, bool sort_keys, bool ensure_ascii, int level) {
  if (is_tuple(j)) return py_json_dumps(out, unwrap(j), indent, sort_keys, ensure_ascii, level);
  const std::string item_sep = indent < 0 ? ", " : ",";
  auto newline = [&](int l) {
    if (indent >= 0) out += "\n" + std::string(static_cast<std::size_t>(indent * l), ' ');
  };
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_float: {
      const double v = j.get<double>();
      out += std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "Infinity" : "-Infinity") : py_float(v);
      return;
    }
    case Json::value_t::string: json_string(out, j.get<std::string>(), ensure_ascii); return;
    case Json::value_t::array: {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (std::size_t i = 0; i < j.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        py_json_dumps(out, j[i], indent, sort_keys, ensure_ascii, level + 1);
      }
      newline(level);
      out += "]";
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::string> keys;
      for (const auto& [k, v] : j.items()) keys.push_back(k);
      if (sort_keys) std::sort(keys.begin(), keys.end());
      out += "{";
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (i) out += item_sep;
        newline(level + 1);
        json_string(out, keys[i], ensure_ascii);
        out += ": ";
        py_json_dumps(out, j.at(keys[i]), indent, sort_keys, ensure_ascii, level + 1);
      }
      newline(level);
      out += "}";
      return;
    }
    default: out += j.dump(); return;  // integers
  }
}

// ---------------------------------------------------------------------------------------------
// Values: JSON data, Jinja's undefined, a namespace (shared, so that `set ns.x` inside a loop
// is seen after it), or one of the global functions.

struct Value;
using Namespace = std::map<std::string, Value>;

struct Value {
  enum class Kind { Undefined, Data, Namespace, Function } kind = Kind::Undefined;
  Json data;
  std::shared_ptr<Namespace> ns;
  std::string name;  // a function's name; for undefined, what was looked up

  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::Data, v.data = std::move(j);
    return v;
  }
  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_data() const { return kind == Kind::Data; }
  bool is_string() const { return is_data() && data.is_string(); }
  // select / reject / selectattr / rejectattr / map / items give a generator in Jinja: always true, not
  // printable, without a length; only iterating it (for, list, join, first) is allowed.
  bool generator = false;
  // dict.items() / keys() / values(): a view, which str() prints as "dict_items([...])".
  std::string view;
};

// ---------------------------------------------------------------------------------------------
// The syntax tree.

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  enum class Kind {
    // expressions
    Literal,  // value
    Var,      // name
    Attr,     // kids[0].name
    Index,    // kids[0][kids[1]]
    Slice,    // kids[0][kids[1]:kids[2]:kids[3]] (null kids absent)
    Call,     // kids[0](kids[1..]), arg_names
    Filter,   // kids[0] | name(kids[1..]), arg_names
    Test,     // kids[0] is [not] name(kids[1..])
    Neg,      // -kids[0]
    Not,      // not kids[0]
    Binary,   // kids[0] name kids[1]
    And,      // kids[0] and kids[1]
    Or,       // kids[0] or kids[1]
    Cond,     // kids[0] if kids[1] else kids[2] (kids[2] may be null)
    List,     // [kids...]
    Dict,     // {kids[0]: kids[1], ...}
    // statements
    Body,     // kids in order
    Text,     // value (a string)
    Output,   // {{ kids[0] }}
    If,       // kids: cond, body, cond, body, ... [else body]
    For,      // names in kids[0] [if kids[2]] body kids[1] [else kids[3]]
    Set,      // name = kids[0]
    SetAttr,  // name.attr = kids[0]
    Break,
    Continue,
  } kind;
  int line = 0;
  std::string name, attr;
  Json value;
  std::vector<NodePtr> kids;
  std::vector<std::string> names;  // For: the loop variables; Call / Filter / Test: keyword names ("" positional)
  bool negate = false;             // Test: `is not`
};

NodePtr make(Node::Kind k, int line) {
  auto n = std::make_shared<Node>();
  n->kind = k, n->line = line;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Lexer.

struct Token {
  enum class Type { Name, String, Int, Float, Op, End } type;
  std::string text;  // name, operator, or a string literal's value
  Json value;        // numbers
  int line = 0;
};

// A piece of the template: text, or a tag's tokens (the last one End).
struct Segment {
  enum class Type { Text, Output, Statement } type;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin) : origin_(origin) {
    // Jinja normalizes newlines and (keep_trailing_newline off) drops one trailing newline.
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        s_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        s_ += src[i];
      }
    }
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
  }

  std::vector<Segment> run() {
    std::vector<Segment> out;
    std::size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < s_.size()) {
      std::size_t start = std::string::npos;
      for (std::size_t p = s_.find('{', pos); p != std::string::npos && p + 1 < s_.size(); p = s_.find('{', p + 1))
        if (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#') {
          start = p;
          break;
        }
      if (start == std::string::npos) {
        push_text(out, s_.substr(pos), line);
        break;
      }
      std::string text = s_.substr(pos, start - pos);
      const char kind = s_[start + 1];
      const char sign = start + 2 < s_.size() && (s_[start + 2] == '-' || s_[start + 2] == '+') ? s_[start + 2] : 0;
      if (sign == '-') {
        text = py_strip(text, false, true);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: a tag alone on its line
        const std::size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && py_strip(text.substr(l_pos), true, false).empty())
          text = text.substr(0, l_pos);
      }
      const int text_lines =
          static_cast<int>(std::count(s_.begin() + static_cast<long>(pos), s_.begin() + static_cast<long>(start), '\n'));
      push_text(out, text, line);
      line += text_lines;
      std::size_t p = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const std::size_t end = s_.find("#}", p);
        IL_CHECK(end != std::string::npos, origin_, ": line ", line, ": a comment '{#' is never closed");
        line +=
            static_cast<int>(std::count(s_.begin() + static_cast<long>(start), s_.begin() + static_cast<long>(end), '\n'));
        const char end_sign = end > p && (s_[end - 1] == '-' || s_[end - 1] == '+') ? s_[end - 1] : 0;
        pos = after_tag(end + 2, end_sign, true, line);
      } else {
        Segment seg;
        seg.type = kind == '{' ? Segment::Type::Output : Segment::Type::Statement;
        seg.line = line;
        char end_sign = 0;
        std::size_t end = tokenize(p, kind == '{' ? '}' : '%', seg.tokens, line, end_sign);
        pos = after_tag(end, end_sign, kind == '%', line);
        out.push_back(std::move(seg));
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    return out;
  }

 private:
  void push_text(std::vector<Segment>& out, std::string text, int line) {
    if (text.empty()) return;
    Segment seg;
    seg.type = Segment::Type::Text, seg.text = std::move(text), seg.line = line;
    out.push_back(std::move(seg));
  }

  // Where the text after a tag ending at `end` starts: `-` strips the whitespace that follows,
  // trim_blocks one newline after a statement or comment.
  std::size_t after_tag(std::size_t end, char sign, bool block, int& line) {
    if (sign == '-') {
      while (end < s_.size()) {
        auto [cp, n] = decode_at(s_, end);
        if (!py_space(cp)) break;
        if (cp == '\n') ++line;
        end += n;
      }
    } else if (sign != '+' && block && end < s_.size() && s_[end] == '\n') {
      ++end, ++line;
    }
    return end;
  }

  [[noreturn]] void fail_at(int line, const std::string& what) { fail(origin_, ": line ", line, ": ", what); }

  // Tokens from `p` up to the tag's end (`}}` or `%}`, outside brackets); returns the index just
  // past it.
  std::size_t tokenize(std::size_t p, char closer, std::vector<Token>& toks, int& line, char& end_sign) {
    std::vector<char> brackets;
    const int start_line = line;
    while (true) {
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) line += s_[p++] == '\n';
      if (p >= s_.size()) fail_at(start_line, std::string("a tag '") + (closer == '}' ? "{{" : "{%") + "' is never closed");
      if (brackets.empty()) {
        for (char sign : {'-', '+', '\0'}) {
          const std::size_t q = p + (sign ? 1 : 0);
          if ((!sign || s_[p] == sign) && q + 1 < s_.size() && s_[q] == closer && s_[q + 1] == '}' &&
              !(sign == '+' && closer == '}')) {
            end_sign = sign;
            toks.push_back({Token::Type::End, "", {}, line});
            return q + 2;
          }
        }
      }
      const char c = s_[p];
      if (c == '\'' || c == '"') {
        toks.push_back({Token::Type::String, string_literal(p, line), {}, line});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        std::size_t q = p;
        bool is_float = false;
        while (q < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
        if (q + 1 < s_.size() && s_[q] == '.' && std::isdigit(static_cast<unsigned char>(s_[q + 1]))) {
          is_float = true, ++q;
          while (q < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
        }
        if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
          std::size_t r = q + 1;
          if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) ++r;
          if (r < s_.size() && std::isdigit(static_cast<unsigned char>(s_[r]))) {
            is_float = true, q = r;
            while (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) ++q;
          }
        }
        std::string num;
        for (std::size_t i = p; i < q; ++i)
          if (s_[i] != '_') num += s_[i];
        Token t{is_float ? Token::Type::Float : Token::Type::Int, num, {}, line};
        t.value = is_float ? Json(std::stod(num)) : Json(std::stoll(num));
        toks.push_back(t);
        p = q;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t q = p;
        while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
        toks.push_back({Token::Type::Name, s_.substr(p, q - p), {}, line});
        p = q;
      } else {
        static const char* const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                          ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        std::string op;
        for (const char* o : ops)
          if (s_.compare(p, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (op.empty()) fail_at(line, std::string("unexpected character '") + c + "' in a tag");
        if (op == "(" || op == "[" || op == "{") brackets.push_back(op[0]);
        if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) fail_at(line, "unbalanced '" + op + "'");
          brackets.pop_back();
        }
        toks.push_back({Token::Type::Op, op, {}, line});
        p += op.size();
      }
    }
  }

  // A quoted literal at s_[p], decoded as Python's unicode-escape does; advances p past it.
  std::string string_literal(std::size_t& p, int& line) {
    const char q = s_[p++];
    std::string out;
    while (true) {
      if (p >= s_.size()) fail_at(line, "a string literal is never closed");
      const char c = s_[p++];
      if (c == q) return out;
      if (c == '\n') ++line;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= s_.size()) fail_at(line, "a string literal is never closed");
      const char e = s_[p++];
      auto hex = [&](std::size_t n) {
        IL_CHECK(p + n <= s_.size(), origin_, ": line ", line, ": a truncated escape in a string literal");
        const auto v = static_cast<char32_t>(std::stoul(s_.substr(p, n), nullptr, 16));
        p += n;
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\n': ++line; break;
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': append_utf8(out, hex(8)); break;
        default: out += '\\', out += e; break;  // Python keeps an unknown escape as written
      }
    }
  }

  std::string s_;
  const std::string& origin_;
};

// ---------------------------------------------------------------------------------------------
// Parser.

const std::set<std::string> kFilters = {"trim",   "length",     "count",      "tojson", "upper",      "lower", "default",
                                        "d",      "first",      "last",       "join",   "capitalize", "title", "replace",
                                        "string", "items",      "list",       "int",    "float",      "abs",   "select",
                                        "reject", "selectattr", "rejectattr", "map",    "safe"};
const std::set<std::string> kTests = {"defined", "undefined",   "none",     "string",   "number", "integer", "float",
                                      "boolean", "mapping",     "iterable", "sequence", "true",   "false",   "odd",
                                      "even",    "divisibleby", "equalto",  "eq",       "ne",     "==",      "!="};
const std::set<std::string> kFunctions = {"raise_exception", "strftime_now", "namespace", "range", "dict"};
const std::set<std::string> kStringMethods = {"strip", "lstrip", "rstrip",  "startswith", "endswith",  "split",
                                              "upper", "lower",  "replace", "title",      "capitalize"};
const std::set<std::string> kDictMethods = {"items", "keys", "values", "get"};

class Parser {
 public:
  Parser(std::vector<Segment> segs, const std::string& origin) : segs_(std::move(segs)), origin_(origin) {}

  NodePtr parse_template() {
    std::string stop;
    NodePtr body = parse_body({}, stop);
    return body;
  }

 private:
  [[noreturn]] void fail_at(int line, const std::string& what) const { fail(origin_, ": line ", line, ": ", what); }

  // Statements up to one whose keyword is in `stops` (returned in `stop`, its tokens in toks_).
  // Nesting (statements in statements, parentheses, operators) is bounded, so that no template
  // can exhaust the stack.
  static constexpr int kMaxDepth = 200;
  struct Deeper {
    Parser& p;
    Deeper(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail_at(line, "the template nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~Deeper() { --p.depth_; }
  };
  int depth_ = 0;

  NodePtr parse_body(const std::set<std::string>& stops, std::string& stop) {
    const Deeper guard(*this, seg_ < segs_.size() ? segs_[seg_].line : 0);
    auto body = make(Node::Kind::Body, seg_ < segs_.size() ? segs_[seg_].line : 0);
    while (seg_ < segs_.size()) {
      Segment& seg = segs_[seg_++];
      if (seg.type == Segment::Type::Text) {
        auto t = make(Node::Kind::Text, seg.line);
        t->value = seg.text;
        body->kids.push_back(t);
        continue;
      }
      toks_ = &seg.tokens, i_ = 0;
      if (seg.type == Segment::Type::Output) {
        auto o = make(Node::Kind::Output, seg.line);
        o->kids.push_back(expression());
        expect_end();
        body->kids.push_back(o);
        continue;
      }
      const Token& kw = next();
      if (kw.type != Token::Type::Name) fail_at(kw.line, "a statement must start with a keyword");
      if (stops.count(kw.text)) {
        stop = kw.text;
        return body;
      }
      body->kids.push_back(statement(kw));
    }
    if (!stops.empty()) fail_at(segs_.empty() ? 0 : segs_.back().line, "missing '{% " + *stops.rbegin() + " %}'");
    return body;
  }

  NodePtr statement(const Token& kw) {
    const std::string& k = kw.text;
    if (k == "if") {
      auto n = make(Node::Kind::If, kw.line);
      n->kids.push_back(expression());
      expect_end();
      while (true) {
        std::string stop;
        n->kids.push_back(parse_body({"elif", "else", "endif"}, stop));
        if (stop == "endif") break;
        if (stop == "elif") {
          n->kids.push_back(expression());
          expect_end();
          continue;
        }
        expect_end();
        n->kids.push_back(parse_body({"endif"}, stop));
        break;
      }
      expect_end();
      return n;
    }
    if (k == "for") {
      auto n = make(Node::Kind::For, kw.line);
      do {
        const Token& v = next();
        if (v.type != Token::Type::Name) fail_at(v.line, "expected a loop variable name after 'for'");
        n->names.push_back(v.text);
      } while (accept_op(","));
      if (!accept_name("in")) fail_at(kw.line, "expected 'in' in the 'for' statement");
      n->kids.push_back(expression(false));
      n->kids.push_back(nullptr);
      n->kids.push_back(accept_name("if") ? expression() : nullptr);
      n->kids.push_back(nullptr);
      if (peek().type == Token::Type::Name && peek().text == "recursive")
        fail_at(kw.line, "the 'recursive' loop is not supported");
      expect_end();
      std::string stop;
      n->kids[1] = parse_body({"else", "endfor"}, stop);
      if (stop == "else") {
        expect_end();
        n->kids[3] = parse_body({"endfor"}, stop);
      }
      expect_end();
      return n;
    }
    if (k == "set") {
      const Token& v = next();
      if (v.type != Token::Type::Name) fail_at(v.line, "expected a name after 'set'");
      auto n = make(Node::Kind::Set, kw.line);
      n->name = v.text;
      if (accept_op(".")) {
        const Token& a = next();
        if (a.type != Token::Type::Name) fail_at(a.line, "expected an attribute name in 'set'");
        n->kind = Node::Kind::SetAttr, n->attr = a.text;
      }
      if (peek().type == Token::Type::End) fail_at(kw.line, "the block form '{% set x %}…{% endset %}' is not supported");
      if (peek().type == Token::Type::Op && peek().text == ",")
        fail_at(kw.line, "'set' with several names (tuple unpacking) is not supported");
      if (!accept_op("=")) fail_at(kw.line, "expected '=' in the 'set' statement");
      n->kids.push_back(expression());
      expect_end();
      return n;
    }
    if (k == "break" || k == "continue") {
      expect_end();
      return make(k == "break" ? Node::Kind::Break : Node::Kind::Continue, kw.line);
    }
    if (k == "generation") {  // transformers' assistant-mask tag: renders its body
      expect_end();
      std::string stop;
      auto body = parse_body({"endgeneration"}, stop);
      expect_end();
      return body;
    }
    if (k.rfind("end", 0) == 0 || k == "elif" || k == "else")
      fail_at(kw.line, "'{% " + k + " %}' has no matching opening statement");
    fail_at(kw.line, "the '{% " + k + " %}' statement is not supported");
  }

  // Tokens.
  const Token& peek(std::size_t ahead = 0) const {
    const std::size_t j = std::min(i_ + ahead, toks_->size() - 1);
    return (*toks_)[j];
  }
  const Token& next() {
    const Token& t = peek();
    if (i_ < toks_->size() - 1) ++i_;
    return t;
  }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::Op && peek(ahead).text == op;
  }
  bool is_name(const char* name, std::size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::Name && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail_at(peek().line, std::string("expected '") + op + "', found " + describe(peek()));
  }
  void expect_end() {
    if (peek().type != Token::Type::End) fail_at(peek().line, "unexpected " + describe(peek()) + " at the end of a tag");
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::End: return "the end of the tag";
      case Token::Type::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  // Expressions, in Jinja's precedence order.
  NodePtr expression(bool with_condition = true) {
    const Deeper guard(*this, peek().line);
    NodePtr e = or_expr();
    if (with_condition && is_name("if")) {
      const int line = next().line;
      auto c = make(Node::Kind::Cond, line);
      c->kids.push_back(e);
      c->kids.push_back(or_expr());
      c->kids.push_back(accept_name("else") ? expression() : nullptr);
      return c;
    }
    return e;
  }
  NodePtr binary(Node::Kind k, NodePtr a, NodePtr b, int line, std::string op = "") {
    auto n = make(k, line);
    n->name = std::move(op);
    n->kids = {std::move(a), std::move(b)};
    return n;
  }
  // A left-associative level: operands from `operand`, joined by any of `ops`.
  NodePtr chain(NodePtr (Parser::*operand)(), std::initializer_list<const char*> ops) {
    NodePtr e = (this->*operand)();
    while (true) {
      const Token& t = peek();
      const bool hit = (t.type == Token::Type::Op || t.type == Token::Type::Name) &&
                       std::any_of(ops.begin(), ops.end(), [&](const char* o) { return t.text == o; });
      if (!hit) return e;
      next();
      const Node::Kind k = t.text == "or" ? Node::Kind::Or : t.text == "and" ? Node::Kind::And : Node::Kind::Binary;
      e = binary(k, e, (this->*operand)(), t.line, t.text);
    }
  }
  NodePtr or_expr() { return chain(&Parser::and_expr, {"or"}); }
  NodePtr and_expr() { return chain(&Parser::not_expr, {"and"}); }
  NodePtr math1() { return chain(&Parser::concat, {"+", "-"}); }
  NodePtr concat() { return chain(&Parser::math2, {"~"}); }
  NodePtr math2() { return chain(&Parser::power, {"*", "/", "//", "%"}); }
  NodePtr power() { return chain(&Parser::filtered_unary, {"**"}); }
  NodePtr filtered_unary() { return unary(true); }
  NodePtr not_expr() {
    if (is_name("not")) {
      auto n = make(Node::Kind::Not, next().line);
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  NodePtr compare() {
    NodePtr e = math1();
    while (true) {
      const Token& t = peek();
      std::string op;
      if (t.type == Token::Type::Op &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">="))
        op = t.text, next();
      else if (is_name("in")) op = "in", next();
      else if (is_name("not") && is_name("in", 1)) op = "not in", next(), next();
      else return e;
      e = binary(Node::Kind::Binary, e, math1(), t.line, op);
    }
  }
  NodePtr unary(bool with_filter) {
    const Deeper guard(*this, peek().line);
    NodePtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = unary(false);
      if (t.text == "-") {
        auto n = make(Node::Kind::Neg, t.line);
        n->kids.push_back(e);
        e = n;
      }
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(e) : e;
  }
  NodePtr primary() {
    const Token& t = next();
    switch (t.type) {
      case Token::Type::String: {
        auto n = make(Node::Kind::Literal, t.line);
        std::string s = t.text;
        while (peek().type == Token::Type::String) s += next().text;  // adjacent literals join
        n->value = s;
        return n;
      }
      case Token::Type::Int:
      case Token::Type::Float: {
        auto n = make(Node::Kind::Literal, t.line);
        n->value = t.value;
        return n;
      }
      case Token::Type::Name: {
        auto n = make(Node::Kind::Literal, t.line);
        if (t.text == "true" || t.text == "True") n->value = true;
        else if (t.text == "false" || t.text == "False") n->value = false;
        else if (t.text == "none" || t.text == "None") n->value = nullptr;
        else n->kind = Node::Kind::Var, n->name = t.text;
        return n;
      }
      case Token::Type::Op:
        if (t.text == "(") {
          NodePtr e = expression();
          if (is_op(",")) {  // a tuple: a list here
            auto l = make(Node::Kind::List, t.line);
            l->attr = "tuple";
            l->kids.push_back(e);
            while (accept_op(",") && !is_op(")")) l->kids.push_back(expression());
            e = l;
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") return collection(Node::Kind::List, "]", t.line);
        if (t.text == "{") return collection(Node::Kind::Dict, "}", t.line);
        break;
      default: break;
    }
    fail_at(t.line, "unexpected " + describe(t) + " in an expression");
  }
  // A list or dict literal's items up to `close` (a dict's as key, value pairs).
  NodePtr collection(Node::Kind k, const char* close, int line) {
    auto n = make(k, line);
    while (!is_op(close)) {
      n->kids.push_back(expression());
      if (k == Node::Kind::Dict) {
        expect_op(":");
        n->kids.push_back(expression());
      }
      if (!accept_op(",")) break;
    }
    expect_op(close);
    return n;
  }
  // Call arguments after '(': positional, then name=value.
  void arguments(const NodePtr& n) {
    while (!is_op(")")) {
      if (peek().type == Token::Type::Name && is_op("=", 1)) {
        n->names.push_back(next().text);
        next();
      } else {
        n->names.push_back("");
      }
      n->kids.push_back(expression());
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }
  NodePtr postfix(NodePtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        const Token& a = next();
        if (a.type != Token::Type::Name && a.type != Token::Type::Int)
          fail_at(a.line, "expected an attribute name after '.'");
        auto n = make(a.type == Token::Type::Name ? Node::Kind::Attr : Node::Kind::Index, line);
        n->kids.push_back(e);
        if (a.type == Token::Type::Name) {
          n->name = a.text;
        } else {
          auto lit = make(Node::Kind::Literal, line);
          lit->value = a.value;
          n->kids.push_back(lit);
        }
        e = n;
      } else if (is_op("[")) {
        const int line = next().line;
        NodePtr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (accept_op(":")) {
            if (++colons > 2) fail_at(line, "a slice takes at most three parts");
            continue;
          }
          if (parts[colons]) fail_at(line, "expected ':' or ']' in a subscript");
          parts[colons] = expression();
        }
        expect_op("]");
        if (colons == 0) {
          if (!parts[0]) fail_at(line, "an empty subscript '[]'");
          e = binary(Node::Kind::Index, e, parts[0], line);
        } else {
          auto n = make(Node::Kind::Slice, line);
          n->kids = {e, parts[0], parts[1], parts[2]};
          e = n;
        }
      } else if (is_op("(")) {
        const int line = next().line;
        auto n = make(Node::Kind::Call, line);
        n->kids.push_back(e);
        arguments(n);
        n->names.insert(n->names.begin(), "");
        check_call(*n);
        e = n;
      } else {
        return e;
      }
    }
  }
  void check_call(const Node& call) {
    const Node& callee = *call.kids[0];
    if (callee.kind == Node::Kind::Var) {
      if (!kFunctions.count(callee.name)) fail_at(call.line, "the function '" + callee.name + "' is not supported");
    } else if (callee.kind == Node::Kind::Attr) {
      if (!kStringMethods.count(callee.name) && !kDictMethods.count(callee.name))
        fail_at(call.line, "the method '." + callee.name + "()' is not supported");
    } else {
      fail_at(call.line, "calling this kind of expression is not supported");
    }
  }
  NodePtr filters(NodePtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        const Token& f = next();
        if (f.type != Token::Type::Name) fail_at(line, "expected a filter name after '|'");
        if (!kFilters.count(f.text)) fail_at(line, "the filter '" + f.text + "' is not supported");
        auto n = make(Node::Kind::Filter, line);
        n->name = f.text;
        n->kids.push_back(e);
        n->names.push_back("");
        if (accept_op("(")) arguments(n);
        e = n;
      } else if (is_name("is")) {
        const int line = next().line;
        auto n = make(Node::Kind::Test, line);
        n->negate = accept_name("not");
        const Token& t = next();
        if (t.type != Token::Type::Name && !(t.type == Token::Type::Op && (t.text == "==" || t.text == "!=")))
          fail_at(line, "expected a test name after 'is'");
        if (!kTests.count(t.text)) fail_at(line, "the test 'is " + t.text + "' is not supported");
        n->name = t.text;
        n->kids.push_back(e);
        n->names.push_back("");
        if (accept_op("(")) {
          arguments(n);
        } else {
          const Token& a = peek();
          const bool arg =
              (a.type == Token::Type::Name || a.type == Token::Type::String || a.type == Token::Type::Int ||
               a.type == Token::Type::Float || (a.type == Token::Type::Op && (a.text == "[" || a.text == "{"))) &&
              !is_name("else") && !is_name("or") && !is_name("and");
          if (arg) {
            n->kids.push_back(postfix(primary()));
            n->names.push_back("");
          }
        }
        e = n;
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segs_;
  std::size_t seg_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  std::size_t i_ = 0;
  const std::string& origin_;
};

// ---------------------------------------------------------------------------------------------
// Interpreter.

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(std::size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

class Interpreter {
 public:
  static constexpr std::size_t kMaxItems = 1 << 20;  // range() and string repetition stay below this

  Interpreter(const std::string& origin, const std::optional<std::tm>& frozen, const RenderBudget& budget)
      : origin_(origin), frozen_(frozen), budget_(budget) {}

  std::string run(const Node& root, std::unordered_map<std::string, Value> context) {
    frames_.push_back(std::move(context));
    frames_.emplace_back();
    std::string out;
    exec(root, out);
    return out;
  }

 private:
  enum class Flow { Normal, Break, Continue };

  template <class... What>
  [[noreturn]] void fail_at(int line, const What&... what) const {
    fail(origin_, ": line ", line, ": ", what...);
  }

  // The render's budget (RenderBudget): every statement, expression and loop iteration is a
  // step, and every byte of text or data made or copied is charged, so that a template (a
  // downloaded file's own) can neither run nor grow without end.
  void step(int line) const {
    if (++steps_ > budget_.steps)
      fail_at(line, "the template ran past its budget of ", budget_.steps,
              " steps (a loop that does not end, or one far too large for a prompt)");
  }
  void charge(std::size_t bytes, int line) const {
    bytes_ += bytes;
    if (bytes_ > budget_.bytes)
      fail_at(line, "the template made more than ", budget_.bytes >> 20, " MiB of text and data (its budget)");
  }
  // What a value holds, roughly in bytes (a copy of it costs that much).
  static std::size_t json_bytes(const Json& j) {
    std::size_t b = 16;
    if (j.is_string()) b += j.get_ref<const std::string&>().size();
    else if (j.is_array())
      for (const Json& e : j) b += json_bytes(e);
    else if (j.is_object())
      for (const auto& [k, v] : j.items()) b += k.size() + json_bytes(v);
    return b;
  }
  static std::size_t value_bytes(const Value& v) { return v.is_data() ? json_bytes(v.data) : 16; }

  Flow exec(const Node& n, std::string& out) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::Body:
        for (const auto& k : n.kids) {
          const Flow f = exec(*k, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case Node::Kind::Text:
        charge(n.value.get_ref<const std::string&>().size(), n.line);
        out += n.value.get_ref<const std::string&>();
        return Flow::Normal;
      case Node::Kind::Output: {
        const std::string text = to_str(eval(*n.kids[0]));
        charge(text.size(), n.line);
        out += text;
        return Flow::Normal;
      }
      case Node::Kind::If: {
        std::size_t i = 0;
        for (; i + 1 < n.kids.size(); i += 2)
          if (truthy(eval(*n.kids[i]))) return exec(*n.kids[i + 1], out);
        if (i < n.kids.size()) return exec(*n.kids[i], out);
        return Flow::Normal;
      }
      case Node::Kind::For: exec_for(n, out); return Flow::Normal;
      case Node::Kind::Set: frames_.back()[n.name] = eval(*n.kids[0]); return Flow::Normal;
      case Node::Kind::SetAttr: {
        Value target = lookup(n.name);
        if (target.kind != Value::Kind::Namespace)
          fail_at(n.line, "'set " + n.name + "." + n.attr + "' needs '" + n.name + "' to be a namespace()");
        (*target.ns)[n.attr] = eval(*n.kids[0]);
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      default: fail_at(n.line, "internal error: an expression where a statement belongs");
    }
  }

  void exec_for(const Node& n, std::string& out) {
    std::vector<Json> items = iterate(eval_ref(*n.kids[0]).get(), n.line);
    auto bind = [&](std::unordered_map<std::string, Value>& frame, const Json& whole) {
      if (n.names.size() == 1) {
        frame[n.names[0]] = Value::of(whole);
        return;
      }
      const Json& item = unwrap(whole);
      if (!item.is_array() || item.size() != n.names.size())
        fail_at(n.line, "cannot unpack " + py_repr(item) + " into " + std::to_string(n.names.size()) + " loop variables");
      for (std::size_t k = 0; k < n.names.size(); ++k) frame[n.names[k]] = Value::of(item[k]);
    };
    if (n.kids[2]) {  // `for x in xs if cond`: the loop sees only the items that pass
      std::vector<Json> kept;
      for (const Json& item : items) {
        frames_.emplace_back();
        bind(frames_.back(), item);
        const bool keep = truthy(eval(*n.kids[2]));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.kids[3]) exec(*n.kids[3], out);
      return;
    }
    const auto len = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < len; ++i) {
      step(n.line);
      frames_.emplace_back();
      auto& frame = frames_.back();
      bind(frame, items[static_cast<std::size_t>(i)]);
      Json loop = {{"index", i + 1},  {"index0", i},          {"revindex", len - i}, {"revindex0", len - i - 1},
                   {"first", i == 0}, {"last", i == len - 1}, {"length", len}};
      if (i > 0) loop["previtem"] = items[static_cast<std::size_t>(i - 1)];
      if (i + 1 < len) loop["nextitem"] = items[static_cast<std::size_t>(i + 1)];
      charge(json_bytes(loop) + json_bytes(items[static_cast<std::size_t>(i)]), n.line);
      frame["loop"] = Value::of(std::move(loop));
      const Flow f = exec(*n.kids[1], out);
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  std::vector<Json> iterate(const Value& v, int line) const {
    if (v.is_undefined()) return {};
    if (!v.is_data()) fail_at(line, "this value cannot be iterated");
    const Json& j = unwrap(v.data);
    std::vector<Json> items;
    charge(json_bytes(j), line);  // the items are copied
    if (j.is_array()) {
      items.assign(j.begin(), j.end());
    } else if (j.is_object()) {
      for (const auto& [k, val] : j.items()) items.emplace_back(k);
    } else if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      const auto starts = code_point_starts(s);
      for (std::size_t k = 0; k + 1 < starts.size(); ++k) items.emplace_back(s.substr(starts[k], starts[k + 1] - starts[k]));
    } else {
      fail_at(line, "a " + std::string(j.type_name()) + " value (" + py_repr(j) + ") cannot be iterated");
    }
    return items;
  }

  // The stored value of a variable, or null (it stays in place while an expression is evaluated).
  const Value* find(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      auto it = f->find(name);
      if (it != f->end()) return &it->second;
    }
    return nullptr;
  }

  // An expression's value, read in place when it is a variable: `messages` is subscripted on
  // every turn, and copying it each time would make rendering quadratic in the conversation.
  struct Ref {
    Value own;
    const Value* stored = nullptr;
    const Value& get() const { return stored ? *stored : own; }
  };
  Ref eval_ref(const Node& n) {
    if (n.kind == Node::Kind::Var)
      if (const Value* v = find(n.name)) return {Value{}, v};
    return {eval(n), nullptr};
  }

  Value lookup(const std::string& name) const {
    if (const Value* v = find(name)) return *v;
    if (kFunctions.count(name)) {
      Value v;
      v.kind = Value::Kind::Function, v.name = name;
      return v;
    }
    return Value::undefined("'" + name + "'");
  }

  static bool truthy(const Value& v) {
    if (v.generator) return true;
    switch (v.kind) {
      case Value::Kind::Undefined: return false;
      case Value::Kind::Data: {
        const Json& j = unwrap(v.data);
        if (j.is_null()) return false;
        if (j.is_boolean()) return j.get<bool>();
        if (j.is_number_float()) return j.get<double>() != 0;
        if (j.is_number()) return j.get<std::int64_t>() != 0;
        if (j.is_string()) return !j.get_ref<const std::string&>().empty();
        return !j.empty();  // lists, dicts
      }
      default: return true;
    }
  }

  std::string to_str(const Value& v) const {
    if (v.generator) fail(origin_, ": ", kGeneratorUse, "printed");
    switch (v.kind) {
      case Value::Kind::Undefined: return "";
      case Value::Kind::Data: return v.view.empty() ? py_str(v.data) : v.view + "(" + py_repr(v.data) + ")";
      case Value::Kind::Namespace: return "<Namespace>";
      default: return "<function " + v.name + ">";
    }
  }

  // The value as JSON, for operations on data; undefined and the others are an error.
  static constexpr const char* kGeneratorUse =
      "the result of select / reject / selectattr / rejectattr / map / items is a generator in Jinja, add '| list' before "
      "it is ";
  const Json& data(const Value& v, int line, const char* what) const {
    if (v.generator) fail_at(line, kGeneratorUse, "used in ", what);
    if (v.is_data()) return v.data;
    if (v.is_undefined()) fail_at(line, v.name + " is undefined (" + what + ")");
    fail_at(line, std::string("a namespace or function cannot be used in ") + what);
  }

  static bool numeric(const Json& j) { return j.is_number() || j.is_boolean(); }
  static bool integral(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
  static double as_double(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }
  static std::int64_t as_int(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<std::int64_t>(); }

  static bool equal(const Json& a, const Json& b) {
    if (numeric(a) && numeric(b)) {
      if (integral(a) && integral(b)) return as_int(a) == as_int(b);
      return as_double(a) == as_double(b);
    }
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!equal(a[i], b[i])) return false;
      return true;
    }
    if (a.is_object()) {
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a.items())
        if (!b.contains(k) || !equal(v, b.at(k))) return false;
      return true;
    }
    return a == b;
  }
  static bool equal(const Value& a, const Value& b) {
    if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
    if (a.is_data() && b.is_data()) return equal(a.data, b.data);
    if (a.kind == Value::Kind::Namespace && b.kind == Value::Kind::Namespace) return a.ns == b.ns;
    return a.kind == b.kind && a.name == b.name;
  }

  // a < b (-1), a == b (0), a > b (1) for numbers, strings and lists.
  int order(const Json& a, const Json& b, int line) const {
    if (numeric(a) && numeric(b)) {
      if (integral(a) && integral(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
      return as_double(a) < as_double(b) ? -1 : as_double(a) > as_double(b);
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
      return c < 0 ? -1 : c > 0;
    }
    if (a.is_array() && b.is_array()) {
      for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
        if (!equal(a[i], b[i])) return order(a[i], b[i], line);
      return a.size() < b.size() ? -1 : a.size() > b.size();
    }
    fail_at(line, "cannot compare " + py_repr(a) + " with " + py_repr(b));
  }

  bool contains(const Value& container, const Value& item, int line) const {
    if (container.is_undefined()) return false;
    const Json& c = unwrap(data(container, line, "'in'"));
    if (c.is_string()) {
      const Json& i = data(item, line, "'in'");
      if (!i.is_string()) fail_at(line, "'in <string>' needs a string on the left, got " + py_repr(i));
      return c.get_ref<const std::string&>().find(i.get_ref<const std::string&>()) != std::string::npos;
    }
    if (c.is_array()) {
      for (const Json& e : c)
        if (item.is_data() && equal(e, item.data)) return true;
      return false;
    }
    if (c.is_object()) return item.is_string() && c.contains(item.data.get_ref<const std::string&>());
    fail_at(line, "'in' needs a string, list or dict on the right, got " + py_repr(c));
  }

  Value arithmetic(const std::string& op, const Value& va, const Value& vb, int line) const {
    if (op == "~") {
      std::string x = to_str(va), y = to_str(vb);
      charge(x.size() + y.size(), line);  // before the sum is made: doubling a string stops at the budget
      return Value::of(x + y);
    }
    const Json& a = data(va, line, ("'" + op + "'").c_str());
    const Json& b = data(vb, line, ("'" + op + "'").c_str());
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        charge(a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size(), line);
        return Value::of(a.get<std::string>() + b.get<std::string>());
      }
      if (a.is_array() && b.is_array()) {
        Json r = a;
        for (const Json& e : b) r.push_back(e);
        return Value::of(r);
      }
    }
    if (op == "*" && ((a.is_array() && integral(b)) || (integral(a) && b.is_array()))) {
      const Json& l = a.is_array() ? a : b;
      const std::int64_t n = as_int(a.is_array() ? b : a);
      if (n > 0 && l.size() * static_cast<std::size_t>(n) > kMaxItems)
        fail_at(line, "repeating a list ", n, " times makes more than ", kMaxItems, " items");
      if (n > 0) charge(json_bytes(l) * static_cast<std::size_t>(n), line);
      Json r = Json::array();
      for (std::int64_t k = 0; k < n; ++k)
        for (const Json& e : l) r.push_back(e);
      return Value::of(r);
    }
    if (op == "*" && ((a.is_string() && integral(b)) || (integral(a) && b.is_string()))) {
      const std::string& s = a.is_string() ? a.get_ref<const std::string&>() : b.get_ref<const std::string&>();
      std::string r;
      const std::int64_t n = as_int(a.is_string() ? b : a);
      if (n > 0 && s.size() * static_cast<std::size_t>(n) > kMaxItems * 64)
        fail_at(line, "repeating a string ", n, " times makes more than ", kMaxItems * 64, " bytes");
      if (n > 0) charge(s.size() * static_cast<std::size_t>(n), line);
      for (std::int64_t k = 0; k < n; ++k) r += s;
      return Value::of(r);
    }
    if (!numeric(a) || !numeric(b))
      fail_at(line, "unsupported operand types for " + op + ": " + py_repr(a) + " and " + py_repr(b));
    const bool ints = integral(a) && integral(b);
    if (op == "/") {
      if (as_double(b) == 0) fail_at(line, "division by zero");
      return Value::of(as_double(a) / as_double(b));
    }
    if (ints) {
      const std::int64_t x = as_int(a), y = as_int(b);
      if (op == "+") return Value::of(x + y);
      if (op == "-") return Value::of(x - y);
      if (op == "*") return Value::of(x * y);
      if (op == "**")
        return y >= 0 ? Value::of(static_cast<std::int64_t>(std::llround(std::pow(x, y)))) : Value::of(std::pow(x, y));
      if (y == 0) fail_at(line, "integer division or modulo by zero");
      std::int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
      return Value::of(op == "//" ? q : r);
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "**") return Value::of(std::pow(x, y));
    if (y == 0) fail_at(line, "float division or modulo by zero");
    const double q = std::floor(x / y);
    return Value::of(op == "//" ? q : x - q * y);
  }

  // Python's obj[key] then getattr, as Jinja's subscript does.
  Value get_item(const Value& obj, const Value& key, int line) const {
    if (obj.is_undefined()) fail_at(line, obj.name + " is undefined (subscripted)");
    if (obj.kind == Value::Kind::Namespace) {
      if (!key.is_string()) return Value::undefined("a namespace item");
      auto it = obj.ns->find(key.data.get<std::string>());
      return it == obj.ns->end() ? Value::undefined("'" + key.data.get<std::string>() + "'") : it->second;
    }
    if (!obj.is_data() || !key.is_data()) return Value::undefined("an item");
    const Json& o = unwrap(obj.data);
    const Json& k = key.data;
    if (o.is_object() && k.is_string()) {
      auto it = o.find(k.get<std::string>());
      if (it == o.end()) return Value::undefined("'" + k.get<std::string>() + "'");
      return Value::of(*it);
    }
    if ((o.is_array() || o.is_string()) && integral(k)) {
      std::int64_t i = as_int(k);
      if (o.is_array()) {
        const auto n = static_cast<std::int64_t>(o.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(as_int(k)));
        return Value::of(o[static_cast<std::size_t>(i)]);
      }
      const std::string& s = o.get_ref<const std::string&>();
      const auto starts = code_point_starts(s);
      const auto n = static_cast<std::int64_t>(starts.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(as_int(k)));
      const auto u = static_cast<std::size_t>(i);
      return Value::of(s.substr(starts[u], starts[u + 1] - starts[u]));
    }
    return Value::undefined(k.is_string() ? "'" + k.get<std::string>() + "'" : "an item");
  }

  Value slice(const Value& obj, const Value* parts[3], int line) const {
    const Json& o = unwrap(data(obj, line, "a slice"));
    if (!o.is_array() && !o.is_string()) fail_at(line, "cannot slice " + py_repr(o));
    std::vector<std::size_t> starts;
    std::int64_t n;
    if (o.is_string())
      starts = code_point_starts(o.get_ref<const std::string&>()), n = static_cast<std::int64_t>(starts.size()) - 1;
    else n = static_cast<std::int64_t>(o.size());
    std::optional<std::int64_t> p[3];
    for (int k = 0; k < 3; ++k)
      if (parts[k] && !(parts[k]->is_data() && parts[k]->data.is_null())) {
        const Json& v = data(*parts[k], line, "a slice");
        if (!integral(v)) fail_at(line, "slice indices must be integers, got " + py_repr(v));
        p[k] = as_int(v);
      }
    const std::int64_t step = p[2].value_or(1);
    if (step == 0) fail_at(line, "slice step cannot be zero");
    auto clamp = [&](std::optional<std::int64_t> v, std::int64_t def, std::int64_t lo, std::int64_t hi) {
      if (!v) return def;
      std::int64_t x = *v < 0 ? *v + n : *v;
      return std::clamp(x, lo, hi);
    };
    const std::int64_t begin = step > 0 ? clamp(p[0], 0, 0, n) : clamp(p[0], n - 1, -1, n - 1);
    const std::int64_t end = step > 0 ? clamp(p[1], n, 0, n) : clamp(p[1], -1, -1, n - 1);
    std::vector<std::int64_t> idx;
    for (std::int64_t i = begin; step > 0 ? i < end : i > end; i += step) idx.push_back(i);
    if (o.is_array()) {
      Json r = Json::array();
      for (std::int64_t i : idx) r.push_back(o[static_cast<std::size_t>(i)]);
      return Value::of(is_tuple(obj.data) ? make_tuple(r) : r);
    }
    const std::string& s = o.get_ref<const std::string&>();
    std::string r;
    for (std::int64_t i : idx) {
      const auto u = static_cast<std::size_t>(i);
      r += s.substr(starts[u], starts[u + 1] - starts[u]);
    }
    return Value::of(r);
  }

  // An expression's value, its step and its bytes charged.
  Value eval(const Node& n) {
    step(n.line);
    Value v = compute(n);
    charge(value_bytes(v), n.line);
    return v;
  }

  Value compute(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Literal: return Value::of(n.value);
      case Node::Kind::Var: return lookup(n.name);
      case Node::Kind::Attr: {
        const Ref ref = eval_ref(*n.kids[0]);
        const Value& obj = ref.get();
        if (obj.is_undefined()) fail_at(n.line, obj.name + " is undefined (its '." + n.name + "' was read)");
        return get_item(obj, Value::of(n.name), n.line);
      }
      case Node::Kind::Index: return get_item(eval_ref(*n.kids[0]).get(), eval(*n.kids[1]), n.line);
      case Node::Kind::Slice: {
        const Ref ref = eval_ref(*n.kids[0]);
        const Value& obj = ref.get();
        Value vals[3];
        const Value* parts[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (n.kids[static_cast<std::size_t>(k + 1)])
            vals[k] = eval(*n.kids[static_cast<std::size_t>(k + 1)]), parts[k] = &vals[k];
        return slice(obj, parts, n.line);
      }
      case Node::Kind::Call: return call(n);
      case Node::Kind::Filter: return filter(n);
      case Node::Kind::Test: return Value::of(test(n) != n.negate);
      case Node::Kind::Neg: {
        const Value operand = eval(*n.kids[0]);
        const Json& v = data(operand, n.line, "unary '-'");
        if (!numeric(v)) fail_at(n.line, "bad operand for unary -: " + py_repr(v));
        return integral(v) ? Value::of(-as_int(v)) : Value::of(-as_double(v));
      }
      case Node::Kind::Not: return Value::of(!truthy(eval(*n.kids[0])));
      case Node::Kind::And: {
        Value a = eval(*n.kids[0]);
        return truthy(a) ? eval(*n.kids[1]) : a;
      }
      case Node::Kind::Or: {
        Value a = eval(*n.kids[0]);
        return truthy(a) ? a : eval(*n.kids[1]);
      }
      case Node::Kind::Cond:
        if (truthy(eval(*n.kids[1]))) return eval(*n.kids[0]);
        return n.kids[2] ? eval(*n.kids[2]) : Value::undefined("the else branch");
      case Node::Kind::List: {
        Json r = Json::array();
        for (const auto& k : n.kids) r.push_back(data(eval(*k), n.line, "a list literal"));
        return Value::of(n.attr == "tuple" ? make_tuple(r) : r);
      }
      case Node::Kind::Dict: {
        Json r = Json::object();
        for (std::size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const Value key = eval(*n.kids[k]);
          if (!key.is_string()) fail_at(n.line, "dict literal keys must be strings here");
          r[key.data.get<std::string>()] = data(eval(*n.kids[k + 1]), n.line, "a dict literal");
        }
        return Value::of(r);
      }
      case Node::Kind::Binary: {
        const std::string& op = n.name;
        const Value a = eval(*n.kids[0]), b = eval(*n.kids[1]);
        if (op == "==") return Value::of(equal(a, b));
        if (op == "!=") return Value::of(!equal(a, b));
        if (op == "in") return Value::of(contains(b, a, n.line));
        if (op == "not in") return Value::of(!contains(b, a, n.line));
        if (op == "<" || op == ">" || op == "<=" || op == ">=") {
          const int c = order(data(a, n.line, op.c_str()), data(b, n.line, op.c_str()), n.line);
          return Value::of(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
        }
        return arithmetic(op, a, b, n.line);
      }
      default: break;
    }
    fail_at(n.line, "internal error: a statement where an expression belongs");
  }

  Args arguments(const Node& n) {
    Args a;
    for (std::size_t k = 1; k < n.kids.size(); ++k) {
      Value v = eval(*n.kids[k]);
      if (n.names[k].empty()) a.pos.push_back(std::move(v));
      else a.kw.emplace_back(n.names[k], std::move(v));
    }
    return a;
  }

  std::string string_arg(const Args& a, std::size_t i, const char* name, int line, const char* where) const {
    const Value* v = a.get(i, name);
    if (!v || !v->is_string()) fail_at(line, std::string(where) + " needs a string argument '" + name + "'");
    return v->data.get<std::string>();
  }

  Value call(const Node& n) {
    const Node& callee = *n.kids[0];
    Args a = arguments(n);
    if (callee.kind == Node::Kind::Attr) return method(eval_ref(*callee.kids[0]).get(), callee.name, a, n.line);
    const Value f = lookup(callee.name);
    if (f.kind != Value::Kind::Function) fail_at(n.line, "'" + callee.name + "' is not callable");
    const std::string& name = f.name;
    if (name == "raise_exception") {
      const Value* msg = a.get(0, "message");
      fail(origin_, ": the template raised an exception (line ", n.line, "): ", msg ? to_str(*msg) : "");
    }
    if (name == "strftime_now") {
      const std::string fmt = string_arg(a, 0, "format", n.line, "strftime_now()");
      std::tm t{};
      if (frozen_) {
        t = *frozen_;
      } else {
        const std::time_t now = std::time(nullptr);
        localtime_r(&now, &t);
      }
      char buf[256];
      const std::size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &t);
      return Value::of(std::string(buf, len));
    }
    if (name == "namespace" || name == "dict") {
      Namespace fields;
      for (const Value& p : a.pos) {
        if (!p.is_data() || !p.data.is_object()) fail_at(n.line, name + "() takes a dict or name=value arguments");
        for (const auto& [k, v] : p.data.items()) fields[k] = Value::of(v);
      }
      for (const auto& [k, v] : a.kw) fields[k] = v;
      if (name == "dict") {
        Json d = Json::object();
        for (const auto& [k, v] : fields) d[k] = data(v, n.line, "dict()");
        return Value::of(d);
      }
      Value v;
      v.kind = Value::Kind::Namespace, v.ns = std::make_shared<Namespace>(std::move(fields));
      return v;
    }
    // range(stop) / range(start, stop[, step])
    std::vector<std::int64_t> r;
    for (const Value& p : a.pos) {
      if (!p.is_data() || !integral(p.data)) fail_at(n.line, "range() takes integers");
      r.push_back(as_int(p.data));
    }
    if (r.empty() || r.size() > 3) fail_at(n.line, "range() takes one to three integers");
    const std::int64_t start = r.size() == 1 ? 0 : r[0], stop = r.size() == 1 ? r[0] : r[1], step = r.size() == 3 ? r[2] : 1;
    if (step == 0) fail_at(n.line, "range() step must not be zero");
    Json out = Json::array();
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= kMaxItems) fail_at(n.line, "range() of more than ", kMaxItems, " numbers");
      out.push_back(i);
    }
    return Value::of(out);
  }

  Value method(const Value& obj, const std::string& name, const Args& a, int line) {
    if (obj.is_undefined()) fail_at(line, obj.name + " is undefined (its '." + name + "()' was called)");
    if (obj.is_string() && kStringMethods.count(name)) {
      const std::string& s = obj.data.get_ref<const std::string&>();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = a.get(0, "chars");
        std::string c;
        if (chars && chars->is_string()) c = chars->data.get<std::string>();
        const bool has_chars = chars && chars->is_string();
        return Value::of(py_strip(s, name != "rstrip", name != "lstrip", has_chars ? &c : nullptr));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p || !p->is_data()) fail_at(line, "." + name + "() needs a string or a tuple of strings");
        std::vector<std::string> options;
        if (p->data.is_string()) options.push_back(p->data.get<std::string>());
        else if (unwrap(p->data).is_array())
          for (const Json& e : unwrap(p->data)) options.push_back(e.is_string() ? e.get<std::string>() : py_str(e));
        for (const std::string& o : options) {
          if (o.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
            return Value::of(true);
        }
        return Value::of(false);
      }
      if (name == "split") return Value::of(split(s, a, line));
      if (name == "upper") return Value::of(recase(s, Case::Upper, line));
      if (name == "lower") return Value::of(recase(s, Case::Lower, line));
      if (name == "title") return Value::of(recase(s, Case::Title, line));
      if (name == "capitalize") return Value::of(recase(s, Case::Capitalize, line));
      if (name == "replace") return Value::of(replace(s, a, line));
    }
    if (obj.is_data() && obj.data.is_object() && !is_tuple(obj.data) && kDictMethods.count(name)) {
      const Json& o = obj.data;
      if (name == "get") {
        const std::string key = string_arg(a, 0, "key", line, ".get()");
        auto it = o.find(key);
        if (it != o.end()) return Value::of(*it);
        const Value* def = a.get(1, "default");
        return def ? *def : Value::of(nullptr);
      }
      Json r = Json::array();
      for (const auto& [k, v] : o.items()) {
        if (name == "items") r.push_back(make_tuple(Json::array({k, v})));
        else if (name == "keys") r.push_back(k);
        else r.push_back(v);
      }
      Value out = Value::of(r);
      out.view = "dict_" + name;
      return out;
    }
    fail_at(line, "'." + name + "()' cannot be called on " + (obj.is_data() ? py_repr(obj.data) : to_str(obj)));
  }

  Json split(const std::string& s, const Args& a, int line) const {
    const Value* sep = a.get(0, "sep");
    const Value* maxv = a.get(1, "maxsplit");
    std::int64_t max = -1;
    if (maxv && maxv->is_data() && integral(maxv->data)) max = as_int(maxv->data);
    Json out = Json::array();
    if (!sep || (sep->is_data() && sep->data.is_null())) {  // runs of whitespace
      std::size_t i = 0;
      while (true) {
        while (i < s.size() && py_space(decode_at(s, i).first)) i += decode_at(s, i).second;
        if (i >= s.size()) break;
        if (max >= 0 && static_cast<std::int64_t>(out.size()) == max) {
          out.push_back(py_strip(s.substr(i), false, true));
          break;
        }
        std::size_t j = i;
        while (j < s.size() && !py_space(decode_at(s, j).first)) j += decode_at(s, j).second;
        out.push_back(s.substr(i, j - i));
        i = j;
      }
      return out;
    }
    if (!sep->is_string() || sep->data.get_ref<const std::string&>().empty())
      fail_at(line, ".split() needs a non-empty string separator");
    const std::string& d = sep->data.get_ref<const std::string&>();
    std::size_t i = 0;
    while (true) {
      const std::size_t j = s.find(d, i);
      if (j == std::string::npos || (max >= 0 && static_cast<std::int64_t>(out.size()) == max)) {
        out.push_back(s.substr(i));
        return out;
      }
      out.push_back(s.substr(i, j - i));
      i = j + d.size();
    }
  }

  std::string replace(const std::string& s, const Args& a, int line) const {
    const std::string from = string_arg(a, 0, "old", line, "replace");
    const std::string to = string_arg(a, 1, "new", line, "replace");
    const Value* cv = a.get(2, "count");
    std::int64_t count = cv && cv->is_data() && integral(cv->data) ? as_int(cv->data) : -1;
    std::string out;
    std::size_t i = 0;
    if (from.empty()) {  // Python inserts between every code point
      const auto starts = code_point_starts(s);
      for (std::size_t k = 0; k + 1 < starts.size(); ++k) {
        charge(to.size() + 1, line);
        if (count != 0) out += to, --count;
        out += s.substr(starts[k], starts[k + 1] - starts[k]);
      }
      if (count != 0) out += to;
      return out;
    }
    while (count != 0) {
      const std::size_t j = s.find(from, i);
      if (j == std::string::npos) break;
      charge(j - i + to.size(), line);
      out += s.substr(i, j - i) + to;
      i = j + from.size(), --count;
    }
    return out + s.substr(i);
  }

  std::string recase(const std::string& s, Case mode, int line) const {
    return change_case(s, mode, [&](char32_t c) {
      char b[16];
      std::snprintf(b, sizeof b, "U+%04X", static_cast<unsigned>(c));
      fail_at(line, std::string("changing the case of ") + b + " needs Python's special casing, which is not implemented");
    });
  }

  // The attribute `path` ("a.b") of an item, as selectattr / map read it.
  Value attribute(const Json& item, const std::string& path, int line) const {
    Value v = Value::of(item);
    std::size_t i = 0;
    while (i <= path.size()) {
      const std::size_t j = std::min(path.find('.', i), path.size());
      if (v.is_undefined()) return v;
      v = get_item(v, Value::of(path.substr(i, j - i)), line);
      i = j + 1;
    }
    return v;
  }

  bool run_test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) const {
    const bool d = v.is_data();
    const Json& j = v.data;
    auto arg = [&](std::size_t k) -> const Value& {
      if (k >= args.size()) fail_at(line, "the test '" + name + "' needs an argument");
      return args[k];
    };
    if (v.generator) return name == "defined" || name == "iterable" || name == "ne" || name == "!=";
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return d && j.is_null();
    if (name == "string") return d && j.is_string();
    if (name == "boolean") return d && j.is_boolean();
    if (name == "true") return d && j.is_boolean() && j.get<bool>();
    if (name == "false") return d && j.is_boolean() && !j.get<bool>();
    if (name == "number") return d && numeric(j);
    if (name == "integer") return d && j.is_number_integer();
    if (name == "float") return d && j.is_number_float();
    if (name == "mapping") return (d && j.is_object() && !is_tuple(j)) || v.kind == Value::Kind::Namespace;
    if (name == "iterable") return v.is_undefined() || (d && (j.is_array() || j.is_object() || j.is_string()));
    if (name == "sequence") return d && (j.is_array() || j.is_object() || j.is_string());
    if (name == "equalto" || name == "eq" || name == "==") return equal(v, arg(0));
    if (name == "ne" || name == "!=") return !equal(v, arg(0));
    // odd, even, divisibleby: Python's value % n on integers or floats
    const Value n = name == "divisibleby" ? arg(0) : Value::of(2);
    const Value r = arithmetic("%", v, n, line);
    return equal(r.data, Json(name == "odd" ? 1 : 0));
  }

  bool test(const Node& n) {
    const Ref ref = eval_ref(*n.kids[0]);
    const Value& v = ref.get();
    Args a = arguments(n);
    return run_test(n.name, v, a.pos, n.line);
  }

  Value filter(const Node& n) {
    const Ref ref = eval_ref(*n.kids[0]);
    const Value& v = ref.get();
    const Args a = arguments(n);
    const std::string& f = n.name;
    const int line = n.line;
    if (f == "safe") return v;
    if (f == "default" || f == "d") {
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::of("")) : v;
    }
    if (f == "string") return Value::of(to_str(v));
    if (f == "trim") {
      const Value* chars = a.get(0, "chars");
      const std::string c = chars && chars->is_string() ? chars->data.get<std::string>() : "";
      return Value::of(py_strip(to_str(v), true, true, chars && chars->is_string() ? &c : nullptr));
    }
    if (f == "upper") return Value::of(recase(to_str(v), Case::Upper, line));
    if (f == "lower") return Value::of(recase(to_str(v), Case::Lower, line));
    if (f == "capitalize") return Value::of(recase(to_str(v), Case::Capitalize, line));
    if (f == "title") return Value::of(recase(to_str(v), Case::JinjaTitle, line));
    if (f == "replace") return Value::of(replace(to_str(v), a, line));
    if (f == "length" || f == "count") {
      if (v.is_undefined()) return Value::of(0);
      const Json& j = unwrap(data(v, line, "length"));
      if (j.is_string()) return Value::of(static_cast<std::int64_t>(code_point_starts(j.get<std::string>()).size() - 1));
      if (j.is_array() || j.is_object()) return Value::of(static_cast<std::int64_t>(j.size()));
      fail_at(line, "object of type " + std::string(j.type_name()) + " has no length");
    }
    if (f == "tojson") {
      const Json& j = data(v, line, "tojson");
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      const Value* ensure_ascii = a.get(0, "ensure_ascii");
      const Value* indent = a.get(1, "indent");
      const Value* sort_keys = a.get(3, "sort_keys");
      if (a.get(2, "separators") && !(a.get(2, "separators")->is_data() && a.get(2, "separators")->data.is_null()))
        fail_at(line, "tojson(separators=…) is not supported");
      int ind = -1;
      if (indent && indent->is_data() && !indent->data.is_null()) {
        if (!integral(indent->data)) fail_at(line, "tojson(indent=…) needs an integer");
        ind = static_cast<int>(as_int(indent->data));
      }
      std::string out;
      py_json_dumps(out, j, ind, sort_keys && truthy(*sort_keys), ensure_ascii && truthy(*ensure_ascii), 0);
      return Value::of(out);
    }
    if (f == "first" || f == "last") {
      if (f == "last" && v.generator) fail_at(line, kGeneratorUse, "given to 'last'");
      std::vector<Json> items = iterate(v, line);
      if (items.empty()) return Value::undefined("the first item of an empty sequence");
      return Value::of(f == "first" ? items.front() : items.back());
    }
    if (f == "list") {
      Json r = Json::array();
      for (Json& e : iterate(v, line)) r.push_back(std::move(e));
      return Value::of(r);
    }
    if (f == "items") {
      Json r = Json::array();
      if (v.is_undefined()) return Value::of(r);
      const Json& j = data(v, line, "items");
      if (!j.is_object() || is_tuple(j)) fail_at(line, "the filter 'items' needs a dict, got " + py_repr(j));
      for (const auto& [k, val] : j.items()) r.push_back(make_tuple(Json::array({k, val})));
      Value out = Value::of(r);
      out.generator = true;
      return out;
    }
    if (f == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      const std::string s = sep ? to_str(*sep) : "";
      std::string out;
      bool first = true;
      for (const Json& e : iterate(v, line)) {
        const std::string piece = (first ? "" : s) + (attr ? to_str(attribute(e, to_str(*attr), line)) : py_str(e));
        charge(piece.size(), line);
        out += piece;
        first = false;
      }
      return Value::of(out);
    }
    if (f == "int" || f == "float" || f == "abs") {
      const Json& j = data(v, line, f.c_str());
      if (f == "abs") {
        if (!numeric(j)) fail_at(line, "abs needs a number");
        return integral(j) ? Value::of(std::llabs(as_int(j))) : Value::of(std::fabs(as_double(j)));
      }
      double x = 0;
      if (numeric(j)) x = as_double(j);
      else if (j.is_string()) {
        try {
          x = std::stod(j.get<std::string>());
        } catch (const std::exception&) {
          x = 0;  // Jinja's default for text that is not a number
        }
      }
      if (f == "float") return Value::of(x);
      return integral(j) ? Value::of(as_int(j)) : Value::of(static_cast<std::int64_t>(std::trunc(x)));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr", keep_if = f == "select" || f == "selectattr";
      std::size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty() || !a.pos[0].is_string()) fail_at(line, f + " needs an attribute name");
        attr = a.pos[0].data.get<std::string>(), k = 1;
      }
      std::string test_name;
      if (k < a.pos.size()) {
        if (!a.pos[k].is_string()) fail_at(line, f + " needs a test name");
        test_name = a.pos[k].data.get<std::string>();
        if (!kTests.count(test_name)) fail_at(line, "the test '" + test_name + "' (in " + f + ") is not supported");
        ++k;
      }
      const std::vector<Value> test_args(a.pos.begin() + static_cast<long>(std::min(k, a.pos.size())), a.pos.end());
      Json r = Json::array();
      for (const Json& e : iterate(v, line)) {
        const Value subject = by_attr ? attribute(e, attr, line) : Value::of(e);
        const bool pass = test_name.empty() ? truthy(subject) : run_test(test_name, subject, test_args, line);
        if (pass == keep_if) r.push_back(e);
      }
      Value out = Value::of(r);
      out.generator = true;
      return out;
    }
    if (f == "map") {
      const Value* attr = a.get(99, "attribute");
      if (!attr || !attr->is_string()) fail_at(line, "only map(attribute=…) is supported");
      const Value* def = a.get(99, "default");
      Json r = Json::array();
      for (const Json& e : iterate(v, line)) {
        Value x = attribute(e, attr->data.get<std::string>(), line);
        if (x.is_undefined() && def) x = *def;
        r.push_back(x.is_undefined() ? Json(nullptr) : data(x, line, "map"));
      }
      Value out = Value::of(r);
      out.generator = true;
      return out;
    }
    fail_at(line, "the filter '" + f + "' is not supported");
  }

  const std::string& origin_;
  const std::optional<std::tm>& frozen_;
  const RenderBudget budget_;
  mutable std::int64_t steps_ = 0;
  mutable std::size_t bytes_ = 0;
  std::vector<std::unordered_map<std::string, Value>> frames_;
};

}  // namespace chat_detail

using chat_detail::Json;

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::string bos_token, std::string eos_token)
    : source_(std::move(source)),
      origin_(std::move(origin)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {
  chat_detail::Lexer lexer(source_, origin_);
  chat_detail::Parser parser(lexer.run(), origin_);
  root_ = parser.parse_template();
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  Json list = Json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_json(list, add_generation_prompt);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra) const {
  using chat_detail::Value;
  IL_CHECK(messages.is_array(), origin_, ": the messages must be a list");
  IL_CHECK(extra.is_object(), origin_, ": the extra template variables must be a dict");
  std::unordered_map<std::string, Value> context;
  if (!bos_token_.empty()) context["bos_token"] = Value::of(bos_token_);
  if (!eos_token_.empty()) context["eos_token"] = Value::of(eos_token_);
  context["messages"] = Value::of(messages);
  context["tools"] = Value::of(nullptr);
  context["documents"] = Value::of(nullptr);
  context["add_generation_prompt"] = Value::of(add_generation_prompt);
  for (const auto& [k, v] : extra.items()) context[k] = Value::of(v);
  chat_detail::Interpreter interp(origin_, frozen_time_, budget_);
  return interp.run(*root_, std::move(context));
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  IL_CHECK(in && !std::filesystem::is_directory(path), "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token as tokenizer_config.json writes it: a string, or {"content": …} (AddedToken).
std::string token_text(const nlohmann::json& cfg, const char* key, const std::string& path) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  IL_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), path, ": field '", key,
           "' must be a string or an object with a string 'content', got ", json_brief(v));
  return v["content"].get<std::string>();
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::for_model(const std::string& model_path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model_path)) {
    const std::string cfg_path = (fs::path(model_path) / "tokenizer_config.json").string();
    std::string source, origin = cfg_path;
    nlohmann::json cfg = nlohmann::json::object();
    if (fs::exists(cfg_path)) cfg = load_json(cfg_path);
    IL_CHECK(cfg.is_object(), cfg_path, ": expected a JSON object");
    if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
      const auto& t = cfg["chat_template"];
      if (t.is_string()) {
        source = t.get<std::string>();
      } else {
        IL_CHECK(t.is_array(), cfg_path, ": 'chat_template' must be a string or a list of {name, template}, got ",
                 json_brief(t));
        bool found = false;
        for (const auto& e : t) {
          IL_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["template"].is_string(), cfg_path,
                   ": each entry of 'chat_template' must be {\"name\": …, \"template\": …}, got ", json_brief(e));
          if (e["name"] == "default") source = e["template"].get<std::string>(), found = true;
        }
        IL_CHECK(found, cfg_path, ": 'chat_template' lists no template named \"default\"");
        origin = cfg_path + " (chat_template \"default\")";
      }
    } else {
      // Newer exports keep the template beside the config (chat_template.jinja).
      const fs::path jinja = fs::path(model_path) / "chat_template.jinja";
      if (!fs::exists(jinja)) return std::nullopt;
      source = read_text(jinja.string()), origin = jinja.string();
    }
    return ChatTemplate(std::move(source), std::move(origin), token_text(cfg, "bos_token", cfg_path),
                        token_text(cfg, "eos_token", cfg_path));
  }
  if (fs::path(model_path).extension() == ".gguf") {
    const gguf::File f(model_path);
    if (!f.has("tokenizer.chat_template")) return std::nullopt;
    auto token = [&](const char* key) -> std::string {
      if (!f.has(key) || !f.has("tokenizer.ggml.tokens")) return "";
      const std::int64_t id = f.get_int(key);
      const auto& tokens = f.get("tokenizer.ggml.tokens");
      IL_CHECK(tokens.kind == gguf::Value::Kind::Array && id >= 0 && id < static_cast<std::int64_t>(tokens.items.size()),
               model_path, ": metadata '", key, "' = ", id, " is not an index into tokenizer.ggml.tokens");
      return tokens.items[static_cast<std::size_t>(id)].s;
    };
    return ChatTemplate(f.get_string("tokenizer.chat_template"), model_path + " (tokenizer.chat_template)",
                        token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"));
  }
  return std::nullopt;
}

ChatTemplate ChatTemplate::from_file(const std::string& path, std::string bos_token, std::string eos_token) {
  std::string text = read_text(path);
  validate_utf8(text, path + ": the chat template");
  return ChatTemplate(std::move(text), path, std::move(bos_token), std::move(eos_token));
}

}  // namespace inferlab
