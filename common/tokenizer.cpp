// tokenizer.json: normalizers, pre-tokenizers, the BPE model, post-processors and decoders,
// following the semantics of the Hugging Face `tokenizers` library.
#include "common/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "common/hf_config.h"
#include "common/json_file.h"
#include "common/regex.h"

namespace inferlab {

namespace {

using nlohmann::json;

const std::string kMetaspace = "\xE2\x96\x81";  // "▁" U+2581
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// --- byte-level alphabet -------------------------------------------------------------------
// GPT-2 maps each byte to a printable character: the printable Latin-1 bytes to themselves,
// the other 68 (controls, space, ...) to U+0100 onwards, in byte order. A space becomes "Ġ".
struct ByteAlphabet {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, unsigned char> to_byte;
  ByteAlphabet() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      std::string s;
      append_utf8(s, static_cast<char32_t>(printable ? b : next++));
      to_char[static_cast<std::size_t>(b)] = s;
      to_byte[s] = static_cast<unsigned char>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Decodes bytes as UTF-8, replacing each maximal invalid subsequence with U+FFFD (the rule
// Rust's String::from_utf8_lossy and the tokenizers library follow).
std::string utf8_lossy(std::string_view s) {
  std::string out;
  std::size_t i = 0;
  auto cont = [&](std::size_t k, unsigned lo, unsigned hi) {
    if (k >= s.size()) return false;
    const unsigned c = static_cast<unsigned char>(s[k]);
    return c >= lo && c <= hi;
  };
  while (i < s.size()) {
    const unsigned c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;  // bytes of a complete valid sequence, or 0
    std::size_t consumed = 1;
    if (c < 0x80) {
      n = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (cont(i + 1, 0x80, 0xBF)) n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      if (cont(i + 1, lo, hi)) {
        consumed = 2;
        if (cont(i + 2, 0x80, 0xBF)) n = 3;
      }
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      if (cont(i + 1, lo, hi)) {
        consumed = 2;
        if (cont(i + 2, 0x80, 0xBF)) {
          consumed = 3;
          if (cont(i + 3, 0x80, 0xBF)) n = 4;
        }
      }
    }
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += consumed;
    }
  }
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  std::size_t pos = 0, hit;
  while ((hit = s.find(from, pos)) != std::string::npos) {
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos);
  return out;
}

// A pattern in tokenizer.json: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const {
    if (regex) return regex->find_all(text);
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if (literal.empty()) return out;
    for (std::size_t p = text.find(literal); p != std::string_view::npos; p = text.find(literal, p + literal.size()))
      out.emplace_back(p, p + literal.size());
    return out;
  }
};

Pattern parse_pattern(const json& j, const std::string& ctx) {
  IL_CHECK(j.is_object(), ctx, ": 'pattern' must be an object with 'String' or 'Regex'");
  const JsonFields f(j, ctx + ": 'pattern'");
  Pattern p;
  if (f.has("String")) p.literal = f.get<std::string>("String");
  else if (f.has("Regex")) p.regex = std::make_unique<Regex>(f.get<std::string>("Regex"));
  else fail(ctx, ": 'pattern' must have 'String' or 'Regex'");
  return p;
}

// The context of the i-th entry of a component's list ("tokenizer.json: normalizer.normalizers[2]").
std::string item_context(const std::string& ctx, const char* list, std::size_t i) {
  return ctx + "." + list + "[" + std::to_string(i) + "]";
}

// A token id in tokenizer.json: an integer below the largest vocabulary the project accepts
// (as config.json's vocab_size is), so that an id can neither wrap into another token's nor
// size the id table beyond any real vocabulary. `what` names the entry.
std::int32_t token_id(const json& v, const std::string& what) {
  const auto id = json_integer<std::int32_t>(v, what);
  IL_CHECK(id >= 0 && id < kMaxVocabSize, what, ": id ", id, " is outside [0, ", kMaxVocabSize, ")");
  return id;
}

// --- pieces and splitting ------------------------------------------------------------------
struct Piece {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input
};
using Pieces = std::vector<Piece>;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s, const std::string& ctx) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  fail(ctx, ": split behavior '", s, "' is not supported");
}

