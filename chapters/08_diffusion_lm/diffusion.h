#pragma once
/// @file diffusion.h
/// @brief Chapter 08: a diffusion language model, which writes a whole block of tokens per step.
///
/// An autoregressive model makes one token per forward pass, and at batch 1 each pass reads all
/// the weights for that one token: arithmetic intensity about 1 FLOP per byte, far below any
/// machine's ridge (chapter 00). A masked diffusion model (MDLM, LLaDA) starts from a canvas of
/// L masks after the prompt and, over R steps, runs a bidirectional denoiser over the whole
/// canvas and commits some of the masked positions: L / R tokens per forward pass, each pass a
/// prefill-shaped GEMM over T = prompt + L rows. Fewer passes, and each uses the hardware better.
/// The price: there is no KV cache (a committed token changes every position's keys, since
/// attention is bidirectional), so each step recomputes the whole canvas, and committing several
/// tokens at once from independent per-position distributions costs quality as R falls.
///
/// The denoiser is chapter 01's model with a bidirectional mask: tiny-mdlm has tiny-mha's
/// blocks, sizes and tensor names. It runs as chapter 02's batch step through `NoCache`, a
/// cache that keeps nothing and attends every query to every key of the canvas: the core's
/// forward pass, unchanged, with the mask and the loop replaced.
///
/// Sampling as LLaDA does it (Nie et al. 2025, Algorithm "low-confidence remasking"): the
/// generation is cut into blocks of `block_length` filled left to right (semi-autoregressive);
/// each block gets steps / blocks steps, and step i of a block commits k_i of its masked
/// positions, k_i = ⌊m / s⌋ plus one for the first m mod s steps, so that the counts sum to the
/// block's m masks. A step predicts x₀ at every masked position (Gumbel-max at temperature τ,
/// the argmax at τ = 0; never the mask token itself) and commits the k_i with the highest
/// confidence: the predicted token's probability (low-confidence remasking), or a uniform draw
/// (random remasking). Committed tokens and the prompt never change.
///
/// The MDLM reverse step is the other sampler: from noise level t to s < t (t = 1 − i/R), each
/// masked position is unmasked with probability (t − s)/t and takes its sampled x₀; at s = 0
/// everything left is unmasked.

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/models/kv_cache.h"

namespace inferlab::ch08 {

/// The denoiser's cache: it keeps nothing (length 0 after every call, bytes 0) and attends each
/// query to every key of the call's own rows, without a causal mask.
class NoCache : public models::KVCache {
 public:
  std::int64_t length() const override { return 0; }
  void commit(std::int64_t) override {}
  void truncate(std::int64_t n) override;
  std::int64_t bytes() const override { return 0; }
  void release() override {}
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
};

struct DiffusionModel {
  models::Llama base;        ///< chapter 01's model; only its mask differs
  std::int32_t mask_id = 1;  ///< mask_token_id: the absorbing state
};

/// Loads tiny-mdlm's folder (architecture InferLabMDLMForMaskedDiffusion, `causal: false`, a
/// `mask_token_id`); refuses a causal model or one without a mask token by name.
DiffusionModel load_diffusion(const std::string& path);

/// Logits [T, V] at every position of each canvas, all canvases in one batch step (one weight
/// read for all of them), each bidirectional over its own rows: sequence after sequence.
Tensor denoise(const DiffusionModel& m, const std::vector<std::vector<std::int32_t>>& canvases);

/// What a sampler calls each step: the logits [T, V] of a canvas (the model, or a test's oracle).
using Denoiser = std::function<Tensor(const std::vector<std::int32_t>& canvas)>;

enum class Remasking { LowConfidence, Random };

struct SamplerOptions {
  std::int64_t gen_length = 32;    ///< L: masks after the prompt
  std::int64_t steps = 32;         ///< R: denoiser calls in all
  std::int64_t block_length = 32;  ///< blocks filled left to right; L must be a multiple, R of L / block_length
  double temperature = 0;          ///< τ of the Gumbel-max draw; 0: argmax
  Remasking remasking = Remasking::LowConfidence;
  std::uint64_t seed = 0;
  metrics::Clock clock = metrics::Clock::Wall;  ///< how DiffusionRun::seconds counts (Work: set against a ceiling)
  /// Throws naming the option that is out of range or does not divide.
  void check() const;
};

/// LLaDA's per-step commit counts for `masked` masks over `steps` steps: ⌊masked / steps⌋ each,
/// one more for the first masked mod steps; they sum to `masked`.
std::vector<std::int64_t> commit_counts(std::int64_t masked, std::int64_t steps);

/// One row's x₀ draw: the argmax of logits/τ + Gumbel noise (the argmax of the logits at τ = 0),
/// never `exclude` (the mask token); and the drawn token's softmax probability without it.
struct Draw {
  std::int32_t token = 0;
  double probability = 0;
};
Draw gumbel_draw(const float* logits, std::int64_t vocab, double temperature, std::int32_t exclude, std::mt19937_64& rng);

/// The canvas after each step, for the picture and the JSON frames.
struct Frame {
  std::int64_t step = 0;
  std::vector<std::int32_t> canvas;
  std::vector<std::int64_t> committed;  ///< positions this step committed
};

struct DiffusionRun {
  std::vector<std::int32_t> tokens;       ///< prompt + the generated tokens
  std::vector<std::int64_t> commit_step;  ///< per generated position, the step that committed it
  std::vector<Frame> frames;
  std::int64_t forwards = 0;
  double seconds = 0;
  metrics::Work work;  ///< what the denoiser's ops counted
};

/// LLaDA's sampler (blocks, commit counts, remasking as `o` says). `on_frame` sees each step.
DiffusionRun sample_llada(const Denoiser& denoise, const std::vector<std::int32_t>& prompt, std::int32_t mask_id,
                          const SamplerOptions& o, const std::function<void(const Frame&)>& on_frame = nullptr);

/// The MDLM reverse process over `o.steps` steps (o.block_length and o.remasking unused).
DiffusionRun sample_mdlm(const Denoiser& denoise, const std::vector<std::int32_t>& prompt, std::int32_t mask_id,
                         const SamplerOptions& o, const std::function<void(const Frame&)>& on_frame = nullptr);

/// The model as a Denoiser (one canvas per call).
Denoiser denoiser(const DiffusionModel& m);

/// The discrete-time negative ELBO of `tokens` with R noise levels t_i = i / R (the Riemann sum
/// of MDLM's ∫ (1/t) E[Σ_masked −log p(x₀)] dt, per token), each level masking every position
/// but the first (BOS) with probability t_i, drawn from `seed`; in nats per token. As R grows it
/// approaches the continuous bound the model was trained on.
double negative_elbo(const DiffusionModel& m, const std::vector<std::int32_t>& tokens, std::int64_t R, std::uint64_t seed);

}  // namespace inferlab::ch08
