#include "chapters/08_diffusion_lm/diffusion.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "chapters/08_diffusion_lm/cuda_diffusion.h"
#include "common/error.h"
#include "common/json_file.h"
#include "common/lab.h"
#include "common/ops.h"

namespace inferlab::ch08 {

// --- the denoiser ----------------------------------------------------------------------------
void NoCache::truncate(std::int64_t n) { IL_CHECK(n == 0, "denoiser cache: keeps no positions, so it cannot keep ", n); }

void NoCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(k.defined() && v.defined(), "denoiser cache: layer ", layer, " brings no keys and values");
  AttentionParams p;
  p.causal = false;  // every position of the canvas sees every other: the only change to the model
  ops::attention(q, k, v, out, p);
}

DiffusionModel load_diffusion(const std::string& path) {
  const HfConfig hf = load_hf_config(path);
  const JsonFields f(hf.json, hf.path);
  IL_CHECK(f.has("causal") && !f.get<bool>("causal"), hf.path, ": not a bidirectional denoiser (field 'causal' ",
           f.has("causal") ? "is true" : "is missing",
           "); chapter 08 runs masked-diffusion models such as tiny-mdlm, "
           "chapters 01-06 causal ones");
  IL_CHECK(f.has("mask_token_id"), hf.path,
           ": field 'mask_token_id' is missing: a masked-diffusion model needs the "
           "token its canvas starts as");
  // Chapter 05's cross-layer KV sharing is not what this denoiser runs: refused, not ignored.
  IL_CHECK(f.get_or<std::int64_t>("kv_share_factor", 1) == 1 && !f.has("kv_producer_layers"), hf.path,
           ": field 'kv_share_factor' (or 'kv_producer_layers') shares K/V across layers, which chapter 08's denoiser "
           "does not implement (chapter 05 does, for causal models)");
  const TransformerConfig c = parse_transformer_config(hf);
  DiffusionModel m;
  m.base = models::load_hf_decoder(hf, c, path);
  const std::int64_t mask = f.get<std::int64_t>("mask_token_id");
  IL_CHECK(mask >= 0 && mask < c.vocab_size, hf.path, ": mask_token_id ", mask, " is outside the vocabulary of ",
           c.vocab_size);
  m.mask_id = static_cast<std::int32_t>(mask);
  return m;
}

Tensor denoise(const DiffusionModel& m, const std::vector<std::vector<std::int32_t>>& canvases) {
  std::vector<NoCache> caches(canvases.size());
  std::vector<models::SequenceStep> seqs;
  for (std::size_t b = 0; b < canvases.size(); ++b) seqs.push_back({canvases[b], &caches[b], true});
  return models::forward(m.base, seqs);  // chapter 02's batch step; NoCache makes it bidirectional
}

Denoiser denoiser(const DiffusionModel& m) {
  return [&m](const std::vector<std::int32_t>& canvas) { return denoise(m, {canvas}); };
}

// --- the schedule ----------------------------------------------------------------------------
void SamplerOptions::check() const {
  IL_CHECK(gen_length >= 1, "diffusion sampler: gen_length must be at least 1; got ", gen_length);
  IL_CHECK(block_length >= 1 && gen_length % block_length == 0, "diffusion sampler: the generation length ", gen_length,
           " must be a multiple of the block length ", block_length);
  const std::int64_t blocks = gen_length / block_length;
  IL_CHECK(steps >= blocks && steps % blocks == 0, "diffusion sampler: the steps (", steps, ") must be a multiple of the ",
           blocks, " blocks (", gen_length, " / ", block_length, "), each block getting the same number");
  IL_CHECK(steps / blocks <= block_length, "diffusion sampler: ", steps / blocks, " steps per block of ", block_length,
           " tokens would leave steps with nothing to commit; use at most ", blocks * block_length, " steps");
  IL_CHECK(temperature >= 0 && std::isfinite(temperature), "diffusion sampler: temperature must be >= 0; got ", temperature);
}

std::vector<std::int64_t> commit_counts(std::int64_t masked, std::int64_t steps) {
  IL_CHECK(masked >= 0 && steps >= 1, "commit_counts: ", masked, " masks over ", steps, " steps");
  std::vector<std::int64_t> k(static_cast<std::size_t>(steps));
  // EXERCISE 08.1 BEGIN: the commit schedule
  for (std::int64_t i = 0; i < steps; ++i) k[static_cast<std::size_t>(i)] = masked / steps + (i < masked % steps ? 1 : 0);
  // EXERCISE 08.1 STUB
  // lab::not_done("08.1", "fill k with how many masks each of the `steps` steps commits: masked / steps each, and "
  //                       "one more for each of the first masked % steps steps, so that they sum to `masked`");
  // EXERCISE 08.1 END
  return k;
}

