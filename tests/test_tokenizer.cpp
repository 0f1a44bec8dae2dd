// tokenizer.json: encodings and decodings against Hugging Face `tokenizers` on six tokenizer
// families (goldens made by tools/make_test_goldens.py), round trips on Unicode text, and
// clear errors for what we do not support or cannot read.
#include "common/json_file.h"
#include "common/tokenizer.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_error;
const std::string kGolden = std::string(INFERLAB_DATA_DIR) + "/golden/tokenizers";

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesHuggingFaceTokenizers) {
  const std::string dir = kGolden + "/" + GetParam();
  const HfTokenizer tok = HfTokenizer::load(dir);
  const auto doc = load_json(dir + "/cases.json");
  EXPECT_EQ(tok.vocab_size(), doc["vocab_size"].get<std::int64_t>());
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto ids = c["ids"].get<std::vector<std::int32_t>>();
    EXPECT_EQ(tok.encode(text), ids);
    EXPECT_EQ(tok.encode(text, false), c["ids_no_special"].get<std::vector<std::int32_t>>());
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerGolden,
                         ::testing::Values("gpt2", "llama3", "smollm", "qwen", "llama2", "mistral"));

TEST(Tokenizer, ByteLevelRoundTripsAnyUnicode) {
  const HfTokenizer tok = HfTokenizer::load(kGolden + "/gpt2");
  for (const std::string s : {"Grüße aus Köln 🚀\n", "日本語のテキスト、句読点。", "a\u0301\u0302 \t\r\n x", "مرحبا بالعالم",
                              "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9", "   ", ""}) {
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<|endoftext|>")));
  EXPECT_FALSE(tok.is_special(*tok.token_to_id("a")));
  EXPECT_EQ(tok.id_to_token(*tok.token_to_id("Ġthe")), "Ġthe");
}

TEST(Tokenizer, ByteFallbackRoundTripsUnseenCharacters) {
  const HfTokenizer tok = HfTokenizer::load(kGolden + "/llama2");
  const std::string s = "ψ∑ and 𝔘 never appeared in training";
  const auto ids = tok.encode(s);
  EXPECT_EQ(tok.decode(ids, true), s);
  EXPECT_EQ(ids[0], *tok.token_to_id("<s>"));
  bool has_byte = false;
  for (auto id : ids) has_byte |= tok.id_to_token(id).rfind("<0x", 0) == 0;
  EXPECT_TRUE(has_byte) << "unseen characters should become <0xHH> byte tokens";
}

TEST(Tokenizer, MergesApplyByRankNotByPosition) {
  // Vocabulary a, b, c, ab, bc, abc; the merge "b c" ranks before "a b", so "abc" must merge
  // b+c first and then a+bc ... which is not in the merges: the result is [a, bc].
  test::TempDir dir;
  test::write_file(dir.file("tokenizer.json"), R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5},
              "merges": ["b c", "a b"]},
    "pre_tokenizer": null, "decoder": {"type": "Fuse"}})");
  const HfTokenizer tok = HfTokenizer::load(dir.path().string());
  EXPECT_EQ(tok.encode("abc"), (std::vector<std::int32_t>{0, 4}));
  EXPECT_EQ(tok.encode("abab"), (std::vector<std::int32_t>{3, 3}));
  EXPECT_EQ(tok.decode({0, 4, 3}), "abcab");
}

// A field of the wrong type anywhere in a tokenizer.json names the component and the field (it
// used to be "malformed tokenizer.json: [json.exception.type_error.302] type must be string").
TEST(Tokenizer, FieldsOfTheWrongTypeAreNamedWithTheirComponent) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"("decoder": 5)", {"decoder: expected a JSON object"}},
      {R"("normalizer": {"type": 5})", {"normalizer: field 'type' must be a string, got 5"}},
      {R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "yes"})",
       {"pre_tokenizer: field 'add_prefix_space' must be true or false"}},
      {R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": 5}]})",
       {"pre_tokenizer.pretokenizers[0]: field 'behavior' must be a string"}},
      {R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": {"type": "Digits"}})",
       {"pre_tokenizer: field 'pretokenizers' must be a list"}},
      {R"("decoder": {"type": "Strip", "content": " ", "start": -1})", {"decoder: field 'start'", "out of range"}},
      {R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 3}}]})",
       {"post_processor: template item SpecialToken: field 'id' must be a string"}},
      {R"("added_tokens": "x")", {"field 'added_tokens' must be a list"}},
  };
  for (const auto& [field, parts] : cases) {
    test::write_file(path, "{" + model + ", " + field + "}");
    std::vector<std::string> want = parts;
    want.push_back(path);
    try {
      HfTokenizer::load(path);
      ADD_FAILURE() << field << ": expected an error";
    } catch (const Error& e) {
      for (const auto& p : want)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << field << "\nmessage: " << e.what();
    }
  }
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": [1, 2], "merges": []}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "model: field 'vocab' must be an object, got [1,2]"});
}

