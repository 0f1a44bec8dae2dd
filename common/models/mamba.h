#pragma once
/// @file mamba.h
/// @brief Chapter 07: Mamba, a model whose "cache" is a fixed-size state.
///
/// Chapters 02 to 06 made the KV cache smaller; it still grows with every token. A state-space
/// layer replaces attention with a recurrence whose state has the same size at position 10 and
/// at position 10⁶: per layer the last K − 1 inputs of a short convolution and an E × N matrix.
/// Decoding a token reads the weights and that state, whatever the position.
///
/// The model is transformers' MambaForCausalLM: chapter 01's skeleton (embed → blocks → final
/// norm → head, the same `models::embed`, `models::norm` and `models::head`), each block RMSNorm, the
/// mixer, a residual; no MLP. The mixer, per token:
///
///     x, z = in_proj(h)                    two branches of E = expand·D channels
///     u    = silu(conv1d(x))               causal depthwise, K taps, over the last K inputs
///     Δ, B, C = split(x_proj(u))           the selection: step size and SSM matrices from the token
///     Δ    = softplus(dt_proj(Δ))          rank R → E channels
///     y    = scan(u, Δ, A = −exp(A_log), B, C) + D·u     (ssm.h)
///     out  = out_proj(y · silu(z))
///
/// tiny-lti is the same model with Δ, B and C learned constants per channel (S4D-style, linear
/// time-invariant): the selection removed, so that the lecture's reason for it can be measured.

#include <string>
#include <vector>

#include "common/models/generate.h"
#include "common/models/kv_cache.h"
#include "common/models/llama.h"
#include "common/models/ssm.h"

namespace inferlab::models::mamba {

/// MambaConfig as transformers reads it (every field defaulted as there).
struct MambaConfig {
  std::string architecture;      ///< MambaForCausalLM, or InferLabLTIMambaForCausalLM (tiny-lti)
  std::int64_t hidden_size = 0;  ///< D
  std::int64_t inner_size = 0;   ///< E: intermediate_size, or int(expand · D) without one
  std::int64_t state_size = 0;   ///< N
  std::int64_t conv_kernel = 0;  ///< K
  std::int64_t dt_rank = 0;      ///< R (time_step_rank; "auto" is ceil(D / 16))
  std::int64_t num_layers = 0;   ///< L
  std::int64_t vocab_size = 0;   ///< V
  double eps = 1e-5;             ///< layer_norm_epsilon (the RMSNorms')
  bool lti = false;              ///< Δ, B, C per channel (tiny-lti) instead of per token
  bool use_bias = false;         ///< in_proj and out_proj have biases
  bool conv_bias = true;         ///< use_conv_bias
  bool tie_word_embeddings = true;
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;

  /// Bytes of one sequence's state: L × E × ((K − 1) conv inputs + N SSM values) × bytes per value.
  /// No T in it: the lecture's O(1) "cache".
  std::int64_t state_bytes(std::int64_t bytes_per_value = 4) const;
  std::int64_t num_parameters() const;
  /// Throws naming `where` and the field out of range.
  void validate(const std::string& where) const;
};

/// Reads a MambaForCausalLM config.json (or tiny-lti's); refuses other architectures by name
/// (Mamba-2 and Jamba included, whose blocks differ).
MambaConfig parse_mamba_config(const HfConfig& hf);

struct MambaLayer {
  Tensor norm;      ///< [D] the block's RMSNorm
  Linear in_proj;   ///< [2E, D]: rows 0..E−1 the input branch x, rows E..2E−1 the gate z
  Tensor conv_w;    ///< [E, K] (conv1d.weight [E, 1, K])
  Tensor conv_b;    ///< [E], or undefined without use_conv_bias
  Linear x_dt;      ///< x_proj's first R rows [R, E]: Δ at rank R; selective only
  Linear x_bc;      ///< x_proj's last 2N rows [2N, E]: B, then C; selective only
  Linear dt_proj;   ///< [E, R] with bias; selective only
  Tensor dt, B, C;  ///< LTI only: Δ before softplus [E], B and C [E, N]
  Tensor A;         ///< [E, N] = −exp(A_log), computed once at load
  Tensor D;         ///< [E]
  Linear out_proj;  ///< [D, E]
};

struct MambaModel {
  MambaConfig config;
  /// Chapter 01's model with no layers: its embed, final_norm and lm_head, and a config holding
  /// D, V, eps and the token ids, so that models::embed and models::head run unchanged.
  models::Llama skeleton;
  std::vector<MambaLayer> layers;

