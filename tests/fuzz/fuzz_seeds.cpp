// Writes the fuzz targets' seed corpora: small valid files of every format, made with the
// project's own writers and the bundled data, so that the fuzzers start from inputs that reach
// deep into each reader. Usage: fuzz_seeds OUT_DIR DATA_DIR [SHARED_DIR]
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <vector>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/llama.h"
#include "chapters/09_quantization/gguf_model.h"
#include "common/llama2c.h"
#include "common/safetensors.h"
#include "tests/small_tokenizer.h"

namespace fs = std::filesystem;
using namespace inferlab;

namespace {

// A Llama small enough for a seed, large enough for q8_0/q4_0 blocks (widths multiples of 32).
TransformerConfig tiny_config() {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 32, c.intermediate_size = 64, c.num_layers = 1, c.num_heads = 2, c.num_kv_heads = 1;
  c.head_dim = 16, c.vocab_size = 32, c.max_position_embeddings = 64, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  c.eos_token_ids = {2};
  return c;
}

std::string dir(const fs::path& out, const std::string& target) {
  fs::create_directories(out / target);
  return (out / target).string();
}

void copy_if(const fs::path& from, const fs::path& to) {
  if (fs::is_regular_file(from)) fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: fuzz_seeds OUT_DIR DATA_DIR [SHARED_DIR]\n";
    return 2;
  }
  const fs::path out = argv[1], data = argv[2], shared = argc > 3 ? argv[3] : "";
  const models::Llama m = models::random_llama(tiny_config(), 7);
  const auto& l = m.layers[0];