// Splits one piece at `matches` (sorted, non-overlapping byte ranges) the way the tokenizers
// library's NormalizedString::split does for each behavior.
void split_piece(const Piece& piece, const std::vector<std::pair<std::size_t, std::size_t>>& matches, Behavior behavior,
                 bool invert, Pieces& out) {
  struct Seg {
    std::size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  std::size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) segs.push_back({pos, b, false});
    segs.push_back({b, e, true});
    pos = e;
  }
  if (pos < piece.text.size()) segs.push_back({pos, piece.text.size(), false});
  if (invert)
    for (auto& s : segs) s.match = !s.match;

  std::vector<std::pair<std::size_t, std::size_t>> parts;
  bool prev_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const auto& s : segs) parts.emplace_back(s.b, s.e);
      break;
    case Behavior::Removed:
      for (const auto& s : segs)
        if (!s.match) parts.emplace_back(s.b, s.e);
      break;
    case Behavior::MergedWithPrevious:
      for (const auto& s : segs) {
        if (s.match && !prev_match && !parts.empty()) parts.back().second = s.e;
        else parts.emplace_back(s.b, s.e);
        prev_match = s.match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !prev_match && !parts.empty()) parts.back().first = it->b;
        else parts.emplace_back(it->b, it->e);
        prev_match = it->match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    case Behavior::Contiguous:
      for (std::size_t i = 0; i < segs.size(); ++i) {
        if (i > 0 && segs[i].match == prev_match) parts.back().second = segs[i].e;
        else parts.emplace_back(segs[i].b, segs[i].e);
        prev_match = segs[i].match;
      }
      break;
  }
  for (auto [b, e] : parts)
    if (e > b) out.push_back({piece.text.substr(b, e - b), piece.at_start && b == 0});
}

// --- normalizers ---------------------------------------------------------------------------
using Normalizer = std::function<std::string(std::string)>;

std::string utf8proc_map(const std::string& s, int options, const char* what) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  IL_CHECK(n >= 0, "tokenizer ", what, " normalisation failed: ", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return r;
}