TEST(Tokenizer, ErrorsNameTheProblem) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  expect_error([&] { HfTokenizer::load(dir.file("missing.json")); }, {"missing.json"});
  test::write_file(path, R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "model type 'WordPiece' is not supported"});
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "merge 'a b c'"});
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                             "pre_tokenizer": {"type": "BertPreTokenizer"}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "pre_tokenizer type 'BertPreTokenizer' is not supported"});
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                             "normalizer": {"type": "Replace", "content": "x"}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "normalizer: missing field 'pattern'"});
  // BPE dropout picks merges at random: it used to be ignored.
  test::write_file(path, R"({"model": {"type": "BPE", "dropout": 0.5, "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "model.dropout is 0.5", "not implemented"});
  test::write_file(path, R"({"model": {"type": "BPE", "dropout": "x", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "field 'dropout' must be a number"});
  test::write_file(path, R"({"model": {"type": "BPE", "dropout": null, "vocab": {"a": 0}, "merges": []}})");
  HfTokenizer::load(path);
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  const HfTokenizer tok = HfTokenizer::load(path);
  expect_error([&] { tok.encode("ab"); }, {"'b' is not in the vocabulary", "no unk_token"});
  expect_error([&] { tok.encode("a\xC3"); }, {"not valid UTF-8 at byte 1"});
  expect_error([&] { tok.decode({0, 5}); }, {"token id 5", "[0, 1)"});
}

TEST(Tokenizer, IdsAreCheckedNotNarrowed) {
  // Each id used to go through a plain int32 cast: 2^32 aliased token 0, 2^31 indexed the id
  // table at a negative offset (SIGSEGV), 2^31 - 1 sized it at 64 GB before any check.
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  const std::string added = R"("added_tokens": [{"id": 1, "content": "<s>", "special": true}])";
  auto with = [&](const std::string& vocab, const std::string& more) {
    test::write_file(path, R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": []}, )" + more + "}");
  };
  with(R"({"a": 0, "b": 4294967296})", added);
  expect_error([&] { HfTokenizer::load(path); }, {path, "vocab entry 'b'", "4294967296", "out of range"});
  with(R"({"a": 0, "b": 2147483648})", added);
  expect_error([&] { HfTokenizer::load(path); }, {path, "vocab entry 'b'", "2147483648"});
  with(R"({"a": 0, "b": 2147483647})", added);
  expect_error([&] { HfTokenizer::load(path); }, {path, "vocab entry 'b'", "id 2147483647 is outside [0, 16777216)"});
  with(R"({"a": 0, "b": 1})", R"("added_tokens": [{"id": 4294967297, "content": "<s>"}])");
  expect_error([&] { HfTokenizer::load(path); }, {path, "added_tokens entry: field 'id'", "4294967297"});
  with(R"({"a": 0, "b": 1})", R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
      {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [4294967297]}}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "post_processor: token '<s>' id", "4294967297"});
  // Two tokens sharing an id, and a merge into a token that is not there, are refused as the
  // tokenizers library refuses them: neither has one meaning.
  with(R"({"a": 0, "b": 0})", added);
  expect_error([&] { HfTokenizer::load(path); }, {path, "share id 0"});
  test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  expect_error([&] { HfTokenizer::load(path); }, {path, "merge 'a b': 'ab' is not in the vocabulary"});
}

TEST(Tokenizer, AFifoOrADirectoryIsRefusedByName) {
  test::TempDir dir;
  test::expect_fifo_refused(dir.file("tokenizer.json"), [](const std::string& p) { HfTokenizer::load(p); });
  std::filesystem::create_directories(dir.file("model/tokenizer.json"));
  expect_error([&] { HfTokenizer::load(dir.file("model")); }, {"model/tokenizer.json", "a directory, not a regular file"});
  test::expect_fifo_refused(dir.file("tokenizer.bin"), [](const std::string& p) { Tokenizer::load(p); });
}

}  // namespace
}  // namespace inferlab