  // safetensors: the tiny model's tensors as a Hugging Face checkpoint names them.
  save_safetensors(dir(out, "safetensors") + "/tiny.safetensors",
                   {{"model.embed_tokens.weight", m.embed},
                    {"model.norm.weight", m.final_norm},
                    {"model.layers.0.self_attn.q_proj.weight", l.wq.weight},
                    {"model.layers.0.mlp.down_proj.weight", l.w_down.weight.to(DType::BF16)}},
                   {{"format", "pt"}});
  // config.json: every bundled model's.
  for (const auto& e : fs::directory_iterator(data / "models"))
    copy_if(e.path() / "config.json", dir(out, "config") + "/" + e.path().filename().string() + ".json");
  // tokenizer.json: the bundled byte-level BPE.
  copy_if(data / "models/tiny-mha/tokenizer.json", dir(out, "tokenizer_json") + "/tiny-mha.json");
  // llama2.c: the tiny model as a .bin, and tokenizers.
  std::map<std::string, Tensor> named;
  named["model.embed_tokens.weight"] = m.embed;
  named["model.norm.weight"] = m.final_norm;
  const std::string p = "model.layers.0.";
  named[p + "input_layernorm.weight"] = l.attn_norm, named[p + "post_attention_layernorm.weight"] = l.mlp_norm;
  named[p + "self_attn.q_proj.weight"] = l.wq.weight, named[p + "self_attn.k_proj.weight"] = l.wk.weight;
  named[p + "self_attn.v_proj.weight"] = l.wv.weight, named[p + "self_attn.o_proj.weight"] = l.wo.weight;
  named[p + "mlp.gate_proj.weight"] = l.w_gate.weight, named[p + "mlp.up_proj.weight"] = l.w_up.weight;
  named[p + "mlp.down_proj.weight"] = l.w_down.weight, named["lm_head.weight"] = m.lm_head.weight;
  save_llama2c(dir(out, "llama2c") + "/tiny.bin", m.config, named);
  {
    std::string bin(4, '\0');
    bin[0] = 8;
    for (const char* piece : {"<unk>", "<s>", "</s>", " ", "a", "Once", " upon", "<0x0A>"}) {
      const float score = -1.0f;
      const std::int32_t len = static_cast<std::int32_t>(std::string(piece).size());
      bin.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&len), 4).append(piece);
    }
    std::ofstream(dir(out, "llama2c_tokenizer") + "/small.bin", std::ios::binary) << bin;
  }
  if (!shared.empty()) copy_if(shared / "models/stories260K/tok512.bin", dir(out, "llama2c_tokenizer") + "/tok512.bin");
  // GGUF: the tiny model in q8_0 and q4_0, with a byte-level BPE tokenizer small enough for its
  // 32 embedding rows (a GGUF's vocabulary must fit its embedding).
  const nlohmann::json small = test::small_bpe_tokenizer();
  const std::string small_path = dir(out, "tokenizer_json") + "/small-bpe.json";
  std::ofstream(small_path) << small.dump();
  const HfTokenizer tok = HfTokenizer::load(small_path);
  for (auto f : {ch09::Format::Q8_0, ch09::Format::Q4_0}) {
    const ch09::QuantSpec spec{f};
    ch09::save_gguf(dir(out, "gguf") + "/tiny-" + spec.name() + ".gguf", ch09::quantize_model(m, spec), tok);
  }
  // hf_config: the bundled configs too (every architecture the chapters load).
  for (const auto& e : fs::directory_iterator(data / "models"))
    copy_if(e.path() / "config.json", dir(out, "hf_config") + "/" + e.path().filename().string() + ".json");
  // gguf_tokenizer and quant_blocks read their input as choices and values (FuzzedDataProvider, a
  // type byte and a rows byte): bytes from a fixed generator, and the quantised tiny model's rows.
  std::mt19937 g(11);
  for (int i = 0; i < 4; ++i) {
    std::string bytes(static_cast<std::size_t>(256 << i), '\0');
    for (char& c : bytes) c = static_cast<char>(g());
    std::ofstream(dir(out, "gguf_tokenizer") + "/" + std::to_string(i), std::ios::binary) << bytes;
  }
  for (int type = 0; type < 10; ++type) {
    std::string bytes = {static_cast<char>(type), static_cast<char>(type % 4)};
    for (int i = 0; i < 1200; ++i) bytes += static_cast<char>(g() % 4 == 0 ? 0 : g());
    std::ofstream(dir(out, "quant_blocks") + "/" + std::to_string(type), std::ios::binary) << bytes;
  }
  // openai: request bodies of both endpoints, every field the parser reads.
  const std::vector<std::string> requests = {
      R"({"model":"tiny-mha","prompt":"Once upon a time","max_tokens":16,"temperature":0.7,"top_p":0.9,"seed":3})",
      R"({"prompt":[1,2,3],"n":2,"stop":["
","."],"stream":true,"stream_options":{"include_usage":true}})",
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_completion_tokens":8})",
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"top_k":40,"ignore_eos":true})"};
  for (std::size_t i = 0; i < requests.size(); ++i)
    std::ofstream(dir(out, "openai") + "/" + std::to_string(i), std::ios::binary) << requests[i];
  // http: one connection's bytes: requests as clients send them (keep-alive, pipelined, chunked,
  // Expect, a stream), and the kinds the front refuses.
  auto post = [](const std::string& path, const std::string& body, const std::string& extra = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::vector<std::string> connections = {
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
      post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":4,"temperature":0,"seed":1})"),
      post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}})"),
      post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi<|endoftext|>"}],"max_tokens":3})",
           "Expect: 100-continue\r\n"),
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n{\"prompt\":\"Once\",\r\n10;ext=1\r\n\"max_tokens\":2} \r\n0\r\n\r\n",
      post("/v1/completions", R"({"prompt":"x","max_tokens":2})") + "GET /metrics HTTP/1.1\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
      "GET /" + std::string(300, 'a') + " HTTP/1.0\r\nX-A: 1\r\nX-B: 2\r\n\r\n"};
  for (std::size_t i = 0; i < connections.size(); ++i)
    std::ofstream(dir(out, "http") + "/" + std::to_string(i), std::ios::binary) << connections[i];
  // The command line: a few argument lists, NUL-separated.
  const std::vector<std::vector<std::string>> cmds = {{"--prompt", "hi", "--max-new-tokens", "8"},
                                                      {"sub", "--seq", "2048", "--batches", "1,2,4", "--flag"},
                                                      {"--temperature", "0.7", "--top-p", "0.9", "--top-k", "40"}};
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    std::string joined;
    for (const std::string& a : cmds[i]) joined += (joined.empty() ? "" : std::string(1, '\0')) + a;
    std::ofstream(dir(out, "cli") + "/" + std::to_string(i), std::ios::binary) << joined;
  }
  std::cout << "seeds written to " << out.string() << "\n";
  return 0;
}
