#include "common/gguf_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/regex.h"

namespace inferlab::gguf {

namespace {

using nlohmann::json;

const std::string kMeta = "\xE2\x96\x81";  // "▁", SentencePiece's space

// Token types, as llama.cpp numbers them.
enum TokenType : std::int64_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// The splitting regexes Hugging Face's tokenizer.json files use for the pre-tokenizers that
// llama.cpp names; each is what llama.cpp's regex list for that name computes.
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// The pre-tokenizer a tokenizer.ggml.pre name stands for, and whether merges are skipped for
// words already in the vocabulary (llama.cpp's ignore_merges).
std::pair<json, bool> pre_tokenizer(const std::string& pre, const std::string& where) {
  if (pre == "gpt-2" || pre == "gpt2") return {byte_level(true), false};
  if (pre == "smollm")
    return {{{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}},
            false};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3")
    return {{{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Regex), byte_level(false)}}}, true};
  if (pre == "smaug-bpe" || pre == "dbrx")
    return {{{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Regex), byte_level(false)}}}, false};
  if (pre == "qwen2") return {{{"type", "Sequence"}, {"pretokenizers", {split(kQwen2Regex), byte_level(false)}}}, false};
  if (pre == "default")  // llama.cpp's own default: four splits in a row
    return {{{"type", "Sequence"},
             {"pretokenizers",
              {split(R"([\p{P}\$\+<=>\^~\|]+)"),
               split(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))"), split(R"(\p{N}+)"),
               split("[0-9][0-9][0-9]"), byte_level(false)}}},
            false};
  fail(where, ": tokenizer.ggml.pre '", pre,
       "' is not a pre-tokenizer this reader implements (default, gpt-2, llama-bpe, smaug-bpe, qwen2, smollm)");
}