Draw gumbel_draw(const float* logits, std::int64_t V, double temperature, std::int32_t exclude, std::mt19937_64& rng) {
  Draw d;
  double best = -INFINITY, mx = -INFINITY;
  for (std::int64_t v = 0; v < V; ++v)
    if (v != exclude) mx = std::max(mx, static_cast<double>(logits[v]));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (std::int64_t v = 0; v < V; ++v) {
    if (v == exclude) continue;
    double score = logits[v];
    if (temperature > 0) {  // Gumbel-max: argmax(l/τ + g), g = −log(−log U), is a draw from softmax(l/τ)
      const double u = std::max(uniform(rng), 1e-300);
      // EXERCISE 08.2 BEGIN: the Gumbel-max draw
      score = logits[v] / temperature - std::log(-std::log(u));
      // EXERCISE 08.2 STUB
      // (void)u;
      // lab::not_done("08.2", "set score to the token's tempered logit plus Gumbel noise: logits[v] / temperature "
      //                       "+ g with g = −log(−log u), u uniform in (0, 1), so that the argmax is a draw from "
      //                       "softmax(logits / temperature)");
      // EXERCISE 08.2 END
    }
    if (score > best) best = score, d.token = static_cast<std::int32_t>(v);
  }
  double sum = 0;  // the drawn token's probability under softmax(l) without the excluded token
  for (std::int64_t v = 0; v < V; ++v)
    if (v != exclude) sum += std::exp(static_cast<double>(logits[v]) - mx);
  d.probability = std::exp(static_cast<double>(logits[d.token]) - mx) / sum;
  return d;
}

namespace {

// One denoiser call on the canvas, and x₀ with its probability at every masked position of
// [lo, hi) (a default Draw elsewhere). At τ = 0 on CUDA logits the rows are reduced on the GPU;
// otherwise those rows come to the host and are drawn there.
std::vector<Draw> draw_masked(const Denoiser& denoise, const std::vector<std::int32_t>& canvas, std::size_t lo,
                              std::size_t hi, std::int32_t mask_id, double temperature, std::mt19937_64& rng) {
  const Tensor l = denoise(canvas);
  IL_CHECK(l.ndim() == 2 && l.size(0) == static_cast<std::int64_t>(canvas.size()) && l.size(1) > mask_id,
           "diffusion sampler: the denoiser returned ", l.describe(), " for a canvas of ", canvas.size(), " positions");
  const std::int64_t V = l.size(1);
  std::vector<Draw> out(hi - lo);
  if (l.is_cuda() && temperature == 0) {
    std::vector<std::int32_t> tokens;
    std::vector<double> probs;
    cuda_argmax_probability(l, static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi), mask_id, tokens, probs);
    for (std::size_t i = 0; i < out.size(); ++i) {
      IL_CHECK(std::isfinite(probs[i]), "diffusion sampler: the denoiser's logits at position ", lo + i, " hold NaN");
      out[i] = {tokens[i], probs[i]};
    }
    return out;
  }
  const std::vector<float> rows = l.slice(0, static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi)).to_float_vector();
  for (float x : rows) IL_CHECK(!std::isnan(x), "diffusion sampler: the denoiser's logits hold NaN");
  for (std::size_t i = 0; i < out.size(); ++i)
    if (canvas[lo + i] == mask_id)
      out[i] = gumbel_draw(&rows[i * static_cast<std::size_t>(V)], V, temperature, mask_id, rng);
  return out;
}

DiffusionRun start(const std::vector<std::int32_t>& prompt, std::int32_t mask_id, const SamplerOptions& o) {
  o.check();
  IL_CHECK(!prompt.empty(), "diffusion sampler: an empty prompt (it starts with BOS at least)");
  for (auto t : prompt) IL_CHECK(t != mask_id, "diffusion sampler: the prompt holds the mask token ", mask_id);
  DiffusionRun r;
  r.tokens = prompt;
  r.tokens.resize(prompt.size() + static_cast<std::size_t>(o.gen_length), mask_id);
  r.commit_step.assign(static_cast<std::size_t>(o.gen_length), -1);
  return r;
}

void finish_step(DiffusionRun& r, std::int64_t step, std::size_t P, const std::vector<std::int64_t>& committed,
                 const std::function<void(const Frame&)>& on_frame) {
  for (std::int64_t p : committed) r.commit_step[static_cast<std::size_t>(p) - P] = step;
  Frame f{step, r.tokens, committed};
  if (on_frame) on_frame(f);
  r.frames.push_back(std::move(f));
}

}  // namespace

