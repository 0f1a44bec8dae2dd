// llama.cpp's logits for given token ids, and its greedy continuation, through libllama's C API:
// what tools/moe_llamacpp_check.sh compares with transformers' goldens for models whose GGUF
// carries no usable tokenizer (the random DeepSeek models), so no text prompt can be given.
//
//   llamacpp_logits MODEL.gguf IDS N      IDS comma-separated; N greedy tokens after them
//
// Prints one JSON object: "logits" [T][V] at every position of IDS (one batch), "greedy" [N]
// (each chosen token fed back through the KV cache, one per step). Built by the check script
// against the pinned llama.cpp (tools/llamacpp_common.sh).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf IDS N\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  std::stringstream ss(argv[2]);
  for (std::string t; std::getline(ss, t, ',');) ids.push_back(std::stoi(t));
  const int n_greedy = std::atoi(argv[3]);
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "%s: llama.cpp could not load it\n", argv[1]);
    return 1;
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(ids.size() + n_greedy + 8);
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = GGML_TYPE_F32;                // the cache in f32 (its default is f16)
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // its CPU kernel rounds K and V to f16
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_batch b = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  auto feed = [&](const std::vector<llama_token>& toks, int pos0, bool all) {
    b.n_tokens = static_cast<int32_t>(toks.size());
    for (std::size_t i = 0; i < toks.size(); ++i) {
      b.token[i] = toks[i], b.pos[i] = pos0 + static_cast<int>(i), b.n_seq_id[i] = 1, b.seq_id[i][0] = 0;
      b.logits[i] = all || i + 1 == toks.size();
    }
    if (llama_decode(ctx, b) != 0) {
      std::fprintf(stderr, "llama_decode failed\n");
      std::exit(1);
    }
  };
  auto argmax = [&](const float* l) {
    int best = 0;
    for (int v = 1; v < V; ++v)
      if (l[v] > l[best]) best = v;
    return best;
  };
  feed(ids, 0, true);
  std::printf("{\"logits\": [");
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const float* l = llama_get_logits_ith(ctx, static_cast<int32_t>(t));
    std::printf("%s[", t ? ", " : "");
    for (int v = 0; v < V; ++v) std::printf("%s%.9g", v ? ", " : "", l[v]);
    std::printf("]");
  }
  std::printf("], \"greedy\": [");
  int next = argmax(llama_get_logits_ith(ctx, static_cast<int32_t>(ids.size() - 1)));
  for (int i = 0; i < n_greedy; ++i) {
    std::printf("%s%d", i ? ", " : "", next);
    if (i + 1 == n_greedy) break;
    feed({next}, static_cast<int>(ids.size()) + i, false);
    next = argmax(llama_get_logits_ith(ctx, 0));
  }
  std::printf("]}\n");
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