json added(std::int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

json bos_template(const std::string& bos, std::int64_t id) {
  return {{"type", "TemplateProcessing"},
          {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", json::array()},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {id}}, {"tokens", {bos}}}}}}};
}

std::vector<std::string> strings(const File& f, const std::string& key) {
  const Value& v = f.get(key);
  IL_CHECK(v.kind == Value::Kind::Array && v.element == Value::Kind::String, f.path(), ": metadata '", key,
           "' is not an array of strings");
  std::vector<std::string> out;
  for (const Value& x : v.items) out.push_back(x.s);
  return out;
}

// The special ids a file may name; each must be a token of the file's `count`.
const char* const kIdKeys[] = {"tokenizer.ggml.bos_token_id",      "tokenizer.ggml.eos_token_id",
                               "tokenizer.ggml.eot_token_id",      "tokenizer.ggml.eom_token_id",
                               "tokenizer.ggml.unknown_token_id",  "tokenizer.ggml.padding_token_id",
                               "tokenizer.ggml.seperator_token_id"};

std::int64_t special_id(const File& f, const std::string& key, std::size_t count) {
  if (!f.has(key)) return -1;
  const std::int64_t id = f.get_int(key);
  IL_CHECK(id >= 0 && id < static_cast<std::int64_t>(count), f.path(), ": metadata '", key, "' = ", id,
           " is outside the vocabulary of ", count, " tokens");
  return id;
}

bool flag(const File& f, const std::string& key, bool otherwise) {
  if (!f.has(key)) return otherwise;
  const Value& v = f.get(key);
  IL_CHECK(v.kind == Value::Kind::Bool, f.path(), ": metadata '", key, "' is ", kind_name(v.kind), ", not BOOL");
  return v.i != 0;
}

// The pieces of a vocabulary by their polynomial hash (mod 2^61 - 1), so that every split of a
// piece into two pieces of the vocabulary is found in time linear in the piece's length: only a
// split whose two lengths are both lengths of pieces is looked at, the hash of its prefix grows by
// one byte at a time and its suffix's follows from the whole piece's, and only halves that hash
// like a piece are compared byte by byte. Comparing every split's strings instead is quadratic in
// the length: a 1 MB piece took 34 s.
class PieceIndex {
 public:
  PieceIndex(const std::vector<std::string>& pieces, std::size_t n) : pieces_(pieces), whole_(n) {
    for (std::size_t i = 0; i < n; ++i) {
      whole_[i] = hash(pieces[i]);
      std::vector<std::size_t>& ids = by_hash_[key(whole_[i], pieces[i].size())];
      const bool seen = std::any_of(ids.begin(), ids.end(), [&](std::size_t j) { return pieces[j] == pieces[i]; });
      if (!seen) ids.push_back(i);  // a repeated string keeps its first id, as the vocabulary does
      lengths_.push_back(pieces[i].size());
    }
    std::sort(lengths_.begin(), lengths_.end());
    lengths_.erase(std::unique(lengths_.begin(), lengths_.end()), lengths_.end());
  }

  // Calls each(l, r) for every split of piece i into pieces l + r, from the shortest left piece.
  template <typename F>
  void splits(std::size_t i, F&& each) const {
    const std::string& p = pieces_[i];
    const std::string_view v(p);
    std::uint64_t prefix = 0;
    std::size_t hashed = 0;  // prefix is the hash of p[0, hashed)
    for (std::size_t k : lengths_) {
      if (k >= p.size()) break;
      if (k == 0 || !std::binary_search(lengths_.begin(), lengths_.end(), p.size() - k)) continue;
      if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // not between two UTF-8 characters
      for (; hashed < k; ++hashed) prefix = add(mul(prefix, kBase), static_cast<unsigned char>(p[hashed]) + 1u);
      const auto l = find(prefix, v.substr(0, k));
      if (!l) continue;
      const std::uint64_t suffix = add(whole_[i], kMod - mul(prefix, power(p.size() - k)));
      if (const auto r = find(suffix, v.substr(k))) each(*l, *r);
    }
  }

 private:
  static constexpr std::uint64_t kMod = (std::uint64_t(1) << 61) - 1, kBase = 1000003;
  static std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
    __extension__ using U128 = unsigned __int128;  // a GCC and Clang extension, not ISO C++
    const U128 x = static_cast<U128>(a) * b;
    return add(static_cast<std::uint64_t>(x & kMod), static_cast<std::uint64_t>(x >> 61));
  }
  static std::uint64_t add(std::uint64_t a, std::uint64_t b) {
    const std::uint64_t x = a + b;
    return x >= kMod ? x - kMod : x;
  }
  static std::uint64_t power(std::size_t e) {  // kBase^e
    std::uint64_t r = 1, b = kBase;
    for (; e > 0; e >>= 1, b = mul(b, b))
      if (e & 1) r = mul(r, b);
    return r;
  }
  static std::uint64_t hash(std::string_view s) {
    std::uint64_t h = 0;
    for (unsigned char c : s) h = add(mul(h, kBase), c + 1u);
    return h;
  }
  static std::uint64_t key(std::uint64_t h, std::size_t len) { return h ^ (static_cast<std::uint64_t>(len) << 61); }
  std::optional<std::size_t> find(std::uint64_t h, std::string_view s) const {
    const auto it = by_hash_.find(key(h, s.size()));
    if (it == by_hash_.end()) return std::nullopt;
    for (std::size_t id : it->second)
      if (pieces_[id] == s) return id;
    return std::nullopt;
  }

  const std::vector<std::string>& pieces_;
  std::vector<std::uint64_t> whole_;  // each piece's hash
  std::vector<std::size_t> lengths_;  // the pieces' lengths, sorted, each once
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> by_hash_;
};

}  // namespace

json tokenizer_json(const File& f) {
  const std::string& kind = f.get_string("tokenizer.ggml.model");
  const std::vector<std::string> tokens = strings(f, "tokenizer.ggml.tokens");
  std::vector<std::int64_t> types(tokens.size(), Normal);
  if (f.has("tokenizer.ggml.token_type")) {
    const Value& t = f.get("tokenizer.ggml.token_type");
    IL_CHECK(t.kind == Value::Kind::Array && t.items.size() == tokens.size(), f.path(),
             ": metadata 'tokenizer.ggml.token_type' must be an array of one type per token (", tokens.size(), ")");
    Value element;
    element.kind = t.element;
    IL_CHECK(element.is_integer(), f.path(), ": metadata 'tokenizer.ggml.token_type' is an array of ", kind_name(t.element),
             ", not of integers");
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      types[i] = t.items[i].i;
      IL_CHECK(types[i] >= Normal && types[i] <= Byte, f.path(), ": metadata 'tokenizer.ggml.token_type' of token ", i,
               " is ", types[i], ", not a token type (1 normal .. 6 byte)");
    }
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string where = f.path() + ": metadata 'tokenizer.ggml.tokens': token " + std::to_string(i);
    IL_CHECK(!tokens[i].empty() || types[i] == Unused, where, " is empty");
    validate_utf8(tokens[i], where);
  }
  std::size_t n = tokens.size();
  while (n > 0 && types[n - 1] == Unused) --n;  // an exporter's padding to the embedding's rows
  IL_CHECK(n > 0, f.path(), ": metadata 'tokenizer.ggml.tokens' holds no token");
  for (const char* key : kIdKeys) special_id(f, key, tokens.size());
  const std::int64_t bos = special_id(f, "tokenizer.ggml.bos_token_id", n);
  const bool spm = kind == "llama";
  IL_CHECK(spm || kind == "gpt2", f.path(), ": tokenizer.ggml.model '", kind,
           "' is not a tokenizer this reader implements (gpt2: byte-level BPE; llama: SentencePiece)");
  const bool add_bos = flag(f, "tokenizer.ggml.add_bos_token", spm);
  IL_CHECK(!add_bos || bos >= 0, f.path(), ": tokenizer.ggml.add_bos_token is true but there is no bos_token_id");

  json vocab = json::object(), added_tokens = json::array();
  for (std::size_t i = 0; i < n; ++i) {
    if (!vocab.contains(tokens[i])) vocab[tokens[i]] = i;  // a repeated string keeps its first id
    if (types[i] == Control || types[i] == UserDefined || (spm && types[i] == Unknown))
      added_tokens.push_back(added(static_cast<std::int64_t>(i), tokens[i], types[i] != UserDefined));
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added_tokens},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", add_bos ? bos_template(tokens[static_cast<std::size_t>(bos)], bos) : json(nullptr)}};
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab}};
  if (!spm) {
    const auto [pre, ignore_merges] =
        pre_tokenizer(f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default", f.path());
    j["pre_tokenizer"] = pre;
    j["decoder"] = byte_level(true);
    model["ignore_merges"] = ignore_merges;
    model["merges"] = strings(f, "tokenizer.ggml.merges");
  } else {
    // SentencePiece BPE merges the adjacent pair whose merged piece scores highest. As ranked
    // merges (Hugging Face's converter): every split of a normal piece into two pieces of the
    // vocabulary, by the merged piece's score, then by the ids of the merged, left and right pieces.
    const Value& sv = f.get("tokenizer.ggml.scores");
    IL_CHECK(sv.kind == Value::Kind::Array && sv.items.size() == tokens.size(), f.path(),
             ": metadata 'tokenizer.ggml.scores' must be an array of one score per token (", tokens.size(), ")");
    IL_CHECK(sv.element == Value::Kind::F32 || sv.element == Value::Kind::F64, f.path(),
             ": metadata 'tokenizer.ggml.scores' is an array of ", kind_name(sv.element), ", not of F32");
    for (std::size_t i = 0; i < n; ++i)
      IL_CHECK(std::isfinite(sv.items[i].f), f.path(), ": metadata 'tokenizer.ggml.scores' of token ", i, " is ",
               sv.items[i].f, ", not a finite number");
    struct M {
      double score;
      std::int64_t id, l, r;
    };
    std::vector<M> merges;
    const PieceIndex index(tokens, n);
    for (std::size_t i = 0; i < n; ++i) {
      if (types[i] != Normal) continue;
      index.splits(i, [&](std::size_t l, std::size_t r) {
        merges.push_back(
            {sv.items[i].f, static_cast<std::int64_t>(i), static_cast<std::int64_t>(l), static_cast<std::int64_t>(r)});
      });
    }
    std::sort(merges.begin(), merges.end(), [](const M& x, const M& y) {
      return x.score != y.score ? x.score > y.score : std::tie(x.id, x.l, x.r) < std::tie(y.id, y.l, y.r);
    });
    json jm = json::array();
    for (const M& m : merges)
      jm.push_back(json::array({tokens[static_cast<std::size_t>(m.l)], tokens[static_cast<std::size_t>(m.r)]}));
    const bool prefix = flag(f, "tokenizer.ggml.add_space_prefix", true);
    json norm = json::array();
    if (prefix) norm.push_back({{"type", "Prepend"}, {"prepend", kMeta}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    json dec = {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}}};
    if (prefix) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
    const auto unk = std::find(types.begin(), types.begin() + static_cast<long>(n), Unknown);
    if (unk != types.begin() + static_cast<long>(n))
      model["unk_token"] = tokens[static_cast<std::size_t>(unk - types.begin())];
    model["fuse_unk"] = true, model["byte_fallback"] = true, model["merges"] = jm;
  }
  j["model"] = model;
  return j;
}