// Each component is read through JsonFields with `ctx` naming it ("tokenizer.json: normalizer",
// "tokenizer.json: pre_tokenizer.pretokenizers[1]"), so a field of the wrong type is named.
Normalizer parse_normalizer(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  const JsonFields f(j, ctx);
  const std::string type = f.get_or<std::string>("type", "");
  if (type == "Sequence") {
    std::vector<Normalizer> steps;
    const json& list = f.array("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(parse_normalizer(list[i], item_context(ctx, "normalizers", i)));
    return [steps](std::string s) {
      for (const auto& f : steps)
        if (f) s = f(std::move(s));
      return s;
    };
  }
  if (type == "Prepend") {
    const std::string pre = f.get<std::string>("prepend");
    return [pre](std::string s) { return s.empty() ? s : pre + s; };
  }
  if (type == "Replace") {
    auto pat = std::make_shared<Pattern>(parse_pattern(f.at("pattern"), ctx + " (Replace)"));
    const std::string content = f.get<std::string>("content");
    return [pat, content](std::string s) {
      if (!pat->regex) return replace_all(std::move(s), pat->literal, content);
      std::string out;
      std::size_t pos = 0;
      for (auto [b, e] : pat->find_all(s)) {
        out.append(s, pos, b - pos);
        out += content;
        pos = e;
      }
      out.append(s, pos);
      return out;
    };
  }
  if (type == "NFC") return [](std::string s) { return utf8proc_map(s, UTF8PROC_COMPOSE, "NFC"); };
  if (type == "NFD") return [](std::string s) { return utf8proc_map(s, UTF8PROC_DECOMPOSE, "NFD"); };
  if (type == "NFKC") return [](std::string s) { return utf8proc_map(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC"); };
  if (type == "NFKD") return [](std::string s) { return utf8proc_map(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, "NFKD"); };
  if (type == "Lowercase") {
    return [](std::string s) {
      std::string out;
      for (auto ch : utf8_chars(s)) {
        utf8proc_int32_t cp;
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(ch.data()), static_cast<utf8proc_ssize_t>(ch.size()),
                         &cp);
        append_utf8(out, static_cast<char32_t>(utf8proc_tolower(cp)));
      }
      return out;
    };
  }
  if (type == "Strip") {
    const bool left = f.get_or<bool>("strip_left", true), right = f.get_or<bool>("strip_right", true);
    return [left, right](std::string s) {
      const char* ws = " \t\n\r\f\v";
      if (right) s.erase(s.find_last_not_of(ws) + 1);
      if (left) s.erase(0, std::min(s.find_first_not_of(ws), s.size()));
      return s;
    };
  }
  fail(ctx, " type '", type, "' is not supported");
}

// --- pre-tokenizers ------------------------------------------------------------------------
using PreTokenizer = std::function<void(Pieces&)>;

void for_each_piece(Pieces& pieces, const std::function<void(const Piece&, Pieces&)>& f) {
  Pieces out;
  for (const auto& p : pieces) f(p, out);
  pieces = std::move(out);
}

PreTokenizer parse_pre_tokenizer(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  const JsonFields f(j, ctx);
  const std::string type = f.get_or<std::string>("type", "");
  if (type == "Sequence") {
    std::vector<PreTokenizer> steps;
    const json& list = f.array("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(parse_pre_tokenizer(list[i], item_context(ctx, "pretokenizers", i)));
    return [steps](Pieces& ps) {
      for (const auto& f : steps)
        if (f) f(ps);
    };
  }
  if (type == "ByteLevel") {
    const bool prefix = f.get_or<bool>("add_prefix_space", false), use_regex = f.get_or<bool>("use_regex", true);
    auto re = std::make_shared<Regex>(kGpt2Pattern);
    return [prefix, use_regex, re](Pieces& ps) {
      for_each_piece(ps, [&](const Piece& p, Pieces& out) {
        Piece q = p;
        if (prefix && (q.text.empty() || q.text[0] != ' ')) q.text.insert(0, " ");
        if (use_regex) split_piece(q, re->find_all(q.text), Behavior::Isolated, false, out);
        else out.push_back(q);
      });
      const auto& a = byte_alphabet();
      for (auto& p : ps) {
        std::string mapped;
        for (unsigned char c : p.text) mapped += a.to_char[c];
        p.text = std::move(mapped);
      }
    };
  }
  if (type == "Split") {
    auto pat = std::make_shared<Pattern>(parse_pattern(f.at("pattern"), ctx + " (Split)"));
    const Behavior b = parse_behavior(f.get<std::string>("behavior"), ctx);
    const bool invert = f.get_or<bool>("invert", false);
    return [pat, b, invert](Pieces& ps) {
      for_each_piece(ps, [&](const Piece& p, Pieces& out) { split_piece(p, pat->find_all(p.text), b, invert, out); });
    };
  }
  if (type == "Digits") {
    auto re = std::make_shared<Regex>(R"(\p{N})");
    const Behavior b = f.get_or<bool>("individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous;
    return [re, b](Pieces& ps) {
      for_each_piece(ps, [&](const Piece& p, Pieces& out) { split_piece(p, re->find_all(p.text), b, false, out); });
    };
  }
  if (type == "Metaspace") {
    const std::string rep = f.get_or<std::string>("replacement", kMetaspace);
    std::string scheme = f.get_or<std::string>("prepend_scheme", "");
    if (scheme.empty()) scheme = f.get_or<bool>("add_prefix_space", true) ? "always" : "never";
    IL_CHECK(scheme == "always" || scheme == "first" || scheme == "never", ctx, ": Metaspace prepend_scheme '", scheme,
             "' is not supported");
    const bool split = f.get_or<bool>("split", true);
    return [rep, scheme, split](Pieces& ps) {
      for_each_piece(ps, [&](const Piece& p, Pieces& out) {
        Piece q{replace_all(p.text, " ", rep), p.at_start};
        const bool starts = q.text.compare(0, rep.size(), rep) == 0;
        if (!starts && (scheme == "always" || (scheme == "first" && q.at_start))) q.text.insert(0, rep);
        if (!split) {
          out.push_back(q);
          return;
        }
        std::vector<std::pair<std::size_t, std::size_t>> m;
        for (std::size_t at = q.text.find(rep); at != std::string::npos; at = q.text.find(rep, at + rep.size()))
          m.emplace_back(at, at + rep.size());
        split_piece(q, m, Behavior::MergedWithNext, false, out);
      });
    };
  }
  if (type == "Whitespace") {
    auto re = std::make_shared<Regex>(R"(\w+|[^\w\s]+)");
    return [re](Pieces& ps) {
      for_each_piece(
          ps, [&](const Piece& p, Pieces& out) { split_piece(p, re->find_all(p.text), Behavior::Removed, true, out); });
    };
  }
  if (type == "WhitespaceSplit") {
    auto re = std::make_shared<Regex>(R"(\s+)");
    return [re](Pieces& ps) {
      for_each_piece(
          ps, [&](const Piece& p, Pieces& out) { split_piece(p, re->find_all(p.text), Behavior::Removed, false, out); });
    };
  }
  fail(ctx, " type '", type, "' is not supported");
}

// --- decoders ------------------------------------------------------------------------------
using Decoder = std::function<std::vector<std::string>(std::vector<std::string>)>;

Decoder parse_decoder(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  const JsonFields f(j, ctx);
  const std::string type = f.get_or<std::string>("type", "");
  if (type == "Sequence") {
    std::vector<Decoder> steps;
    const json& list = f.array("decoders");
    for (std::size_t i = 0; i < list.size(); ++i) steps.push_back(parse_decoder(list[i], item_context(ctx, "decoders", i)));
    return [steps](std::vector<std::string> t) {
      for (const auto& f : steps)
        if (f) t = f(std::move(t));
      return t;
    };
  }
  if (type == "ByteLevel") {
    return [](std::vector<std::string> toks) {
      const auto& a = byte_alphabet();
      std::string bytes;
      for (const auto& t : toks) {
        std::string b;
        bool all = true;
        for (auto ch : utf8_chars(t)) {
          auto it = a.to_byte.find(std::string(ch));
          if (it == a.to_byte.end()) {
            all = false;
            break;
          }
          b += static_cast<char>(it->second);
        }
        bytes += all ? b : t;
      }
      return std::vector<std::string>{utf8_lossy(bytes)};
    };
  }
  if (type == "ByteFallback") {
    return [](std::vector<std::string> toks) {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        try {
          validate_utf8(pending, "");
          out.push_back(pending);
        } catch (const Error&) {
          for (std::size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (const auto& t : toks) {
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4]))) {
          pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
        } else {
          flush();
          out.push_back(t);
        }
      }
      flush();
      return out;
    };
  }
  if (type == "Fuse") {
    return [](std::vector<std::string> toks) {
      std::string s;
      for (const auto& t : toks) s += t;
      return std::vector<std::string>{s};
    };
  }
  if (type == "Replace") {
    auto pat = std::make_shared<Pattern>(parse_pattern(f.at("pattern"), ctx + " (Replace)"));
    IL_CHECK(!pat->regex, ctx, ": Replace decoder with a regex pattern is not supported");
    const std::string content = f.get<std::string>("content");
    return [pat, content](std::vector<std::string> toks) {
      for (auto& t : toks) t = replace_all(t, pat->literal, content);
      return toks;
    };
  }
  if (type == "Strip") {
    const std::string content = f.get<std::string>("content");
    const std::size_t start = f.get_or<std::size_t>("start", 0), stop = f.get_or<std::size_t>("stop", 0);
    return [content, start, stop](std::vector<std::string> toks) {
      for (auto& t : toks) {
        auto chars = utf8_chars(t);
        std::size_t b = 0, e = chars.size();
        while (b < start && b < e && chars[b] == content) ++b;
        while (chars.size() - e < stop && e > b && chars[e - 1] == content) --e;
        std::string s;
        for (std::size_t i = b; i < e; ++i) s += chars[i];
        t = s;
      }
      return toks;
    };
  }
  if (type == "Metaspace") {
    const std::string rep = f.get_or<std::string>("replacement", kMetaspace);
    std::string scheme = f.get_or<std::string>("prepend_scheme", "");
    if (scheme.empty()) scheme = f.get_or<bool>("add_prefix_space", true) ? "always" : "never";
    return [rep, scheme](std::vector<std::string> toks) {
      // As the tokenizers library does: in the first token every replacement character is
      // dropped (not only a leading one); elsewhere each becomes a space.
      for (std::size_t i = 0; i < toks.size(); ++i)
        toks[i] = replace_all(toks[i], rep, i == 0 && scheme != "never" ? "" : " ");
      return toks;
    };
  }
  fail(ctx, " type '", type, "' is not supported");
}

}  // namespace

// --- the tokenizer -------------------------------------------------------------------------
struct HfTokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, std::int32_t> vocab;  // model vocabulary
  std::vector<std::string> id_to_token;                 // model + added tokens
  std::unordered_map<std::string, int> merge_rank;      // "a\xff" "b" -> rank
  std::optional<std::int32_t> unk_id;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;

  struct Added {
    std::string content;
    std::int32_t id;
    bool special, lstrip, rstrip;
  };
  std::vector<Added> added;  // longest first, for leftmost-longest matching
  std::vector<bool> special;

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::vector<std::int32_t> template_before, template_after;  // post-processor, single sequence

  static std::string merge_key(std::string_view a, std::string_view b) {
    std::string k(a);
    k += '\xff';  // never appears in UTF-8
    k += b;
    return k;
  }

  void bpe(const std::string& word, std::vector<std::int32_t>& ids) const;
  void parse_post_processor(const json& j);
};

