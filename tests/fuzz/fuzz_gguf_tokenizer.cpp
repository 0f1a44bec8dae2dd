// A GGUF file's tokenizer metadata (tokenizer.ggml.*), structure-aware: the fuzzer's bytes choose
// the keys, the kinds of their values and the values themselves (tokens of any bytes, token types
// of any integer, scores of any bit pattern, NaN included, ids of any sign), so that nearly every
// input is a well-formed GGUF whose tokenizer the reader must refuse by name or read correctly.
// The file is written with the project's GGUF writer, read back, and its tokenizer built, used to
// encode and decode the fuzzer's text, and its stop ids read; and loaded as a tokenizer file.
#include <fuzzer/FuzzedDataProvider.h>

#include <bit>
#include <cstring>

#include "common/gguf.h"
#include "common/gguf_tokenizer.h"
#include "fuzz_util.h"

namespace {

using inferlab::gguf::Value;
using Kind = Value::Kind;

Kind integer_kind(FuzzedDataProvider& in) {
  static const Kind kinds[] = {Kind::I32, Kind::U32, Kind::I64, Kind::U8, Kind::I8, Kind::F32, Kind::String, Kind::Bool};
  return kinds[in.ConsumeIntegralInRange<std::size_t>(0, sizeof kinds / sizeof kinds[0] - 1)];
}

// A value of `kind` from the input: integers of any sign, floats of any bit pattern.
Value scalar(FuzzedDataProvider& in, Kind kind) {
  Value v;
  v.kind = kind;
  if (kind == Kind::String) v.s = in.ConsumeRandomLengthString(16);
  else if (kind == Kind::F32) v.f = std::bit_cast<float>(in.ConsumeIntegral<std::uint32_t>());
  else if (kind == Kind::F64) v.f = std::bit_cast<double>(in.ConsumeIntegral<std::uint64_t>());
  else if (kind == Kind::Bool) v.i = in.ConsumeBool();
  else if (kind == Kind::U8) v.i = in.ConsumeIntegral<std::uint8_t>();
  else if (kind == Kind::I8) v.i = in.ConsumeIntegral<std::int8_t>();
  else if (kind == Kind::U32) v.i = in.ConsumeIntegral<std::uint32_t>();
  else if (kind == Kind::I32) v.i = in.ConsumeIntegral<std::int32_t>();
  else v.i = in.ConsumeIntegralInRange<std::int64_t>(-4, 80);  // I64: mostly ids near the vocabulary
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  FuzzedDataProvider in(data, size);
  const bool spm = in.ConsumeBool();
  const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 64);
  std::vector<Value> tokens, types, scores, merges;
  const Kind type_kind = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? integer_kind(in) : Kind::I32;
  const Kind score_kind = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? integer_kind(in) : Kind::F32;
  for (std::size_t i = 0; i < n; ++i) {
    // Mostly short pieces of a small alphabet, so that merges and splits exist; now and then any bytes.
    std::string t = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeRandomLengthString(8) : "";
    if (t.empty())
      for (int k = in.ConsumeIntegralInRange<int>(1, 4); k > 0; --k)
        t += "ab\xE2\x96\x81 c"[in.ConsumeIntegralInRange<int>(0, 5)];
    tokens.push_back(Value::str(t));
    Value type = scalar(in, type_kind);
    if (type_kind == Kind::I32 && in.ConsumeIntegralInRange<int>(0, 3) != 0) type.i = 1 + std::abs(type.i) % 6;
    types.push_back(type);
    Value score = scalar(in, score_kind);
    if (score_kind == Kind::F32 && in.ConsumeBool()) score.f = -static_cast<double>(i);
    scores.push_back(score);
  }
  for (std::size_t i = 0, m = in.ConsumeIntegralInRange<std::size_t>(0, 16); i < m && n > 0; ++i) {
    const auto& a = tokens[in.ConsumeIntegralInRange<std::size_t>(0, n - 1)].s;
    const auto& b = tokens[in.ConsumeIntegralInRange<std::size_t>(0, n - 1)].s;
    merges.push_back(Value::str(in.ConsumeBool() ? a + " " + b : in.ConsumeRandomLengthString(8)));
  }
  std::vector<std::pair<std::string, Value>> meta = {{"general.architecture", Value::str("llama")},
                                                     {"tokenizer.ggml.model", Value::str(spm ? "llama" : "gpt2")}};
  if (in.ConsumeBool()) meta.emplace_back("tokenizer.ggml.pre", Value::str(in.ConsumeBool() ? "gpt-2" : "llama-bpe"));
  meta.emplace_back("tokenizer.ggml.tokens", Value::array(Kind::String, tokens));
  if (in.ConsumeIntegralInRange<int>(0, 7) != 0)
    meta.emplace_back("tokenizer.ggml.token_type", Value::array(type_kind, types));
  if (spm) meta.emplace_back("tokenizer.ggml.scores", Value::array(score_kind, scores));
  else meta.emplace_back("tokenizer.ggml.merges", Value::array(Kind::String, merges));
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id"})
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) meta.emplace_back(key, scalar(in, integer_kind(in)));
  for (const char* key : {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"})
    if (in.ConsumeBool()) meta.emplace_back(key, scalar(in, in.ConsumeBool() ? Kind::Bool : integer_kind(in)));
  const std::string text = in.ConsumeRemainingBytesAsString();
  const std::string path = fuzz::work_dir() + "/tokenizer.gguf";
  fuzz::expect_clean([&] { gguf::write(path, meta, {}); });
  fuzz::expect_clean([&] {
    const gguf::File f(path);
    gguf::stop_ids(f);
    const auto tok = gguf::tokenizer(f);
    const auto ids = tok->encode(text);
    tok->decode(ids, false);
    tok->decode(ids, true);
  });
  fuzz::expect_clean([&] { Tokenizer::load(path)->encode("Once upon a time"); });
  return 0;
}
