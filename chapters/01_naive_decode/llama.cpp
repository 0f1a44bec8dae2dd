#include "chapters/01_naive_decode/llama.h"

namespace inferlab::ch01 {

using namespace models;

// ---------------------------------------------------------------------------------------------
// The forward pass: embed, then per layer attention and MLP with residuals, then the head.
Tensor forward(const Llama& m, const std::vector<std::int32_t>& tokens, bool all_positions) {
  const Tensor pos = positions(m, 0, static_cast<std::int64_t>(tokens.size()));  // token t sits at position t
  Tensor x = embed(m, tokens);                                                   // [T, D], the residual stream
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const LlamaLayer& l = m.layers[i];
    ops::add(x, post_norm(m, attention_block(m, l, norm(m, x, l.attn_norm), pos), l.post_attn_norm), x);
    ops::add(x, post_norm(m, mlp_block(l, norm(m, x, l.mlp_norm)), l.post_mlp_norm), x);
  }
  return head(m, all_positions ? x : x.slice(0, x.size(0) - 1, x.size(0)));  // logits [T, V] or [1, V]
}

// Attention: q, k, v projections, RoPE on q and k, causal attention, output projection.
Tensor attention_block(const Llama& m, const LlamaLayer& l, const Tensor& h, const Tensor& pos) {
  const auto& c = m.config;
  const std::int64_t T = h.size(0), N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  const std::vector<Tensor> qkv = linears(h, {&l.wq, &l.wk, &l.wv});  // one pass over h for the three
  Tensor q = qkv[0].view({T, N, H}), k = qkv[1].view({T, K, H}), v = qkv[2].view({T, K, H});
  // Qwen3's and Gemma 3's per-head norms, before RoPE (nothing for the others):
  head_norm(m, q, l.q_norm);
  ops::rope(q, pos, rope_freqs(m, l), m.rope_pairing);
  head_norm(m, k, l.k_norm);
  ops::rope(k, pos, rope_freqs(m, l), m.rope_pairing);
  Tensor a = ops::attention(q, k, v);  // every position sees itself and the ones before it
  return linear(a.view({T, N * H}), l.wo);
}

}  // namespace inferlab::ch01