void HfTokenizer::Impl::parse_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string ctx = path + ": post_processor";
  const JsonFields f(j, ctx);
  const std::string type = f.get_or<std::string>("type", "");
  if (type == "Sequence") {
    for (const auto& p : f.array("processors")) parse_post_processor(p);
    return;
  }
  if (type == "ByteLevel") return;  // only adjusts offsets, which we do not report
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const auto& item : f.array("single")) {
      IL_CHECK(item.is_object(), ctx, ": template item ", json_brief(item), " is not supported");
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      IL_CHECK(item.contains("SpecialToken"), ctx, ": template item ", item.dump(), " is not supported");
      const std::string name = JsonFields(item["SpecialToken"], ctx + ": template item SpecialToken").get<std::string>("id");
      IL_CHECK(f.has("special_tokens") && j["special_tokens"].is_object() && j["special_tokens"].contains(name), ctx,
               ": template token '", name, "' is missing from special_tokens");
      for (const auto& id : JsonFields(j["special_tokens"][name], ctx + ": special_tokens '" + name + "'").array("ids"))
        (seen_sequence ? template_after : template_before).push_back(token_id(id, ctx + ": token '" + name + "' id"));
    }
    return;
  }
  fail(ctx, " type '", type, "' is not supported");
}

void HfTokenizer::Impl::bpe(const std::string& word, std::vector<std::int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // Symbols form a linked list over the word; merge the lowest-ranked adjacent pair (leftmost
  // on ties) until none is in the merge table. A heap keeps this O(n log n) on long words.
  struct Sym {
    std::size_t begin, len;
    int prev, next;
  };
  std::vector<Sym> sym;
  for (auto ch : utf8_chars(word)) {
    const std::size_t b = static_cast<std::size_t>(ch.data() - word.data());
    sym.push_back({b, ch.size(), static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
  }
  sym.back().next = -1;
  struct Cand {
    int rank;
    int left, right;
    std::size_t left_len, right_len;
    bool operator>(const Cand& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto view = [&](int i) { return std::string_view(word).substr(sym[i].begin, sym[i].len); };
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    auto it = merge_rank.find(merge_key(view(l), view(r)));
    if (it != merge_rank.end()) heap.push({it->second, l, r, sym[l].len, sym[r].len});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale entries: either symbol has changed since this pair was queued.
    if (sym[c.left].len != c.left_len || sym[c.left].next != c.right || sym[c.right].len != c.right_len) continue;
    sym[c.left].len += sym[c.right].len;
    sym[c.right].len = 0;
    sym[c.left].next = sym[c.right].next;
    if (sym[c.left].next >= 0) sym[sym[c.left].next].prev = c.left;
    push(sym[c.left].prev, c.left);
    push(c.left, sym[c.left].next);
  }
  bool last_unk = false;
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view s = view(i);
    auto it = vocab.find(std::string(s));
    if (it != vocab.end()) {
      ids.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool ok = true;
      std::vector<std::int32_t> bytes;
      for (unsigned char b : s) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        auto bt = vocab.find(name);
        if (bt == vocab.end()) {
          ok = false;
          break;
        }
        bytes.push_back(bt->second);
      }
      if (ok) {
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        last_unk = false;
        continue;
      }
    }
    IL_CHECK(unk_id.has_value(), path, ": '", std::string(s), "' is not in the vocabulary and there is no unk_token");
    if (!(fuse_unk && last_unk)) ids.push_back(*unk_id);
    last_unk = true;
  }
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

HfTokenizer HfTokenizer::load(const std::string& path_in) {
  namespace fs = std::filesystem;
  const std::string path = fs::is_directory(path_in) ? (fs::path(path_in) / "tokenizer.json").string() : path_in;
  IL_CHECK(fs::exists(path), "cannot open ", path, ": no such file");
  // A file of another format is named as such, not reported as a JSON syntax error.
  std::ifstream in;
  if (fs::is_regular_file(path)) in.open(path, std::ios::binary);  // a FIFO is refused by load_json
  char magic[4] = {};
  if (in.is_open() && in.read(magic, 4) && std::string_view(magic, 4) == "GGUF")
    fail(path, ": a GGUF file, not a tokenizer.json (a GGUF model carries its tokenizer: pass the file itself)");
  IL_CHECK(fs::path(path).extension() != ".bin", path, ": a llama2.c .bin file, not a tokenizer.json");
  return from_json(load_json(path), path);
}

HfTokenizer HfTokenizer::from_json(const json& j, const std::string& name) {
  try {
    return from_json_impl(j, name);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type or a missing required key deep in a component.
    fail(name, ": malformed tokenizer.json: ", e.what());
  }
}

HfTokenizer HfTokenizer::from_json_impl(const json& j, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  const std::string& path = impl->path;
  const JsonFields top(j, path);
  const json& m = top.object("model");
  const JsonFields mf(m, path + ": model");
  const std::string mtype = mf.get_or<std::string>("type", "BPE");
  IL_CHECK(mtype == "BPE", path, ": model type '", mtype, "' is not supported (only BPE)");
  mf.object("vocab"), mf.array("merges");  // present, and of their types
  // BPE dropout skips merges at random (a training-time regularizer): with it the ids would not
  // be the model's, and it used to be ignored.
  if (mf.has("dropout"))
    IL_CHECK(mf.get<double>("dropout") == 0, path, ": model.dropout is ", mf.get<double>("dropout"),
             ": BPE dropout (merges skipped at random) is not implemented; tokenizers uses null for none");
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"})
    IL_CHECK(!m.contains(f) || m[f].is_null() || m[f] == "", path, ": model.", f, " is not supported");

  std::int32_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    const auto id = token_id(it.value(), path + ": vocab entry '" + it.key() + "'");
    impl->vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  int rank = 0;
  for (const auto& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const auto sp = s.find(' ');
      IL_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, path, ": merge '", s,
               "' is not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      IL_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(), path, ": merge ", mg.dump(),
               " is not a pair of strings");
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    }
    // As the tokenizers library refuses it: a merge of or into an unknown token would make
    // pieces that no id stands for.
    for (const std::string& t : {a, b, a + b})
      IL_CHECK(impl->vocab.count(t), path, ": merge '", a, " ", b, "': '", t, "' is not in the vocabulary");
    impl->merge_rank.emplace(Impl::merge_key(a, b), rank++);
  }
  impl->byte_fallback = mf.get_or<bool>("byte_fallback", false);
  impl->fuse_unk = mf.get_or<bool>("fuse_unk", false);
  impl->ignore_merges = mf.get_or<bool>("ignore_merges", false);

  if (top.has("added_tokens")) {
    for (const auto& t : top.array("added_tokens")) {
      JsonFields f(t, path + ": added_tokens entry");
      IL_CHECK(f.has("id"), f.context(), ": missing field 'id'");
      Impl::Added a{f.get<std::string>("content"), token_id(t["id"], f.context() + ": field 'id'"),
                    f.get_or<bool>("special", false), f.get_or<bool>("lstrip", false), f.get_or<bool>("rstrip", false)};
      IL_CHECK(!a.content.empty(), f.context(), " ", a.id, " has empty content");
      max_id = std::max(max_id, a.id);
      impl->added.push_back(a);
    }
  }
  std::stable_sort(impl->added.begin(), impl->added.end(),
                   [](const auto& x, const auto& y) { return x.content.size() > y.content.size(); });
  impl->id_to_token.assign(static_cast<std::size_t>(max_id + 1), "");
  impl->special.assign(static_cast<std::size_t>(max_id + 1), false);
  for (const auto& [tok, id] : impl->vocab) {
    std::string& slot = impl->id_to_token[static_cast<std::size_t>(id)];
    IL_CHECK(slot.empty(), path, ": vocab entries '", slot, "' and '", tok, "' share id ", id);
    slot = tok;
  }
  for (const auto& a : impl->added) {
    impl->id_to_token[static_cast<std::size_t>(a.id)] = a.content;
    impl->special[static_cast<std::size_t>(a.id)] = a.special;
  }
  if (mf.has("unk_token")) {
    const std::string unk = mf.get<std::string>("unk_token");
    auto it = impl->vocab.find(unk);
    IL_CHECK(it != impl->vocab.end(), path, ": unk_token '", unk, "' is not in the vocabulary");
    impl->unk_id = it->second;
  }

  auto component = [&](const char* key) { return top.has(key) ? j[key] : json(); };
  impl->normalizer = parse_normalizer(component("normalizer"), path + ": normalizer");
  impl->pre_tokenizer = parse_pre_tokenizer(component("pre_tokenizer"), path + ": pre_tokenizer");
  impl->decoder = parse_decoder(component("decoder"), path + ": decoder");
  impl->parse_post_processor(component("post_processor"));
  for (auto id : impl->template_before)
    IL_CHECK(id >= 0 && id <= max_id, path, ": post_processor token id ", id, " is outside the vocabulary");
  for (auto id : impl->template_after)
    IL_CHECK(id >= 0 && id <= max_id, path, ": post_processor token id ", id, " is outside the vocabulary");
  return HfTokenizer(std::move(impl));
}

