// ch02_kv_cache: chapter 01's naive decoding and chapter 02's cached decoding side by side on
// the same prompt: the same tokens, the time per token against position, the lecture's metrics.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/generate.h"
#include "common/cli.h"
#include "common/cuda/backend.h"
#include "common/models/kv_cache.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;

using namespace inferlab::models;
using nlohmann::json;

namespace {

// The FLOPs of one step, from the model's shape alone: `fed` tokens ending at position
// `end` - 1 go through every projection and the MLP (2 FLOPs per weight per token), the head
// runs on the last one only, and in attention query position p meets the p + 1 keys up to it
// (QKᵀ and AV: 4·N·H FLOPs per query-key pair, per layer). Norms, RoPE and the softmax are left
// out: they cost a few FLOPs per value, not per weight.
double step_flops(const TransformerConfig& c, std::int64_t fed, std::int64_t end) {
  const double D = static_cast<double>(c.hidden_size), F = static_cast<double>(c.intermediate_size);
  const double N = static_cast<double>(c.num_heads), K = static_cast<double>(c.num_kv_heads);
  const double H = static_cast<double>(c.head_dim), L = static_cast<double>(c.num_layers);
  const double per_token = 2 * L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F);
  const double t = static_cast<double>(fed), start = static_cast<double>(end - fed);
  const double pairs = t * start + t * (t + 1) / 2;  // Σ over the fed positions p of (p + 1)
  return per_token * t + 2 * D * static_cast<double>(c.vocab_size) + 4 * N * H * L * pairs;
}