DiffusionRun sample_llada(const Denoiser& denoise, const std::vector<std::int32_t>& prompt, std::int32_t mask_id,
                          const SamplerOptions& o, const std::function<void(const Frame&)>& on_frame) {
  DiffusionRun r = start(prompt, mask_id, o);
  const std::size_t P = prompt.size();
  const std::int64_t blocks = o.gen_length / o.block_length, per_block = o.steps / blocks;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  metrics::CountScope count;
  metrics::Timer clock(o.clock);
  std::int64_t step = 0;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t lo = P + static_cast<std::size_t>(b * o.block_length),
                      hi = lo + static_cast<std::size_t>(o.block_length);
    const auto k = commit_counts(o.block_length, per_block);  // a block starts all masks
    for (std::int64_t i = 0; i < per_block; ++i, ++step) {
      // x₀ and a confidence at every masked position of the block; later blocks wait their turn.
      const std::vector<Draw> x0 = draw_masked(denoise, r.tokens, lo, hi, mask_id, o.temperature, rng);
      ++r.forwards;
      std::vector<std::pair<double, std::int64_t>> ranked;
      for (std::size_t p = lo; p < hi; ++p) {
        if (r.tokens[p] != mask_id) continue;
        const double confidence = o.remasking == Remasking::LowConfidence ? x0[p - lo].probability : uniform(rng);
        ranked.emplace_back(-confidence, static_cast<std::int64_t>(p));  // sorted: highest first, then lower position
      }
      std::sort(ranked.begin(), ranked.end());
      std::vector<std::int64_t> committed;
      const auto n = std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(k[static_cast<std::size_t>(i)]));
      for (std::size_t j = 0; j < n; ++j) {
        const auto p = static_cast<std::size_t>(ranked[j].second);
        r.tokens[p] = x0[p - lo].token;  // committed: never changes again
        committed.push_back(ranked[j].second);
      }
      std::sort(committed.begin(), committed.end());
      finish_step(r, step, P, committed, on_frame);
    }
  }
  r.seconds = clock.seconds();
  r.work = count.work();
  return r;
}

DiffusionRun sample_mdlm(const Denoiser& denoise, const std::vector<std::int32_t>& prompt, std::int32_t mask_id,
                         const SamplerOptions& o, const std::function<void(const Frame&)>& on_frame) {
  SamplerOptions one = o;
  one.block_length = o.gen_length;  // one block: the reverse process runs over the whole canvas
  DiffusionRun r = start(prompt, mask_id, one);
  const std::size_t P = prompt.size();
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  metrics::CountScope count;
  metrics::Timer clock(o.clock);
  for (std::int64_t i = 0; i < o.steps; ++i) {
    const double t = 1.0 - static_cast<double>(i) / static_cast<double>(o.steps);
    const double s = 1.0 - static_cast<double>(i + 1) / static_cast<double>(o.steps);
    const std::vector<Draw> x0 = draw_masked(denoise, r.tokens, P, r.tokens.size(), mask_id, o.temperature, rng);
    ++r.forwards;
    std::vector<std::int64_t> committed;
    for (std::size_t p = P; p < r.tokens.size(); ++p) {
      if (r.tokens[p] != mask_id) continue;  // carry-over: an unmasked token stays as it is
      // q(x_s = x₀ | x_t = mask) = (t − s) / t under the linear schedule α_t = 1 − t; s = 0 unmasks all.
      double unmask = 0;
      // EXERCISE 08.3 BEGIN: the reverse step's unmasking probability
      unmask = s <= 0 ? 1.0 : (t - s) / t;
      // EXERCISE 08.3 STUB
      // (void)s, (void)t;
      // lab::not_done("08.3", "set unmask to the probability that a masked position at noise level t is unmasked at "
      //                       "level s < t: (t − s) / t for the linear schedule (α = 1 − t), and 1 at s = 0");
      // EXERCISE 08.3 END
      if (uniform(rng) < unmask) r.tokens[p] = x0[p - P].token, committed.push_back(static_cast<std::int64_t>(p));
    }
    finish_step(r, i, P, committed, on_frame);
  }
  r.seconds = clock.seconds();
  r.work = count.work();
  return r;
}

double negative_elbo(const DiffusionModel& m, const std::vector<std::int32_t>& tokens, std::int64_t R, std::uint64_t seed) {
  IL_CHECK(R >= 1, "negative_elbo: R must be at least 1; got ", R);
  IL_CHECK(tokens.size() >= 2, "negative_elbo: a sequence of at least 2 tokens");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  double total = 0;
  for (std::int64_t i = 1; i <= R; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(R);
    std::vector<std::int32_t> noisy = tokens;
    std::vector<std::size_t> masked;
    for (std::size_t p = 1; p < tokens.size(); ++p)
      if (uniform(rng) < t) noisy[p] = m.mask_id, masked.push_back(p);
    if (masked.empty()) continue;
    const std::vector<float> l = denoise(m, {noisy}).to_float_vector();
    const auto V = static_cast<std::size_t>(m.base.config.vocab_size);
    double nll = 0;
    for (std::size_t p : masked) {
      const float* row = &l[p * V];
      double mx = -INFINITY, sum = 0;
      for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (std::size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      nll += mx + std::log(sum) - row[static_cast<std::size_t>(tokens[p])];
    }
    total += nll / t / static_cast<double>(R);  // the (1/t)-weighted loss at level t, times dt = 1/R
  }
  return total / static_cast<double>(tokens.size() - 1);
}

}  // namespace inferlab::ch08
