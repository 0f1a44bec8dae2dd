#pragma once
/// @file hf_config.h
/// @brief A Hugging Face `config.json`, and the hyper-parameters of a Llama-family decoder.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/moe_config.h"

namespace inferlab {

/// The largest vocabulary (and so token id table) any reader accepts: config.json's
/// vocab_size, a tokenizer's ids. About 60 times the largest real vocabularies.
inline constexpr std::int64_t kMaxVocabSize = 1 << 24;

/// The config.json of a model folder (or a path to the file itself), kept whole: chapters read
/// their own fields (MLA's kv_lora_rank, Mamba's state size) through JsonFields.
struct HfConfig {
  std::string path;  ///< the config.json file
  nlohmann::json json;
  /// First entry of "architectures", or "" if absent.
  std::string architecture() const;
  /// "model_type", or "" if absent.
  std::string model_type() const;
};

/// Loads `<folder>/config.json` (or the file at `path`); throws on a missing file or bad JSON.
HfConfig load_hf_config(const std::string& path);

/// The shape of a Llama-family decoder, in the lecture's letters where it has them.
struct TransformerConfig {
  std::string architecture;                  ///< e.g. "LlamaForCausalLM"
  std::int64_t hidden_size = 0;              ///< D
  std::int64_t intermediate_size = 0;        ///< F
  std::int64_t num_layers = 0;               ///< L
  std::int64_t num_heads = 0;                ///< N (query heads)
  std::int64_t num_kv_heads = 0;             ///< K (key/value heads; = N for MHA)
  std::int64_t head_dim = 0;                 ///< H (hidden_size / num_heads unless given)
  std::int64_t vocab_size = 0;               ///< V
  std::int64_t max_position_embeddings = 0;  ///< the context length the model was trained for
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  nlohmann::json rope_scaling;       ///< null, or the config's rope_scaling object
  bool tie_word_embeddings = false;  ///< lm_head shares the token embedding
  bool attention_bias = false;       ///< q/k/v projections have biases (Qwen2; Llama's attention_bias)
  bool attention_out_bias = false;   ///< so has the output projection (Llama's attention_bias, not Qwen2)
  bool mlp_bias = false;             ///< gate, up and down projections have biases (Llama's mlp_bias)
  // Qwen3 and Gemma 2 / 3; each default is the plain Llama's.
  bool qk_norm = false;                ///< RMSNorm of every query and key head over head_dim, before RoPE (Qwen3, Gemma 3)
  bool post_norms = false;             ///< RMSNorm of each block's output before the residual add too (Gemma 2 / 3)
  std::string hidden_act = "silu";     ///< the gated MLP's activation: "silu" or "gelu_pytorch_tanh" (Gemma)
  double embed_scale = 1.0;            ///< multiplies the embeddings (Gemma: √D in the weights' dtype)
  double query_pre_attn_scalar = 0;    ///< attention scale 1/√this (Gemma); 0: 1/√head_dim
  double attn_logit_softcapping = 0;   ///< c of c·tanh(s/c) on attention scores (Gemma 2); 0: none
  double final_logit_softcapping = 0;  ///< the same on the logits (Gemma 2); 0: none
  double rope_local_base_freq = 0;     ///< RoPE base of sliding-window layers, unscaled (Gemma 3); 0: rope_theta
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;
  std::string torch_dtype;  ///< the dtype the weights were saved in, e.g. "bfloat16"
  /// The mixture-of-experts FFN of the layers MoeConfig::is_moe_layer names (Mixtral, Qwen2-MoE,
  /// DeepSeek-V2/V3); absent when every layer's MLP is dense.
  std::optional<MoeConfig> moe;

  /// Checks that the fields agree and are in range (every count positive and below a limit that
  /// keeps sizes far from overflowing, KV heads dividing query heads, an even head_dim, positive
  /// eps and RoPE base); throws naming `where` (the file the config came from) and the field.
  void validate(const std::string& where) const;
  /// Parameters: embeddings, attention, MLP (every expert of an MoE layer), norms and (when
  /// untied) the output head.
  std::int64_t num_parameters() const;
  /// Bytes of the keys and values of `positions` tokens, every layer: the lecture's
  /// S × K × H × L × 2 × bytes per element. The project's one KV-size formula: caches,
  /// calculators and benchmarks all call it. Throws if the product overflows.
  std::int64_t kv_cache_bytes(std::int64_t positions, std::int64_t bytes_per_element) const;
};

/// The fields of a rope_scaling of type "yarn", with transformers' defaults filled in
/// (see yarn_inv_freq in common/ops.h for what they do).
struct YarnScaling {
  double factor = 1;            ///< s: the context extension ('factor')
  double original_context = 0;  ///< L: 'original_max_position_embeddings', else max_position_embeddings
  double beta_fast = 32;        ///< turns over L above which a pair keeps its frequency ('beta_fast', 32 when absent or 0)
  double beta_slow = 1;         ///< turns over L below which a pair is interpolated ('beta_slow', 1 when absent or 0)
  bool truncate = true;         ///< round the ramp's ends to whole pair indices ('truncate')
  double mscale = 0;            ///< 'mscale', 0 when absent
  double mscale_all_dim = 0;    ///< 'mscale_all_dim', 0 when absent (DeepSeek's softmax correction)
  double attention_factor = 0;  ///< 'attention_factor' when given, 0 when it is derived
};

/// The YaRN fields of c.rope_scaling, which must have type "yarn" ('rope_type' or 'type');
/// throws naming `where`, 'rope_scaling' and the malformed field.
YarnScaling parse_yarn_scaling(const TransformerConfig& c, const std::string& where);

/// The config's eos_token_id: none, one, or a list of them (Llama 3's); throws naming the field
/// when it holds anything but integers.
std::vector<std::int64_t> eos_token_ids(const HfConfig& cfg);

/// Where a config.json architecture runs: " (it runs in chapter 04, ch04_mla)" for a DeepSeek,
/// and so on for every architecture a chapter runs, "" for one none does. Refusals end with it,
/// so that a model given to the wrong chapter names the right one.
std::string where_it_runs(const std::string& architecture);

/// The same for a GGUF file's `general.architecture` (llama.cpp's names): " (it runs in chapter
/// 04, ch04_mla generate --model FILE.gguf)" for deepseek2, chapter 06's generate for gemma2 and
/// gemma3, chapter 09's run for llama, qwen2, qwen2moe and qwen3; "" for one no chapter reads.
std::string where_gguf_runs(const std::string& gguf_architecture);

/// Whether an architecture is Gemma 2 or Gemma 3's text model (Gemma2ForCausalLM,
/// Gemma3ForCausalLM), whose layers chapter 06 runs.
bool gemma_family(const std::string& arch);

/// Reads a Llama-family config (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
/// Qwen3ForCausalLM, and Gemma2ForCausalLM / Gemma3ForCausalLM with their extra fields),
/// checking that the fields agree (heads divide hidden size, KV heads divide heads, ...).
TransformerConfig parse_transformer_config(const HfConfig& cfg);

}  // namespace inferlab