std::vector<std::int32_t> Tokenizer::encode_with_text_ranges(std::string_view text, bool add_special_tokens,
                                                             std::span<const TextRange>) const {
  return encode(text, add_special_tokens);
}

std::vector<std::int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode_with_text_ranges(text, add_special_tokens, {});
}

std::vector<std::string> HfTokenizer::added_token_texts() const {
  std::vector<std::string> out;
  for (const auto& a : impl_->added) out.push_back(a.content);
  return out;
}

std::vector<std::int32_t> HfTokenizer::encode_with_text_ranges(std::string_view text, bool add_special_tokens,
                                                               std::span<const TextRange> as_text) const {
  const Impl& t = *impl_;
  validate_utf8(text, "tokenizer input");
  std::vector<std::int32_t> ids;
  if (add_special_tokens) ids = t.template_before;

  // 1. Cut out added tokens (leftmost, then longest), honouring lstrip/rstrip.
  struct Segment {
    std::string_view text;
    std::int32_t added_id;  // -1 for ordinary text
    bool at_start;
  };
  std::vector<Segment> segs;
  std::size_t start = 0, i = 0;
  auto range = as_text.begin();  // the first range that does not end before i
  while (i < text.size()) {
    while (range != as_text.end() && range->end <= i) ++range;
    const Impl::Added* hit = nullptr;
    for (const auto& a : t.added)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        // Inside a text range, or reaching into one: ordinary text there.
        if (range != as_text.end() && range->begin < i + a.content.size()) continue;
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t seg_end = i, next = i + hit->content.size();
    if (hit->lstrip)
      while (seg_end > start && std::isspace(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
    if (hit->rstrip)
      while (next < text.size() && std::isspace(static_cast<unsigned char>(text[next]))) ++next;
    if (seg_end > start) segs.push_back({text.substr(start, seg_end - start), -1, start == 0});
    segs.push_back({{}, hit->id, false});
    start = i = next;
  }
  if (start < text.size()) segs.push_back({text.substr(start), -1, start == 0});

  // 2. Normalise, pre-tokenise and BPE-encode each ordinary segment.
  for (const auto& s : segs) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
      continue;
    }
    std::string norm(s.text);
    if (t.normalizer) norm = t.normalizer(std::move(norm));
    Pieces pieces{{norm, s.at_start}};
    if (t.pre_tokenizer) t.pre_tokenizer(pieces);
    for (const auto& p : pieces) t.bpe(p.text, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), t.template_after.begin(), t.template_after.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  for (auto id : ids) {
    IL_CHECK(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
    if (skip_special_tokens && t.special[static_cast<std::size_t>(id)]) continue;
    toks.push_back(t.id_to_token[static_cast<std::size_t>(id)]);
  }
  if (!t.decoder) {
    std::string s;
    for (std::size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  std::string s;
  for (const auto& piece : t.decoder(std::move(toks))) s += piece;
  return s;
}

std::int64_t HfTokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->id_to_token.size()); }

const std::string& HfTokenizer::id_to_token(std::int32_t id) const {
  IL_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  return impl_->id_to_token[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

bool HfTokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<std::size_t>(id)];
}

const std::string& HfTokenizer::path() const { return impl_->path; }

TextStream::TextStream(const Tokenizer& tok, const std::vector<std::int32_t>& prompt) : tok_(tok) { print(prompt); }

void TextStream::print(const std::vector<std::int32_t>& tokens) {
  const std::string text = tok_.decode(tokens, true);
  std::size_t end = text.size();
  // Hold back a trailing U+FFFD or an incomplete UTF-8 sequence: the next token may complete
  // the character (byte-fallback tokens carry one byte each).
  if (end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;
  std::size_t lead = end;
  while (lead > 0 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0) {
    const unsigned char c = static_cast<unsigned char>(text[lead - 1]);
    const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (end - (lead - 1) < len) end = lead - 1;
  }
  if (end > printed_) {
    std::fwrite(text.data() + printed_, 1, end - printed_, stdout);
    std::fflush(stdout);
    printed_ = end;
  }
}

void Tokenizer::check_vocab(std::int64_t model_vocab, const std::string& model) const {
  IL_CHECK(vocab_size() <= model_vocab, path(), ": ", vocab_size(), " tokens do not fit the vocabulary of ", model_vocab,
           " of ", model);
}

void check_tokenizer_vocab(const Tokenizer& tok, std::int64_t vocab_size, const std::string& model) {
  tok.check_vocab(vocab_size, model);
}

std::unique_ptr<Tokenizer> Tokenizer::for_model(const std::string& model_path, const std::string& explicit_path) {
  namespace fs = std::filesystem;
  if (!explicit_path.empty()) return load(explicit_path);
  if (fs::is_directory(model_path)) return load(model_path);
  for (const TokenizerFormat& format : tokenizer_formats())
    if (const std::string beside = format.tokenizer_beside(model_path); !beside.empty()) return load(beside);
  return load((fs::path(model_path).parent_path() / "tokenizer.json").string());
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  for (const TokenizerFormat& format : tokenizer_formats())
    if (format.is_tokenizer_file(path)) return format.load(path);
  return std::make_unique<HfTokenizer>(HfTokenizer::load(path));
}

}  // namespace inferlab
