#pragma once
// A byte-level BPE tokenizer.json of 29 tokens (<|endoftext|>, a-z, "ab", "abc"), for models whose
// vocabulary is smaller than the bundled one: a GGUF's vocabulary must fit its embedding rows.
#include <string>
#include <nlohmann/json.hpp>

namespace inferlab::test {

inline nlohmann::json small_bpe_tokenizer() {
  nlohmann::json vocab = {{"<|endoftext|>", 0}};
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = static_cast<int>(vocab.size());
  vocab["ab"] = 27, vocab["abc"] = 28;
  return {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 0},
         {"content", "<|endoftext|>"},
         {"special", true},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c"}}}}};
}

}  // namespace inferlab::test
