#include "common/gguf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/error.h"

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

bool flag(const File& f, const std::string& key, bool otherwise) {
  if (!f.has(key)) return otherwise;
  const Value& v = f.get(key);
  IL_CHECK(v.kind == Value::Kind::Bool, f.path(), ": metadata '", key, "' is ", kind_name(v.kind), ", not BOOL");
  return v.i != 0;
}

}  // namespace

json tokenizer_json(const File& f) {
  const std::string& kind = f.get_string("tokenizer.ggml.model");
  const std::vector<std::string> tokens = strings(f, "tokenizer.ggml.tokens");
  std::vector<std::int64_t> types(tokens.size(), Normal);
  if (f.has("tokenizer.ggml.token_type")) {
    const Value& t = f.get("tokenizer.ggml.token_type");
    IL_CHECK(t.kind == Value::Kind::Array && t.items.size() == tokens.size(), f.path(),
             ": metadata 'tokenizer.ggml.token_type' must be an array of one type per token (", tokens.size(), ")");
    for (std::size_t i = 0; i < tokens.size(); ++i) types[i] = t.items[i].i;
  }
  std::size_t n = tokens.size();
  while (n > 0 && types[n - 1] == Unused) --n;  // an exporter's padding to the embedding's rows
  IL_CHECK(n > 0, f.path(), ": metadata 'tokenizer.ggml.tokens' holds no token");
  auto id_of = [&](const std::string& key) -> std::int64_t {
    if (!f.has(key)) return -1;
    const std::int64_t id = f.get_int(key);
    IL_CHECK(id >= 0 && id < static_cast<std::int64_t>(n), f.path(), ": metadata '", key, "' = ", id,
             " is outside the vocabulary of ", n, " tokens");
    return id;
  };
  const std::int64_t bos = id_of("tokenizer.ggml.bos_token_id");
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
    struct M {
      double score;
      std::int64_t id, l, r;
      std::string a, b;
    };
    std::vector<M> merges;
    for (std::size_t i = 0; i < n; ++i) {
      if (types[i] != Normal) continue;
      const std::string& p = tokens[i];
      for (std::size_t k = 1; k < p.size(); ++k) {
        if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // not between two UTF-8 characters
        const std::string a = p.substr(0, k), b = p.substr(k);
        if (vocab.contains(a) && vocab.contains(b))
          merges.push_back({sv.items[i].f, static_cast<std::int64_t>(i), vocab[a].get<std::int64_t>(),
                            vocab[b].get<std::int64_t>(), a, b});
      }
    }
    std::sort(merges.begin(), merges.end(), [](const M& x, const M& y) {
      return x.score != y.score ? x.score > y.score : std::tie(x.id, x.l, x.r) < std::tie(y.id, y.l, y.r);
    });
    json jm = json::array();
    for (const M& m : merges) jm.push_back(json::array({m.a, m.b}));
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

std::vector<std::int64_t> stop_ids(const File& f) {
  std::vector<std::int64_t> out;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.has(key)) out.push_back(f.get_int(key));
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
