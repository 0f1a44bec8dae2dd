#pragma once
/// @file gguf_tokenizer.h
/// @brief The tokenizer a GGUF file carries (tokenizer.ggml.*), in both directions.
///
/// llama.cpp stores a model's vocabulary in the file's metadata: the model kind
/// (tokenizer.ggml.model), the tokens, their types (1 normal, 2 unknown, 3 control, 4 user
/// defined, 5 unused, 6 byte), special ids, and per kind:
/// - "gpt2", byte-level BPE: the merges, and the pre-tokenizer by name (tokenizer.ggml.pre),
///   each name standing for a fixed sequence of splitting regexes in llama.cpp;
/// - "llama", SentencePiece BPE: a score per token (merge the adjacent pair whose merged piece
///   scores highest), spaces as "▁", bytes outside the vocabulary as <0xHH> tokens.
/// Reading builds the tokenizer.json that means the same and loads it as an HfTokenizer (the
/// SentencePiece scores become ranked merges, as Hugging Face's converter does). Writing goes
/// the other way for the tokenizer.json families llama.cpp names; anything else is refused,
/// naming the part that has no GGUF equivalent.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/gguf.h"
#include "common/tokenizer.h"

namespace inferlab::gguf {

/// The tokenizer.json equivalent of the file's tokenizer.ggml.* metadata. Trailing unused
/// (type 5) tokens, an exporter's padding up to the embedding's rows, are left out. Throws naming
/// the file and the key for a missing or malformed key, and for a model kind or pre-tokenizer
/// name this reader does not implement.
nlohmann::json tokenizer_json(const File& f);

/// The tokenizer of tokenizer_json(f), named after the file: "model.gguf (tokenizer.ggml.*)".
std::unique_ptr<Tokenizer> tokenizer(const File& f);

/// True when `path` starts with GGUF's magic bytes.
bool is_gguf_file(const std::string& path);
/// A GGUF file as a tokenizer file (Tokenizer::load, `--tokenizer model.gguf`): its tokenizer().
TokenizerFormat tokenizer_format();

/// The ids generation stops at: the EOS, end-of-turn and end-of-message ids the file names
/// (tokenizer.ggml.eos/eot/eom_token_id), and its control tokens whose text ends a turn in the
/// common chat formats (`<|im_end|>`, `<|eot_id|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`).
std::vector<std::int64_t> stop_ids(const File& f);

/// The tokenizer.ggml.* metadata for a tokenizer.json (`path` names it in errors), padded with
/// unused tokens up to `rows` embedding rows: "gpt2" for byte-level BPE with the GPT-2,
/// Llama-3, Qwen2 or SmolLM pre-tokenizer, "llama" for SentencePiece-style BPE (Metaspace or
/// the Prepend/Replace normalizer, byte fallback), whose scores rank the merges.
std::vector<std::pair<std::string, Value>> tokenizer_metadata(const nlohmann::json& tokenizer_json, const std::string& path,
                                                              std::int64_t rows);

}  // namespace inferlab::gguf