// Time per token against position, naive and cached, each with the power law fitted to its
// decode steps (the first step of both is the prompt's prefill, left out).
void plot_steps(const std::vector<double>& pos, const std::vector<double>& naive_ms, const std::vector<double>& cached_ms,
                const std::string& title, const std::string& path) {
  plot::Figure f;
  f.title = title;
  f.x.label = "position of the new token";
  f.y.label = "time per token (ms, fastest of the runs)";
  f.y.log = true;
  for (const auto* ms : {&naive_ms, &cached_ms}) {
    if (ms->empty()) continue;
    const plot::PowerLaw fit = plot::fit_power_law(pos, *ms);
    char label[96];
    std::snprintf(label, sizeof label, "%s (fit: ∝ position^%.2f)", ms == &naive_ms ? "naive, ch01" : "KV cache, ch02",
                  fit.exponent);
    plot::Series s;
    s.label = label;
    s.markers = true;
    s.color = ms == &naive_ms ? "#1f77b4" : "#d62728";
    s.x = pos, s.y = *ms;
    f.series.push_back(s);
    if (!fit.ok) continue;
    plot::Series c = plot::curve("", pos.front(), pos.back(), 64, false, fit);
    c.label = std::string(ms == &naive_ms ? "naive" : "cached") + " fit";
    c.dashed = true, c.color = s.color;
    f.series.push_back(c);
  }
  plot::save_svg(f, path);
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 02: the KV cache, against chapter 01's naive decoding", "ch02_kv_cache"};
  CommonOptions o;
  o.max_new_tokens = 64;
  std::string tokenizer_path, dtype = "f32", svg;
  bool cached_only = false;
  int repeats = 3;
  add_common_options(app, o);
  help_footer(app,
              "tiny-mha with chapter 01's naive decoding and the KV cache side by side, 64 new tokens, "
              "3 runs of each: the same tokens, time per token against position, TTFT (best of 20) and TPOT, and the "
              "speed-up in FLOPs computed from the model's shape beside the measured speed-up in time",
              "chapters/02_kv_cache/README.md", "朴素推理与 KV Cache and 推理的两个阶段");
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer file (default: the one beside the model)");
  app.add_option("--dtype", dtype, "Weight dtype: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_flag("--cached-only", cached_only, "Skip the naive run (for long generations)");
  app.add_option("--repeats", repeats, "Runs of each method; each step's time is the fastest of them")
      ->check(number_in(1, 1000))
      ->capture_default_str();
  app.add_option("--svg", svg, "Also plot the time per token against position, naive and cached, as SVG")
      ->check(output_file());
  return run_cli(app, argc, argv, [&] {
    const Device dev = o.resolved_device();
    const DType wt = dtype == "bf16" ? DType::BF16 : dtype == "f16" ? DType::F16 : DType::F32;
    const models::Llama m = models::load_llama(o.model).to(dev, wt);
    const auto tok = Tokenizer::for_model(o.model, tokenizer_path);
    const auto prompt = tok->encode(o.prompt);
    std::vector<std::int64_t> eos = m.config.eos_token_ids;
    if (m.rope_pairing == RopePairing::Adjacent) eos.push_back(1);
    const auto& c = m.config;
    std::printf("%s: %s, %.2f M parameters, %s weights on %s\n", app.get_name().c_str(), m.source.c_str(),
                static_cast<double>(c.num_parameters()) / 1e6, dtype_name(m.weight_dtype()).data(), device_name(dev).data());
    const std::int64_t S = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
    models::check_context(m, prompt.size(), o.max_new_tokens);  // before allocating a cache of S positions
    const ContiguousKVCache probe(c, S, Device::CPU);
    std::printf("KV cache for S = %lld: %s\n  = S × K × H × L × 2 × 4 bytes = %lld × %lld × %lld × %lld × 2 × 4\n\n",
                static_cast<long long>(S), probe.layout().c_str(), static_cast<long long>(S),
                static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.num_layers));

    const SamplingParams sp = o.sampling(*tok, c.vocab_size);
    // The first forward pass of a process is slow: it touches the weights' pages for the first
    // time and starts the worker threads. Whichever method ran first used to pay for that in
    // its time to first token. It is measured here and kept out of the comparison.
    metrics::Timer cold = metrics::Timer::work(dev == Device::CPU);
    ch01::forward(m, prompt);
    if (dev == Device::CUDA) cuda::synchronize();
    const double cold_s = cold.seconds();
    // Time to first token: one forward pass over the prompt and a sample (the cached one also
    // allocates its cache), the best of `ttft_runs` each, alternating.
    const int ttft_runs = 20;
    double naive_ttft = 1e300, cached_ttft = 1e300;
    for (int r = 0; r < ttft_runs; ++r) {
      Sampler a(sp), b(sp);
      metrics::Timer t = metrics::Timer::work(dev == Device::CPU);
      generate_cached(m, prompt, 1, a, eos);
      cached_ttft = std::min(cached_ttft, t.seconds());
      if (cached_only) continue;
      t = metrics::Timer::work(dev == Device::CPU);
      ch01::generate_naive(m, prompt, 1, b, eos);
      naive_ttft = std::min(naive_ttft, t.seconds());
    }
    // The whole generation, `repeats` times each, alternating; each step's time is the fastest
    // of its runs (a run on a shared machine can be stalled at any step by other work).
    models::Generation g, naive;
    std::vector<double> cached_runs, naive_runs;
    auto keep_fastest = [](models::Generation& best, models::Generation run, bool first) {
      if (first) best = std::move(run);
      else
        for (std::size_t i = 0; i < std::min(best.steps.size(), run.steps.size()); ++i)
          best.steps[i].seconds = std::min(best.steps[i].seconds, run.steps[i].seconds);
    };
    TextStream stream(*tok, prompt);
    for (int r = 0; r < repeats; ++r) {
      Sampler s2(sp);
      models::Generation run = generate_cached(m, prompt, o.max_new_tokens, s2, eos, [&](const models::Generation& gen) {
        if (r == 0) stream.print(gen.tokens);
      });
      if (r == 0) std::printf("\n\n");
      cached_runs.push_back(run.total_s);
      keep_fastest(g, std::move(run), r == 0);
      if (cached_only) continue;
      Sampler s1(sp);
      run = ch01::generate_naive(m, prompt, o.max_new_tokens, s1, eos);
      naive_runs.push_back(run.total_s);
      keep_fastest(naive, std::move(run), r == 0);
    }
    g.total_s = naive.total_s = 0;
    for (const auto& st : g.steps) g.total_s += st.seconds;
    for (const auto& st : naive.steps) naive.total_s += st.seconds;

    std::printf("%9s %16s %16s   (each step the fastest of %d runs)\n", "position", "naive ms/token", "cached ms/token",
                repeats);
    const std::size_t n = g.steps.size();
    for (std::size_t i = 0; i < n; i += std::max<std::size_t>(1, n / 8)) {
      const long long pos = static_cast<long long>(prompt.size() + i);
      if (cached_only) std::printf("%9lld %16s %16.3f\n", pos, "-", g.steps[i].seconds * 1e3);
      else std::printf("%9lld %16.3f %16.3f\n", pos, naive.steps[i].seconds * 1e3, g.steps[i].seconds * 1e3);
    }
    double naive_flops = 0, cached_flops = 0, naive_shape_flops = 0, cached_shape_flops = 0;
    for (const auto& st : naive.steps)
      naive_flops += st.work.flops, naive_shape_flops += step_flops(c, st.tokens_in, st.tokens_in);
    for (std::size_t i = 0; i < n; ++i) {
      cached_flops += g.steps[i].work.flops;
      cached_shape_flops += step_flops(c, g.steps[i].tokens_in, static_cast<std::int64_t>(prompt.size() + i));
    }
    std::printf("\n%-28s %14s %14s\n", "", "naive (ch01)", "cached (ch02)");
    if (!cached_only) {
      std::printf("%-28s %14.1f %14.1f\n", "time, Σ fastest steps (ms)", naive.total_s * 1e3, g.total_s * 1e3);
      std::printf("%-28s %14.3f %14.3f\n", "total GFLOP (counted)", naive_flops / 1e9, cached_flops / 1e9);
      std::printf("%-28s %14.3f %14.3f   (best of %d)\n", "time to first token (ms)", naive_ttft * 1e3, cached_ttft * 1e3,
                  ttft_runs);
      std::printf("%-28s %14.0f %14.0f\n", "tokens per second", naive.tokens_per_s(), g.tokens_per_s());
    } else {
      std::printf("%-28s %14s %14.3f   (best of %d)\n", "time to first token (ms)", "", cached_ttft * 1e3, ttft_runs);
    }
    std::printf("%-28s %14s %14.3f\n", "time per output token (ms)", "", g.tpot_s() * 1e3);
    std::printf("(the process's first forward pass, cold, took %.3f ms; it is not in these figures)\n", cold_s * 1e3);
    if (!cached_only) {
      const auto [naive_min, naive_max] = std::minmax_element(naive_runs.begin(), naive_runs.end());
      const auto [cached_min, cached_max] = std::minmax_element(cached_runs.begin(), cached_runs.end());
      std::printf("\nspeed-up in FLOPs: %.1f× computed from the model's shape (%.1f× as the ops counted them)\n",
                  naive_shape_flops / cached_shape_flops, naive_flops / cached_flops);
      std::printf(
          "speed-up in time:  %.1f×, fastest step of %d runs each (whole runs: naive %.1f–%.1f ms, cached "
          "%.2f–%.2f ms)\n",
          naive.total_s / g.total_s, repeats, *naive_min * 1e3, *naive_max * 1e3, *cached_min * 1e3, *cached_max * 1e3);
      const bool same = naive.generated == g.generated;
      std::printf("the same %zu tokens: %s\n", g.generated.size(),
                  same ? "yes" : "NO (fp32 rounding flipped a near-tie; see the tests for the logit agreement)");
    }
    if (!svg.empty()) {
      std::vector<double> pos, naive_ms, cached_ms;
      for (std::size_t i = 1; i < n; ++i) {
        pos.push_back(static_cast<double>(prompt.size() + i));
        cached_ms.push_back(g.steps[i].seconds * 1e3);
        if (!cached_only) naive_ms.push_back(naive.steps[i].seconds * 1e3);
      }
      plot_steps(pos, naive_ms, cached_ms,
                 "Time per token against position: re-running everything vs the KV cache (" +
                     m.source.substr(m.source.find_last_of('/') + 1) + ", " + std::string(device_name(dev)) + ")",
                 svg);
    }
    if (!o.json.empty()) {
      json steps = json::array(), points = json::array();
      for (std::size_t i = 0; i < n; ++i) {
        steps.push_back({{"position", prompt.size() + i},
                         {"cached_seconds", g.steps[i].seconds},
                         {"cached_flops", g.steps[i].work.flops},
                         {"cached_bytes", g.steps[i].work.bytes},
                         {"naive_seconds", cached_only ? 0.0 : naive.steps[i].seconds}});
      }
      // Two roofline points for ch00_workload roofline --points: the prefill step and a decode step.
      points.push_back({{"label", "ch02 prefill"}, {"work", metrics::to_json(g.steps[0].work)}, {"seconds", g.ttft_s()}});
      if (n > 1)
        points.push_back({{"label", "ch02 decode"},
                          {"work", metrics::to_json(g.steps[n - 1].work)},
                          {"seconds", g.steps[n - 1].seconds}});
      write_json(o.json,
                 {{"model", m.source},
                  {"device", device_name(dev)},
                  {"prompt_tokens", prompt},
                  {"generated_tokens", g.generated},
                  {"naive_generated_tokens", naive.generated},
                  {"repeats", repeats},
                  {"ttft_runs", ttft_runs},
                  {"cold_first_forward_s", cold_s},
                  {"ttft_s", cached_ttft},
                  {"naive_ttft_s", cached_only ? 0.0 : naive_ttft},
                  {"tpot_s", g.tpot_s()},
                  {"total_s", g.total_s},
                  {"naive_total_s", naive.total_s},
                  {"cached_runs_s", cached_runs},
                  {"naive_runs_s", naive_runs},
                  {"flops_ratio_shape", cached_only ? 0.0 : naive_shape_flops / cached_shape_flops},
                  {"flops_ratio_counted", cached_only ? 0.0 : naive_flops / cached_flops},
                  {"time_ratio", cached_only ? 0.0 : naive.total_s / g.total_s},
                  {"kv_cache_bytes", probe.bytes()},
                  {"steps", steps},
                  {"roofline_points", points}},
                 {o.model, tokenizer_path});
    }
    return 0;
  });
}
