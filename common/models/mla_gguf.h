#pragma once
/// @file mla_gguf.h
/// @brief DeepSeek-V2/V3 from llama.cpp's GGUF files (architecture `deepseek2`): the same MlaModel
/// load_mla builds from a Hugging Face folder, its config read from the file's metadata and its
/// tensors under llama.cpp's names.
///
/// What llama.cpp's converter (conversion/deepseek.py, DeepseekV2Model) writes, and how it is read:
///
/// | config.json | deepseek2.* metadata |
/// |---|---|
/// | hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, max_position_embeddings | embedding_length, feed_forward_length, block_count, attention.head_count, context_length |
/// | kv_lora_rank, q_lora_rank (absent: null) | attention.kv_lora_rank, attention.q_lora_rank |
/// | qk_nope_head_dim + qk_rope_head_dim, v_head_dim | attention.key_length_mla, attention.value_length_mla (older files: key_length, value_length) |
/// | qk_rope_head_dim, rope_theta, rms_norm_eps | rope.dimension_count, rope.freq_base, attention.layer_norm_rms_epsilon |
/// | n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts | expert_count, expert_used_count, expert_feed_forward_length, expert_shared_count |
/// | first_k_dense_replace, routed_scaling_factor, norm_topk_prob | leading_dense_block_count, expert_weights_scale (absent: 1), expert_weights_norm (absent: false) |
/// | scoring_func, n_group, topk_group | expert_gating_func (1 softmax, 2 sigmoid; absent: softmax), expert_group_count, expert_group_used_count |
/// | rope_scaling yarn: factor, original_max_position_embeddings, beta_fast, beta_slow, mscale_all_dim | rope.scaling.type, .factor, .original_context_length, .yarn_beta_fast, .yarn_beta_slow, .yarn_log_multiplier (0.1 · mscale_all_dim) |
///
/// The file names no class and no topk_method, so they follow from the gating: sigmoid scores are
/// DeepSeek-V3's (groups ranked by their top-2 sum, `noaux_tc`), softmax ones V2's (groups ranked
/// by their best score, `group_limited_greedy`, when there is more than one group; else `greedy`).
/// V3's `e_score_correction_bias` is the tensor `blk.N.exp_probs_b.bias`, used when present.
/// Where transformers' DeepseekV2 and DeepSeek's own code disagree (norm_topk_prob, YaRN's softmax
/// mscale, both refused from a V2 config.json), a GGUF means what llama.cpp and DeepSeek's code
/// compute: the weights renormalised when expert_weights_norm says so, the softmax scaled by
/// yarn_mscale(factor, mscale_all_dim)² and cos/sin left unscaled (llama.cpp takes mscale equal to
/// mscale_all_dim, as DeepSeek's configs have it).
///
/// Tensors, Hugging Face name (under model.layers.i.) → GGUF name (under blk.i.):
///
/// | Hugging Face | GGUF |
/// |---|---|
/// | input_layernorm, post_attention_layernorm | attn_norm, ffn_norm |
/// | self_attn.q_proj, or q_a_proj, q_a_layernorm, q_b_proj | attn_q, or attn_q_a, attn_q_a_norm, attn_q_b |
/// | self_attn.kv_a_proj_with_mqa, kv_a_layernorm, o_proj | attn_kv_a_mqa, attn_kv_a_norm, attn_output |
/// | self_attn.kv_b_proj [N·(dn + dv), r] | attn_k_b [N, r, dn] (each head's W_UK transposed, for the absorbed product) and attn_v_b [N, dv, r]; older files: attn_kv_b as is |
/// | mlp.{gate,up,down}_proj (dense layers) | ffn_gate, ffn_up, ffn_down |
/// | mlp.gate, mlp.gate.e_score_correction_bias | ffn_gate_inp, exp_probs_b.bias |
/// | mlp.experts.j.{gate,up,down}_proj | row block j of ffn_gate_exps [E, Fe, D], ffn_up_exps, ffn_down_exps [E, D, Fe] |
/// | mlp.shared_experts.{gate,up,down}_proj | ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp |
///
/// and model.embed_tokens, model.norm, lm_head → token_embd, output_norm, output (absent: tied).
/// Rows are as trained: llama.cpp's deepseek2 rotates adjacent pairs (2j, 2j + 1), as DeepSeek's
/// checkpoints are laid out (rope_interleave), so the model runs with RopePairing::Adjacent.
/// Matrices of any type gguf.h decodes (F32, F16, BF16, Q8_0, the k-quants, ...) are read as their
/// f32 values: chapter 04 is about the attention, not the weights' format.

#include <string>

#include "common/gguf.h"
#include "common/models/mla.h"

namespace inferlab::models::mla {

/// What a deepseek2 file's metadata says: the configs load_mla would parse from the config.json
/// it was converted from (the table above), and which form kv_b_proj is stored in.
struct MlaGgufConfig {
  TransformerConfig config;  ///< architecture DeepseekV3ForCausalLM for a sigmoid router, else DeepseekV2ForCausalLM
  MlaConfig mla;
  bool kv_b_split = true;  ///< attn_k_b and attn_v_b (key_length_mla present); false: the older attn_kv_b
};

/// Reads the deepseek2.* metadata: every key checked for its kind and range and named when wrong;
/// the fields then go through the config.json parsers (parse_transformer_config, parse_mla_config,
/// parse_moe_config), whose messages name them as a config.json would, after the file's path.
MlaGgufConfig deepseek2_config(const gguf::File& f);

/// The Hugging Face name chapter 04 asks for, as llama.cpp names it in a deepseek2 file ("" for
/// a name it has no counterpart for); `expert` is set to j for the experts' row blocks. kv_b_proj
/// maps to attn_kv_b, the older single tensor (the split form is read from attn_k_b and attn_v_b).
std::string deepseek2_tensor_name(const std::string& hf_name, std::int64_t* expert = nullptr);

/// Loads a deepseek2 GGUF into the model load_mla builds from the folder it was converted from.
/// Refuses another architecture naming the chapter that runs it, a key or tensor the model needs
/// that is missing or malformed, and a tensor the metadata does not account for.
MlaModel load_mla_gguf(const std::string& path);

}  // namespace inferlab::models::mla