std::unique_ptr<Tokenizer> tokenizer(const File& f) {
  return std::make_unique<HfTokenizer>(HfTokenizer::from_json(tokenizer_json(f), f.path() + " (tokenizer.ggml.*)"));
}

bool is_gguf_file(const std::string& path) {
  // Only a regular file is opened here (a FIFO would block); anything else goes on to the
  // tokenizer.json reader, which refuses it by name.
  if (!std::filesystem::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

TokenizerFormat tokenizer_format() {
  return {is_gguf_file, [](const std::string& path) { return tokenizer(File(path)); },
          [](const std::string&) { return std::string(); }};
}

std::vector<std::int64_t> stop_ids(const File& f) {
  std::vector<std::int64_t> out;
  // Without tokens the vocabulary's size is the model's to check; an id is still never negative.
  const std::size_t count =
      f.has("tokenizer.ggml.tokens") ? strings(f, "tokenizer.ggml.tokens").size() : static_cast<std::size_t>(INT64_MAX);
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.has(key)) out.push_back(special_id(f, key, count));
  if (f.has("tokenizer.ggml.tokens") && f.has("tokenizer.ggml.token_type")) {
    const auto tokens = strings(f, "tokenizer.ggml.tokens");
    const auto& types = f.get("tokenizer.ggml.token_type").items;
    for (std::size_t i = 0; i < tokens.size() && i < types.size(); ++i)
      for (const char* end : {"<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"})
        if (types[i].i == Control && tokens[i] == end) out.push_back(static_cast<std::int64_t>(i));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;  // (the caller may add the model's own EOS ids; generation treats repeats as one)
}

// ---------------------------------------------------------------------------------------------
// Writing: a tokenizer.json as tokenizer.ggml.* metadata.
std::vector<std::pair<std::string, Value>> tokenizer_metadata(const json& tj, const std::string& path, std::int64_t rows) {
  const json& model = tj.at("model");
  IL_CHECK(model.value("type", "BPE") == "BPE", path, ": only BPE tokenizers can be written to GGUF");
  const json& pre = tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : json(nullptr);
  const json& norm = tj.contains("normalizer") ? tj["normalizer"] : json(nullptr);
  auto is = [](const json& x, const char* type) { return x.is_object() && x.value("type", "") == type; };
  auto seq = [&](const json& x, const char* key) { return is(x, "Sequence") ? x.at(key) : json::array({x}); };
  const json pres = pre.is_null() ? json::array() : seq(pre, "pretokenizers");
  // The family: SentencePiece-style (spaces as ▁, byte fallback) or byte-level BPE.
  const bool metaspace_pre = pres.size() == 1 && is(pres[0], "Metaspace") && !pres[0].value("split", true);
  const json norms = norm.is_null() ? json::array() : seq(norm, "normalizers");
  const bool metaspace_norm =
      pre.is_null() && !norms.empty() && is(norms.back(), "Replace") && norms.back().at("content") == kMeta;
  const bool spm = metaspace_pre || metaspace_norm;
  // llama.cpp's SentencePiece always prepends "▁" (add_space_prefix); a Metaspace that prepends
  // only where the text does not start with one ("first", "always") tokenizes a leading space
  // differently, so it has no exact GGUF equivalent.
  IL_CHECK(!metaspace_pre, path,
           ": its Metaspace pre-tokenizer adds \"▁\" only where the text does not start "
           "with one, which llama.cpp's SentencePiece (always adding it) does not reproduce: texts that start with a "
           "space would tokenize differently");
  std::string pre_name;
  if (!spm) {
    IL_CHECK(norm.is_null(), path, ": its normalizer (", norm.dump(), ") has no GGUF equivalent");
    const bool ignore = model.value("ignore_merges", false);
    auto split_regex = [&](const json& p) {
      return is(p, "Split") && p.at("pattern").contains("Regex") ? p["pattern"]["Regex"].get<std::string>() : "";
    };
    if (pres.size() == 1 && is(pres[0], "ByteLevel") && pres[0].value("use_regex", true)) pre_name = "gpt-2";
    else if (pres.size() == 2 && is(pres[0], "Digits") && pres[0].value("individual_digits", false) &&
             is(pres[1], "ByteLevel") && pres[1].value("use_regex", true))
      pre_name = "smollm";
    else if (pres.size() == 2 && is(pres[1], "ByteLevel") && !pres[1].value("use_regex", true) &&
             split_regex(pres[0]) == kLlama3Regex)
      pre_name = ignore ? "llama-bpe" : "smaug-bpe";
    else if (pres.size() == 2 && is(pres[1], "ByteLevel") && !pres[1].value("use_regex", true) &&
             split_regex(pres[0]) == kQwen2Regex && !ignore)
      pre_name = "qwen2";
    IL_CHECK(!pre_name.empty(), path, ": its pre-tokenizer (", pre.dump(),
             ") is not one GGUF names (GPT-2, Llama-3, Qwen2 or SmolLM byte-level BPE)");
    IL_CHECK(!ignore || pre_name == "llama-bpe", path, ": ignore_merges with this pre-tokenizer has no GGUF equivalent");
  }

  // Tokens by id: the BPE vocabulary and the added tokens.
  std::map<std::int64_t, std::string> by_id;
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it)
    by_id[it.value().get<std::int64_t>()] = it.key();
  std::map<std::int64_t, bool> added_special;
  if (tj.contains("added_tokens"))
    for (const json& a : tj["added_tokens"]) {
      by_id[a.at("id").get<std::int64_t>()] = a.at("content").get<std::string>();
      added_special[a.at("id").get<std::int64_t>()] = a.value("special", false);
    }
  const std::int64_t count = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  IL_CHECK(count == static_cast<std::int64_t>(by_id.size()), path, ": its ids are not 0 .. ", count - 1, " without gaps");
  IL_CHECK(count <= rows, path, ": ", count, " tokens but the model has ", rows, " embedding rows");
  const std::string unk =
      model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
  // Merge ranks: a merged piece's SentencePiece score is minus the rank of the merge making it.
  std::map<std::string, std::int64_t> made_at;
  std::vector<Value> merges;
  std::int64_t rank = 0;
  for (const json& mg : model.at("merges")) {
    const std::string a =
        mg.is_string() ? mg.get<std::string>().substr(0, mg.get<std::string>().find(' ')) : mg[0].get<std::string>();
    const std::string b =
        mg.is_string() ? mg.get<std::string>().substr(mg.get<std::string>().find(' ') + 1) : mg[1].get<std::string>();
    made_at.emplace(a + b, rank++);
    merges.push_back(Value::str(a + " " + b));
  }
  std::vector<Value> tokens, types, scores;
  for (std::int64_t i = 0; i < rows; ++i) {
    const bool real = i < count;
    const std::string t = real ? by_id[i] : "[PAD" + std::to_string(i) + "]";
    std::int64_t type = Normal;
    if (!real) type = Unused;
    else if (added_special.count(i)) type = added_special[i] ? Control : UserDefined;
    else if (t == unk) type = Unknown;
    else if (spm && t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') type = Byte;
    if (spm && t == unk) type = Unknown;
    tokens.push_back(Value::str(t));
    Value tv;
    tv.kind = Value::Kind::I32, tv.i = type;
    types.push_back(tv);
    const auto m = made_at.find(t);
    scores.push_back(Value::f32(m != made_at.end() ? -static_cast<float>(m->second) : -1e9f));
  }
  std::vector<std::pair<std::string, Value>> meta = {{"tokenizer.ggml.model", Value::str(spm ? "llama" : "gpt2")}};
  if (!spm) meta.emplace_back("tokenizer.ggml.pre", Value::str(pre_name));
  meta.emplace_back("tokenizer.ggml.tokens", Value::array(Value::Kind::String, tokens));
  meta.emplace_back("tokenizer.ggml.token_type", Value::array(Value::Kind::I32, types));
  if (spm) meta.emplace_back("tokenizer.ggml.scores", Value::array(Value::Kind::F32, scores));
  else meta.emplace_back("tokenizer.ggml.merges", Value::array(Value::Kind::String, merges));
  // BOS: the special token a TemplateProcessing post-processor puts first.
  std::int64_t bos = -1;
  std::function<void(const json&)> find_bos = [&](const json& p) {
    if (is(p, "Sequence"))
      for (const json& q : p.at("processors")) find_bos(q);
    if (is(p, "TemplateProcessing") && !p.at("single").empty() && p["single"][0].contains("SpecialToken")) {
      const std::string s = p["single"][0]["SpecialToken"]["id"];
      for (const auto& [id, t] : by_id)
        if (t == s) bos = id;
    }
  };
  if (tj.contains("post_processor") && !tj["post_processor"].is_null()) find_bos(tj["post_processor"]);
  Value b;
  b.kind = Value::Kind::Bool, b.i = bos >= 0;
  meta.emplace_back("tokenizer.ggml.add_bos_token", b);
  if (bos >= 0) meta.emplace_back("tokenizer.ggml.bos_token_id", Value::u32(static_cast<std::uint32_t>(bos)));
  if (spm) {
    Value p;
    p.kind = Value::Kind::Bool;
    p.i = metaspace_pre ? pres[0].value("prepend_scheme", "always") != "never" : is(norms.front(), "Prepend");
    meta.emplace_back("tokenizer.ggml.add_space_prefix", p);
  }
  return meta;
}

}  // namespace inferlab::gguf
