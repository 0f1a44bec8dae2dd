// The tokenizer a GGUF file carries: each golden tokenizer family written as tokenizer.ggml.*
// metadata, read back, and held to the `tokenizers` library's own ids for every golden case
// (data/golden/tokenizers, made by tools/make_test_goldens.py); the SentencePiece reader against
// llama2.c's tokenizer on a real SentencePiece vocabulary; refusals; the stop ids.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/eval.h"
#include "common/gguf_tokenizer.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "test_util.h"

using namespace inferlab;

namespace {

const std::string kGolden = std::string(INFERLAB_DATA_DIR) + "/golden/tokenizers";

// A GGUF holding only metadata: what the tokenizer reader looks at.
std::string write_metadata(const test::TempDir& dir, const std::string& name,
                           std::vector<std::pair<std::string, gguf::Value>> meta) {
  meta.insert(meta.begin(), {"general.architecture", gguf::Value::str("llama")});
  const std::string path = dir.file(name + ".gguf");
  gguf::write(path, meta, {});
  return path;
}

class GgufTokenizerGolden : public ::testing::TestWithParam<const char*> {};

}  // namespace

// Written as llama.cpp names it, read back, and encoded: the `tokenizers` library's ids, with and
// without special tokens, and its decoded text.
TEST_P(GgufTokenizerGolden, ReadsBackTheIdsOfTheTokenizersLibrary) {
  const std::string dir = kGolden + "/" + GetParam();
  const auto doc = load_json(dir + "/cases.json");
  const std::int64_t vocab = doc["vocab_size"].get<std::int64_t>();
  test::TempDir tmp;
  // Padded to more embedding rows than tokens, as exports are.
  const auto meta = gguf::tokenizer_metadata(load_json(dir + "/tokenizer.json"), dir + "/tokenizer.json", vocab + 7);
  const gguf::File f(write_metadata(tmp, GetParam(), meta));
  const auto tok = gguf::tokenizer(f);
  EXPECT_EQ(tok->vocab_size(), vocab) << "the padding is not part of the tokenizer";
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto ids = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok->encode(text), ids);
    EXPECT_EQ(tok->encode(text, false), c["ids_no_special"].get<std::vector<std::int32_t>>());
    EXPECT_EQ(tok->decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GgufTokenizerGolden, ::testing::Values("gpt2", "llama3", "smollm", "llama2"));

// What each family is written as: the names llama.cpp reads.
TEST(GgufTokenizer, WritesTheNamesLlamaCppReads) {
  auto value = [](const std::vector<std::pair<std::string, gguf::Value>>& meta, const std::string& key) {
    for (const auto& [k, v] : meta)
      if (k == key) return v;
    ADD_FAILURE() << "no " << key;
    return gguf::Value{};
  };
  for (const auto& [family, model, pre] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"gpt2", "gpt2", "gpt-2"},
                                                                      {"llama3", "gpt2", "llama-bpe"},
                                                                      {"smollm", "gpt2", "smollm"},
                                                                      {"llama2", "llama", ""}}) {
    const std::string path = kGolden + "/" + family + "/tokenizer.json";
    const auto meta = gguf::tokenizer_metadata(load_json(path), path, 1000);
    EXPECT_EQ(value(meta, "tokenizer.ggml.model").s, model) << family;
    if (!pre.empty()) {
      EXPECT_EQ(value(meta, "tokenizer.ggml.pre").s, pre) << family;
    }
  }
  // An NFC normalizer has no GGUF equivalent: refused, not written as something else.
  const std::string qwen = kGolden + "/qwen/tokenizer.json";
  test::expect_error([&] { gguf::tokenizer_metadata(load_json(qwen), qwen, 1000); }, {"qwen", "normalizer", "NFC"});
  test::expect_error([&] { gguf::tokenizer_metadata(load_json(qwen), qwen, 10); }, {"normalizer"});
  // Mistral's Metaspace adds "▁" only where the text does not start with one; llama.cpp always adds it.
  const std::string mistral = kGolden + "/mistral/tokenizer.json";
  test::expect_error([&] { gguf::tokenizer_metadata(load_json(mistral), mistral, 1000); },
                     {"mistral", "Metaspace", "texts that start with a space would tokenize differently"});
  const std::string gpt2 = kGolden + "/gpt2/tokenizer.json";
  test::expect_error([&] { gguf::tokenizer_metadata(load_json(gpt2), gpt2, 10); }, {"600 tokens", "10 embedding rows"});
}

