// ch02_kv_cache: chapter 01's naive decoding and chapter 02's cached decoding side by side on
// the same prompt: the same tokens, the time per token against position, the lecture's metrics.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/02_kv_cache/kv_cache.h"
#include "common/cli.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch02;
using nlohmann::json;

int main(int argc, char** argv) {
  CLI::App app{"Chapter 02: the KV cache, against chapter 01's naive decoding", "ch02_kv_cache"};
  CommonOptions o;
  o.max_new_tokens = 64;
  std::string tokenizer_path, dtype = "f32";
  bool cached_only = false;
  add_common_options(app, o);
  help_footer(app, "tiny-mha with chapter 01's naive decoding and the KV cache side by side: the same tokens, "
              "time per token against position, TTFT and TPOT", "chapters/02_kv_cache/README.md",
              "朴素推理与 KV Cache and 推理的两个阶段");
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer file (default: the one beside the model)");
  app.add_option("--dtype", dtype, "Weight dtype: f32, bf16 or f16")->check(CLI::IsMember({"f32", "bf16", "f16"}))->capture_default_str();
  app.add_flag("--cached-only", cached_only, "Skip the naive run (for long generations)");
  return run_cli(app, argc, argv, [&] {
    const Device dev = o.resolved_device();
    const DType wt = dtype == "bf16" ? DType::BF16 : dtype == "f16" ? DType::F16 : DType::F32;
    const ch01::Llama m = ch01::load_llama(o.model).to(dev, wt);
    const auto tok = Tokenizer::for_model(o.model, tokenizer_path);
    const auto prompt = tok->encode(o.prompt);
    std::vector<std::int64_t> eos = m.config.eos_token_ids;
    if (m.rope_pairing == RopePairing::Adjacent) eos.push_back(1);
    const auto& c = m.config;
    std::printf("%s: %s, %.2f M parameters, %s weights on %s\n", app.get_name().c_str(), m.source.c_str(),
                static_cast<double>(c.num_parameters()) / 1e6, dtype_name(m.weight_dtype()).data(), device_name(dev).data());
    const std::int64_t S = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
    ch01::check_context(m, prompt.size(), o.max_new_tokens);  // before allocating a cache of S positions
    const ContiguousKVCache probe(c, S, Device::CPU);
    std::printf("KV cache for S = %lld: %s\n  = S × K × H × L × 2 × 4 bytes = %lld × %lld × %lld × %lld × 2 × 4\n\n",
                static_cast<long long>(S), probe.layout().c_str(), static_cast<long long>(S),
                static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.num_layers));

    const SamplingParams sp = o.sampling(*tok, c.vocab_size);
    Sampler s1(sp), s2(sp);
    TextStream stream(*tok, prompt);
    const ch01::Generation g = generate_cached(m, prompt, o.max_new_tokens, s2, eos,
                                               [&](const ch01::Generation& gen) { stream.print(gen.tokens); });
    std::printf("\n\n");
    ch01::Generation naive;
    if (!cached_only) naive = ch01::generate_naive(m, prompt, o.max_new_tokens, s1, eos);

    std::printf("%9s %16s %16s\n", "position", "naive ms/token", "cached ms/token");
    const std::size_t n = g.steps.size();
    for (std::size_t i = 0; i < n; i += std::max<std::size_t>(1, n / 8)) {
      const long long pos = static_cast<long long>(prompt.size() + i);
      if (cached_only) std::printf("%9lld %16s %16.3f\n", pos, "-", g.steps[i].seconds * 1e3);
      else std::printf("%9lld %16.3f %16.3f\n", pos, naive.steps[i].seconds * 1e3, g.steps[i].seconds * 1e3);
    }
    double naive_total = 0, naive_flops = 0, cached_flops = 0;
    for (const auto& st : naive.steps) naive_total += st.seconds, naive_flops += st.work.flops;
    for (const auto& st : g.steps) cached_flops += st.work.flops;
    std::printf("\n%-28s %14s %14s\n", "", "naive (ch01)", "cached (ch02)");
    if (!cached_only) {
      std::printf("%-28s %14.1f %14.1f\n", "total time (ms)", naive_total * 1e3, g.total_s * 1e3);
      std::printf("%-28s %14.3f %14.3f\n", "total GFLOP", naive_flops / 1e9, cached_flops / 1e9);
      std::printf("%-28s %14.3f %14.3f\n", "time to first token (ms)", naive.steps[0].seconds * 1e3, g.ttft_s() * 1e3);
      std::printf("%-28s %14.0f %14.0f\n", "tokens per second", static_cast<double>(naive.generated.size()) / naive_total,
                  g.tokens_per_s());
    }
    std::printf("%-28s %14s %14.3f\n", "time per output token (ms)", "", g.tpot_s() * 1e3);
    if (!cached_only) {
      const bool same = naive.generated == g.generated;
      std::printf("\nspeed-up %.1f×; the same %zu tokens: %s\n", naive_total / g.total_s, g.generated.size(),
                  same ? "yes" : "NO (fp32 rounding flipped a near-tie; see the tests for the logit agreement)");
    }
    if (!o.json.empty()) {
      json steps = json::array(), points = json::array();
      for (std::size_t i = 0; i < n; ++i) {
        steps.push_back({{"position", prompt.size() + i}, {"cached_seconds", g.steps[i].seconds},
                         {"cached_flops", g.steps[i].work.flops}, {"cached_bytes", g.steps[i].work.bytes},
                         {"naive_seconds", cached_only ? 0.0 : naive.steps[i].seconds}});
      }
      // Two roofline points for ch00_workload roofline --points: the prefill step and a decode step.
      points.push_back({{"label", "ch02 prefill"}, {"work", metrics::to_json(g.steps[0].work)}, {"seconds", g.ttft_s()}});
      if (n > 1)
        points.push_back({{"label", "ch02 decode"}, {"work", metrics::to_json(g.steps[n - 1].work)},
                          {"seconds", g.steps[n - 1].seconds}});
      write_json(o.json, {{"model", m.source}, {"device", device_name(dev)}, {"prompt_tokens", prompt},
                          {"generated_tokens", g.generated}, {"naive_generated_tokens", naive.generated},
                          {"ttft_s", g.ttft_s()}, {"tpot_s", g.tpot_s()}, {"total_s", g.total_s},
                          {"naive_total_s", naive_total}, {"kv_cache_bytes", probe.bytes()}, {"steps", steps},
                          {"roofline_points", points}},
                 {o.model, tokenizer_path});
    }
    return 0;
  });
}
