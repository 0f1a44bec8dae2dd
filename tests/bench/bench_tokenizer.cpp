// The GGUF SentencePiece reader against the length of its longest piece: loading a vocabulary and
// tokenizing a short prompt. Each piece is split into every pair of vocabulary pieces it could be
// merged from; comparing every split's strings made this quadratic in the piece's length (a 1 MB
// piece took 34 s), and prefix hashes make it linear. The time per byte should stay flat.
//
//   bench_tokenizer [--benchmark_filter=...]
#include <unistd.h>
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_main.h"
#include "common/gguf.h"
#include "common/gguf_tokenizer.h"

using namespace inferlab;

namespace {

// "▁", "a", "▁a", one piece of `length` a's, and the bytes, written as a GGUF's metadata.
std::string write_vocabulary(std::int64_t length) {
  using gguf::Value;
  std::vector<Value> tokens, types, scores;
  auto add = [&](const std::string& p, int type) {
    scores.push_back(Value::f32(-static_cast<float>(tokens.size())));
    tokens.push_back(Value::str(p));
    Value t;
    t.kind = Value::Kind::I32, t.i = type;
    types.push_back(t);
  };
  for (const std::string p : {"\xE2\x96\x81", "a",
                              "\xE2\x96\x81"
                              "a"})
    add(p, 1);
  add(std::string(static_cast<std::size_t>(length), 'a'), 1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 6);
  }
  Value no;
  no.kind = Value::Kind::Bool, no.i = 0;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bench_tokenizer_" + std::to_string(::getpid()) + ".gguf")).string();
  gguf::write(path,
              {{"general.architecture", Value::str("llama")},
               {"tokenizer.ggml.model", Value::str("llama")},
               {"tokenizer.ggml.tokens", Value::array(Value::Kind::String, tokens)},
               {"tokenizer.ggml.token_type", Value::array(Value::Kind::I32, types)},
               {"tokenizer.ggml.scores", Value::array(Value::Kind::F32, scores)},
               {"tokenizer.ggml.add_bos_token", no}},
              {});
  return path;
}

void BM_GgufSentencePieceLongestPiece(benchmark::State& state) {
  const std::string path = write_vocabulary(state.range(0));
  const gguf::File f(path);
  for (auto _ : state) {
    const auto tok = gguf::tokenizer(f);
    benchmark::DoNotOptimize(tok->encode("Once upon a time, a cat"));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
  std::filesystem::remove(path);
}
BENCHMARK(BM_GgufSentencePieceLongestPiece)->RangeMultiplier(4)->Range(1 << 10, 1 << 20)->Unit(benchmark::kMillisecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