// The SentencePiece reader (scores turned into ranked merges) against llama2.c's tokenizer, which
// merges by score directly, on a real SentencePiece vocabulary and the validation text.
TEST(GgufTokenizer, SentencePieceScoresTokenizeAsLlama2cDoes) {
  const std::string bin = std::string(INFERLAB_SHARED_DIR) + "/models/stories260K/tok512.bin";
  if (!std::filesystem::exists(bin)) GTEST_SKIP() << bin << " is absent (the shared test data)";
  const Llama2cTokenizer ref = Llama2cTokenizer::load(bin);
  std::vector<gguf::Value> tokens, types, scores;
  for (std::int32_t i = 0; i < ref.vocab_size(); ++i) {
    std::string p = ref.id_to_token(i);
    for (std::size_t k = 0; (k = p.find(' ', k)) != std::string::npos;)
      p.replace(k, 1, "\xE2\x96\x81");  // llama2.c stores ▁ as a space
    tokens.push_back(gguf::Value::str(p));
    gguf::Value t;
    t.kind = gguf::Value::Kind::I32;
    t.i = i == 0 ? 2 : i < 3 ? 3 : (p.size() == 6 && p.rfind("<0x", 0) == 0) ? 6 : 1;
    types.push_back(t);
    scores.push_back(gguf::Value::f32(ref.score(i)));
  }
  test::TempDir tmp;
  const gguf::File f(write_metadata(tmp, "spm",
                                    {{"tokenizer.ggml.model", gguf::Value::str("llama")},
                                     {"tokenizer.ggml.tokens", gguf::Value::array(gguf::Value::Kind::String, tokens)},
                                     {"tokenizer.ggml.token_type", gguf::Value::array(gguf::Value::Kind::I32, types)},
                                     {"tokenizer.ggml.scores", gguf::Value::array(gguf::Value::Kind::F32, scores)},
                                     {"tokenizer.ggml.bos_token_id", gguf::Value::u32(1)},
                                     {"tokenizer.ggml.eos_token_id", gguf::Value::u32(2)}}));
  const auto tok = gguf::tokenizer(f);
  std::string text = test::read_file(std::string(INFERLAB_DATA_DIR) + "/corpus/val.txt").substr(0, 20000);
  std::size_t lines = 0;
  for (std::size_t a = 0; a < text.size() && lines < 300; ++lines) {  // sentences, or lines
    const std::size_t b = std::min({text.find('\n', a), text.find(". ", a), text.size()});
    const std::string line = text.substr(a, b - a);
    a = b + 1;
    if (line.empty()) continue;
    SCOPED_TRACE("line: \"" + line + "\"");
    ASSERT_EQ(tok->encode(line), ref.encode(line));
    ASSERT_EQ(tok->decode(tok->encode(line), true), line);
  }
  EXPECT_GT(lines, 100u);
  // With the text's spaces and line breaks, and a byte fallback (a character outside its 512 pieces).
  for (const std::string& s : {text.substr(0, 3000), std::string("  two  spaces\n\nand é ✓ 🚀")})
    ASSERT_EQ(tok->encode(s), ref.encode(s)) << s;
}

TEST(GgufTokenizer, RefusalsNameTheFileAndTheKey) {
  test::TempDir tmp;
  auto tokens = gguf::Value::array(gguf::Value::Kind::String, {gguf::Value::str("a"), gguf::Value::str("b")});
  const gguf::File wpm(
      write_metadata(tmp, "wpm", {{"tokenizer.ggml.model", gguf::Value::str("bert")}, {"tokenizer.ggml.tokens", tokens}}));
  test::expect_error([&] { gguf::tokenizer(wpm); }, {"wpm.gguf", "tokenizer.ggml.model 'bert'"});
  const gguf::File pre(write_metadata(tmp, "pre",
                                      {{"tokenizer.ggml.model", gguf::Value::str("gpt2")},
                                       {"tokenizer.ggml.pre", gguf::Value::str("deepseek-llm")},
                                       {"tokenizer.ggml.tokens", tokens},
                                       {"tokenizer.ggml.merges", gguf::Value::array(gguf::Value::Kind::String, {})}}));
  test::expect_error([&] { gguf::tokenizer(pre); }, {"pre.gguf", "tokenizer.ggml.pre 'deepseek-llm'"});
  const gguf::File bos(write_metadata(tmp, "bos",
                                      {{"tokenizer.ggml.model", gguf::Value::str("gpt2")},
                                       {"tokenizer.ggml.tokens", tokens},
                                       {"tokenizer.ggml.merges", gguf::Value::array(gguf::Value::Kind::String, {})},
                                       {"tokenizer.ggml.bos_token_id", gguf::Value::u32(7)}}));
  test::expect_error([&] { gguf::tokenizer(bos); }, {"bos.gguf", "bos_token_id' = 7", "2 tokens"});
  const gguf::File scores(write_metadata(tmp, "scores",
                                         {{"tokenizer.ggml.model", gguf::Value::str("llama")},
                                          {"tokenizer.ggml.tokens", tokens},
                                          {"tokenizer.ggml.bos_token_id", gguf::Value::u32(0)}}));
  test::expect_error([&] { gguf::tokenizer(scores); }, {"scores.gguf", "tokenizer.ggml.scores"});
}

// Generation stops at the EOS, end-of-turn and end-of-message ids, and at chat formats' end tokens.
TEST(GgufTokenizer, StopIds) {
  test::TempDir tmp;
  std::vector<gguf::Value> tokens, types;
  for (const char* t : {"<|endoftext|>", "a", "<|im_end|>", "<|im_end|>", "<|eot_id|>"})
    tokens.push_back(gguf::Value::str(t));
  for (int t : {3, 1, 3, 1, 3}) {
    gguf::Value v;
    v.kind = gguf::Value::Kind::I32, v.i = t;
    types.push_back(v);
  }
  const gguf::File f(write_metadata(tmp, "stops",
                                    {{"tokenizer.ggml.tokens", gguf::Value::array(gguf::Value::Kind::String, tokens)},
                                     {"tokenizer.ggml.token_type", gguf::Value::array(gguf::Value::Kind::I32, types)},
                                     {"tokenizer.ggml.eos_token_id", gguf::Value::u32(1)}}));
  // 1 (EOS), 0 and 2 and 4 (control end tokens); 3 is a normal token that only looks like one.
  EXPECT_EQ(gguf::stop_ids(f), (std::vector<std::int64_t>{0, 1, 2, 4}));
}