  Device device() const { return skeleton.device(); }
  /// Bytes one decode step reads of the weights: every layer's tensors and the head (the
  /// embedding table when tied, else one row of it).
  std::int64_t step_weight_bytes() const;
  MambaModel to(Device device) const;
};

/// Loads a Hugging Face MambaForCausalLM folder (config.json and safetensors, such as
/// state-spaces/mamba-130m-hf or tiny-mamba) or tiny-lti's; every tensor's shape checked, and a
/// checkpoint holding tensors the config does not account for refused. Weights are kept in f32.
MambaModel load_mamba(const std::string& path);

/// Random weights for a config, initialised as Mamba initialises (A = −(1..N), Δ log-uniform in
/// [0.001, 0.1], D = 1; matrices U(±1/√fan_in)): the benchmarks' and the two-path tests' models.
MambaModel random_mamba(const MambaConfig& config, std::uint64_t seed);

/// One sequence's state: for every layer the last K − 1 inputs of the convolution [K − 1, E] and
/// the SSM state [E, N], zeros before the first token. It implements chapter 02's Cache, so the
/// generate loop and the batch step treat it as any cache; its bytes() never changes.
class MambaState : public models::Cache {
 public:
  explicit MambaState(const MambaConfig& c, Device device = Device::CPU);
  std::int64_t length() const override { return length_; }
  void commit(std::int64_t T) override;
  /// A recurrence keeps no history to roll back to: n = length() is a no-op and n = 0 starts
  /// over (zeros); anything else is refused by name (speculative decoding with a state-space
  /// model keeps a copy of the state from before its draft instead).
  void truncate(std::int64_t n) override;
  std::int64_t bytes() const override;
  void release() override;
  /// A copy of the state (a parallel sample forks from the state after its prompt).
  std::unique_ptr<models::Cache> clone() const override;
  /// "6 layers × (conv [3, 256] + ssm [256, 16]) f32 = 116,736 bytes"
  std::string layout() const;
  Tensor& conv(std::int64_t layer);
  Tensor& ssm(std::int64_t layer);
  Device device() const { return device_; }

 private:
  void check_layer(std::int64_t layer) const;
  MambaConfig config_;
  Device device_;
  std::int64_t length_ = 0;
  bool released_ = false;
  std::vector<Tensor> conv_, ssm_;
};

/// How the mixer runs its scan: the reference loop, the fast path (threads; the chunked kernel or
/// the step kernel on CUDA), the chunked associative scan (CPU), or, for an LTI model from an
/// empty state, one convolution.
enum class ScanPath { Reference, Fast, Parallel, Convolution };

/// One sequence's part of a batched forward pass: chapter 02's, with the sequence's MambaState
/// as its cache.
using models::SequenceStep;

/// The mixer of layer `layer` over the rows of all sequences (h [rows, D], already normed): the
/// projections once for all rows, the convolution and the scan per sequence against its state
/// (the batch's cache b).
Tensor mixer_block(const MambaModel& m, std::int64_t layer, const Tensor& h, const models::Batch& batch, ScanPath path);

/// Chapter 02's batch step with the mixer in place of attention and MLP: the same Batch (rows,
/// positions, the rows whose logits are wanted), the states as the caches. Every sequence's new
/// tokens continue the sequence its state holds, and the states advance. Returns the logits of
/// each sequence's last new token (all of them where all_logits is set), sequence after sequence.
Tensor forward(const MambaModel& m, std::vector<SequenceStep>& seqs, ScanPath path = ScanPath::Fast);

/// One sequence: prefill with the prompt, then a call per decoded token (the step: O(1) in the position).
Tensor forward_cached(const MambaModel& m, MambaState& state, const std::vector<std::int32_t>& tokens,
                      bool all_positions = false, ScanPath path = ScanPath::Fast);

/// The forward pass of a whole sequence from an empty state: chapter 01's interface (logits of
/// every position, or of the last).
Tensor forward_sequence(const MambaModel& m, const std::vector<std::int32_t>& tokens, bool all_positions = false,
                        ScanPath path = ScanPath::Fast);

/// Chapter 01's generate loop over the state: prefill, then one token per step.
models::Generation generate(const MambaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                            const std::vector<std::int64_t>& eos_ids, const models::OnToken& on_token = nullptr);

}  // namespace inferlab::models::mamba
