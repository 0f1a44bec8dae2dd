// ch06_local_attention: sliding windows, ring caches and hybrid stacks. What a window saves (cache
// bytes flat in the context, time per token flat in the position) and what it costs (reach: a
// token beyond the receptive field has no effect at all).
//   ch06_local_attention             the headline
//   ch06_local_attention memory      cache bytes against context for a model and its hybrids
//   ch06_local_attention speed       time per decode token against position, local against global
//   ch06_local_attention recall      probe accuracy and a token's influence against distance, as a plot
//   ch06_local_attention hybrids     the KV arithmetic of long-context hybrids for a model you choose
//   ch06_local_attention gemma       the same for Gemma 2 and Gemma 3 as published, at 8K and 128K tokens
//   ch06_local_attention generate    text through the ring cache
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "chapters/00_workload/workload.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/decode_bench.h"
#include "common/eval.h"
#include "common/models/gguf_llama.h"
#include "common/models/local.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::models::local;
using nlohmann::json;

namespace {

using ll = long long;

const std::vector<std::string> kZoo = {"tiny-mha", "tiny-swa", "tiny-hybrid"};

std::string field(std::int64_t rf) { return rf < 0 ? "unlimited" : std::to_string(rf) + " positions"; }

// --- cache bytes -----------------------------------------------------------------------------
json bytes_table(const std::vector<std::pair<std::string, LocalModel>>& models, const std::vector<std::int64_t>& contexts,
                 bool indent) {
  std::printf("%s%-12s", indent ? "  " : "", "KV bytes at T");
  for (std::int64_t T : contexts) std::printf(" %10lld", static_cast<ll>(T));
  std::printf("   layers\n");
  json rows = json::array();
  for (const auto& [name, m] : models) {
    std::printf("%s%-12s", indent ? "  " : "", name.c_str());
    json bytes = json::array();
    for (std::int64_t T : contexts) {
      const std::int64_t b = kv_cache_bytes(m.config(), m.layout, T, 4);
      std::printf(" %10lld", static_cast<ll>(b));
      bytes.push_back(b);
    }
    std::printf("   %s\n", m.layout.describe().c_str());
    rows.push_back({{"model", name}, {"layout", m.layout.describe()}, {"contexts", contexts}, {"bytes", bytes}});
  }
  return rows;
}

std::vector<std::pair<std::string, LocalModel>> zoo() {
  std::vector<std::pair<std::string, LocalModel>> out;
  for (const std::string& n : kZoo) out.emplace_back(n, load_local(data_dir() + "/models/" + n));
  return out;
}

// --- a token's influence against distance ----------------------------------------------------
// The largest change in the last position's logits when the token `d` positions before it is
// replaced by another: exactly 0 beyond the receptive field, where no path through the layers
// reaches that far back.
std::vector<double> influence(const LocalModel& m, const std::vector<std::int32_t>& tokens,
                              const std::vector<std::int64_t>& distances) {
  const std::int64_t T = static_cast<std::int64_t>(tokens.size());
  auto last_logits = [&](const std::vector<std::int32_t>& t) {
    RingKVCache cache(m.config(), m.layout, T);
    return forward_cached(m, cache, t).to_double_vector();
  };
  const auto base = last_logits(tokens);
  std::vector<double> out;
  for (std::int64_t d : distances) {
    IL_CHECK(d >= 0 && d < T, "influence: distance ", d, " is outside a sequence of ", T);
    auto changed = tokens;
    auto& tok = changed[static_cast<std::size_t>(T - 1 - d)];
    tok = (tok + 1) % static_cast<std::int32_t>(m.config().vocab_size);
    const auto now = last_logits(changed);
    double w = 0;
    for (std::size_t i = 0; i < now.size(); ++i) w = std::max(w, std::fabs(now[i] - base[i]));
    out.push_back(w);
  }
  return out;
}

json influence_table(const std::vector<std::pair<std::string, LocalModel>>& models,
                     const std::vector<std::int64_t>& distances, bool indent) {
  const auto tokens = eval::validation_tokens(data_dir(), 512);
  std::printf("%s%-12s", indent ? "  " : "", "distance d");
  for (std::int64_t d : distances) std::printf(" %9lld", static_cast<ll>(d));
  std::printf("   receptive field\n");
  json rows = json::array();
  for (const auto& [name, m] : models) {
    const auto w = influence(m, tokens, distances);
    std::vector<bool> reached;
    for (std::int64_t d : distances) reached.push_back(reaches(m, tokens, d));
    std::printf("%s%-12s", indent ? "  " : "", name.c_str());
    for (std::size_t i = 0; i < w.size(); ++i) std::printf(" %8.2g%s", w[i], reached[i] ? "*" : " ");
    std::printf("   %s\n", field(m.layout.receptive_field()).c_str());
    std::fflush(stdout);
    rows.push_back({{"model", name},
                    {"distances", distances},
                    {"max_abs_logit_change", w},
                    {"reaches", reached},
                    {"receptive_field", m.layout.receptive_field()}});
  }
  std::printf(
      "%s(* the token reaches the last logits at all: a NaN put in its place turns them NaN; a change too small\n"
      "%s for float32 shows as 0 with a *, beyond the receptive field there is no * and no path)\n",
      indent ? "  " : "", indent ? "  " : "");
  return rows;
}

// --- time per token against position ---------------------------------------------------------
TransformerConfig speed_shape(std::int64_t layers) { return models::memory_bound_shape(layers, 16, 8192, 1 << 17); }

// One decode step at `position` cached positions, timed as every chapter times its steps (a warm-up,
// then the best of `steps`); its bytes are the weights and the rows attention reads.
ThroughputPoint time_step(const LocalModel& m, std::int64_t position, int steps) {
  RingKVCache cache(m.config(), m.layout, position + steps + 1, m.base.device());
  for (std::int64_t l = 0; l < m.config().num_layers; ++l) {  // what a prefill would have left, without one
    Tensor k = cache.k(l).slice(0, 0, m.layout.rows(l, position)), v = cache.v(l).slice(0, 0, m.layout.rows(l, position));
    fill_random(k, static_cast<std::uint64_t>(2 * l + 1));
    fill_random(v, static_cast<std::uint64_t>(2 * l + 2));
  }
  cache.commit(position);
  const double bytes = static_cast<double>(m.base.step_weight_bytes()) +
                       static_cast<double>(kv_cache_bytes(m.config(), m.layout, position + 1, 4));
  return time_decode(1, bytes, steps, m.base.device(), [&] { forward_cached(m, cache, {3}); });
}

json speed_table(const metrics::Ceiling& roof, std::int64_t layers, std::int64_t window,
                 const std::vector<std::int64_t>& positions, int steps, Device dev, bool indent) {
  const models::Llama base = models::random_llama(speed_shape(layers), 1).to(dev, DType::F32);
  const std::vector<std::pair<std::string, LocalModel>> models = {
      {"global", {base, LocalLayout::global(layers)}},
      {"local W=" + std::to_string(window), {base, LocalLayout::local(layers, window)}}};
  json rows = json::array();
  metrics::CeilingLegend legend;
  for (const auto& [name, m] : models) {
    std::printf("%s%-12s", indent ? "  " : "", name.c_str());
    json points = json::array();
    for (std::int64_t p : positions) {
      const auto s = time_step(m, p, steps);
      // Against a streaming read over as many bytes as the step reads (in cache, or from memory).
      const auto read = metrics::read_ceiling_for(roof, s.bytes_per_step);
      std::printf("  %6.2f ms (%4.1f GB/s, %3.0f%% %-5s)", s.seconds_per_step * 1e3, s.achieved_bytes_per_s() / 1e9,
                  legend.percent(name + " at " + std::to_string(p), s.achieved_bytes_per_s(), read), read.abbrev());
      std::fflush(stdout);
      points.push_back({{"position", p},
                        {"seconds", s.seconds_per_step},
                        {"bytes", s.bytes_per_step},
                        {"read_ceiling", metrics::to_json(read)}});
    }
    std::printf("\n");
    rows.push_back({{"layout", name}, {"points", points}});
  }
  legend.print(indent ? "  " : "");
  return rows;
}

int memory(const std::string& model, const std::vector<std::int64_t>& contexts, const std::string& json_path) {
  std::vector<std::pair<std::string, LocalModel>> models;
  if (model.empty()) {
    models = zoo();
  } else {
    std::string name = std::filesystem::path(model).filename().string();
    if (name.empty()) name = std::filesystem::path(model).parent_path().filename().string();  // "dir/"
    models.emplace_back(name, load_local(model));
  }
  std::printf("KV cache bytes of one sequence (f32) against its length: a local layer's share stops at its window\n\n");
  const json rows = bytes_table(models, contexts, false);
  if (!json_path.empty()) write_json(json_path, {{"rows", rows}});
  return 0;
}

int speed(const ModelOptions& o, std::int64_t layers, std::int64_t window, const std::vector<std::int64_t>& positions,
          int steps, const std::string& json_path) {
  const Device dev = o.resolved_device();
  const auto roof = metrics::measure_ceiling(dev);
  std::printf(
      "One decode step against position, random weights: D = 1024, L = %lld, N = K = 16, H = 64, f32, %s; "
      "best of %d steps; GB/s = bytes the step reads (weights + the rows attention sees) / time, %% of a "
      "streaming read over as many bytes (cache: in the last-level cache, part: partly, mem: from memory, "
      "%s)\n\n",
      static_cast<ll>(layers), device_name(dev).data(), steps, metrics::describe(roof.read, "B").c_str());
  std::printf("%-12s", "position");
  for (std::int64_t p : positions) std::printf("  %35lld", static_cast<ll>(p));
  std::printf("\n");
  const json rows = speed_table(roof, layers, window, positions, steps, dev, false);
  if (!json_path.empty())
    write_json(json_path,
               {{"device", device_name(dev)}, {"ceiling", metrics::to_json(roof)}, {"window", window}, {"rows", rows}});
  return 0;
}

// A vertical dashed line at tiny-swa's receptive field, from y0 to y1.
plot::Series field_line(std::int64_t rf, double y0, double y1) {
  plot::Series line;
  line.label = "tiny-swa's receptive field, 4 × 63 + 1 = " + std::to_string(rf);
  line.x = {static_cast<double>(rf), static_cast<double>(rf)};
  line.y = {y0, y1};
  line.dashed = true;
  return line;
}

int recall(std::int64_t per_kind, const std::string& svg, const std::string& reach_svg, const std::string& json_path) {
  const auto models = zoo();
  const std::int64_t rf = models[1].second.layout.receptive_field();
  const std::vector<std::int64_t> distances = {1,   2,   4,   8,   16,  32,  64,  96,  128, 160,
                                               192, 224, 240, 248, 252, 253, 256, 300, 400, 500};
  std::printf(
      "A token's influence: max |Δ logit| at the last of 512 validation tokens when the token d positions before "
      "it is replaced\n\n");
  const json infl = influence_table(models, distances, false);
  plot::Figure reach;
  reach.title = "A token's influence on the last logits against its distance (0 is not drawn: below float32, or no path)";
  reach.x = {"distance d (tokens)", false, 0, 512};
  reach.y = {"max |change of a logit| when the token d back is replaced", true, 0, 0};
  for (std::size_t i = 0; i < models.size(); ++i) {
    plot::Series s;
    s.label = models[i].first;
    s.markers = true;
    const auto w = infl[i]["max_abs_logit_change"].get<std::vector<double>>();
    for (std::size_t j = 0; j < w.size(); ++j)
      if (w[j] > 0) s.x.push_back(static_cast<double>(distances[j])), s.y.push_back(w[j]);
    reach.series.push_back(s);
  }
  double top = 1;  // the line spans the plotted values, which can exceed a logit change of 1
  for (const auto& s : reach.series)
    for (double v : s.y) top = std::max(top, v);
  reach.series.push_back(field_line(rf, 1e-7, top));
  if (!reach_svg.empty()) plot::save_svg(reach, reach_svg), std::printf("\nplot: %s\n", reach_svg.c_str());
  // Probe accuracy against the fact's distance (the zoo's recall@N probes).
  const auto tok = Tokenizer::for_model(data_dir() + "/models/tiny-mha");
  const auto probes = eval::load_probes(data_dir() + "/corpus/probes.jsonl");
  std::printf("\nProbe accuracy (%lld per kind; chance is 1/16 to 1/12, docs/model-zoo.md)\n\n", static_cast<ll>(per_kind));
  plot::Figure fig;
  fig.title = "Probe accuracy against the distance of the fact (chance is 1/16 to 1/12)";
  fig.x = {"distance of the fact (tokens)", false, 0, 512};
  fig.y = {"probe accuracy (greedy, exact)", false, 0, 1};
  json acc = json::array();
  for (const auto& [name, m] : models) {
    const eval::LogitsFn logits = [&m](const std::vector<std::int32_t>& t) {
      RingKVCache cache(m.config(), m.layout, static_cast<std::int64_t>(t.size()));
      return forward_cached(m, cache, t, true);
    };
    const auto scores = eval::probe_accuracy(logits, *tok, probes, per_kind, name + ": probes");
    plot::Series s;
    s.label = name;
    s.markers = true;
    std::vector<std::pair<double, double>> by_distance;  // (distance, accuracy), nearest first
    for (const auto& [kind, a] : scores.accuracy)
      if (kind.rfind("recall_", 0) == 0) by_distance.emplace_back(std::stod(kind.substr(7)), a);
    std::sort(by_distance.begin(), by_distance.end());
    std::printf("%-12s", name.c_str());
    for (const auto& [d, a] : by_distance) {
      s.x.push_back(d), s.y.push_back(a);
      std::printf("  @%g %.3f", d, a);
    }
    std::printf("\n");
    fig.series.push_back(s);
    acc.push_back({{"model", name}, {"accuracy", scores.accuracy}, {"distractor", scores.distractor}});
  }
  fig.series.push_back(field_line(rf, 0, 1));
  if (!svg.empty()) plot::save_svg(fig, svg), std::printf("\nplot: %s\n", svg.c_str());
  if (!json_path.empty()) write_json(json_path, {{"influence", infl}, {"probes", acc}, {"probes_per_kind", per_kind}});
  return 0;
}

int hybrids(const std::string& model, const std::vector<std::int64_t>& contexts, std::int64_t window,
            std::int64_t bytes_per_value, const std::string& json_path) {
  const TransformerConfig c = ch00::find_model(model);
  const std::int64_t L = c.num_layers;
  std::printf("%s: L = %lld, K = %lld, H = %lld; KV cache of one sequence, %lld bytes per value, window %lld\n\n",
              model.c_str(), static_cast<ll>(L), static_cast<ll>(c.num_kv_heads), static_cast<ll>(c.head_dim),
              static_cast<ll>(bytes_per_value), static_cast<ll>(window));
  const std::vector<std::pair<std::string, LocalLayout>> layouts = {
      {"dense (every layer global)", LocalLayout::global(L)},
      {"1 global in 6 (Character.AI, Gemma 3)", LocalLayout::hybrid(L, window, 6)},
      {"1 global in 4 (tiny-hybrid's ratio)", LocalLayout::hybrid(L, window, 4)},
      {"every layer local", LocalLayout::local(L, window)}};
  std::printf("%-38s", "layout");
  for (std::int64_t T : contexts) std::printf(" %16lld", static_cast<ll>(T));
  std::printf("\n");
  json rows = json::array();
  for (const auto& [name, layout] : layouts) {
    std::printf("%-38s", name.c_str());
    json bytes = json::array();
    for (std::int64_t T : contexts) {
      const std::int64_t b = kv_cache_bytes(c, layout, T, bytes_per_value);
      const double dense = static_cast<double>(kv_cache_bytes(c, layouts[0].second, T, bytes_per_value));
      std::printf(" %9s %5.1f×", metrics::human_bytes(static_cast<double>(b)).c_str(), dense / static_cast<double>(b));
      bytes.push_back(b);
    }
    std::printf("\n");
    rows.push_back({{"layout", name}, {"globals", layout.globals()}, {"contexts", contexts}, {"bytes", bytes}});
  }
  const std::int64_t g = layouts[1].second.globals();
  std::printf(
      "\nA local layer's share is fixed at W; the global layers' grows with T and soon is all there is:\n"
      "at long contexts the saving tends to L / (global layers), whatever W: %lld/%lld = %.1f× for one in six.\n"
      "(Where in each group of six the global layer sits changes no byte.)\n",
      static_cast<ll>(L), static_cast<ll>(g), static_cast<double>(L) / static_cast<double>(g));
  if (!json_path.empty())
    write_json(json_path, {{"model", model}, {"window", window}, {"bytes_per_value", bytes_per_value}, {"rows", rows}});
  return 0;
}

// --- Gemma: the hybrid of this chapter in a real model family -----------------------------------
// Gemma 2 alternates a local layer (window 4096) with a global one; Gemma 3 keeps one global layer
// in six, its local ones with a window of 1024. Their published config.json values.
struct GemmaShape {
  std::string name;
  TransformerConfig config;
  LocalLayout layout;
};

GemmaShape gemma_shape(const std::string& name, std::int64_t D, std::int64_t F, std::int64_t L, std::int64_t N,
                       std::int64_t K, std::int64_t H, std::int64_t V, std::int64_t context, std::int64_t window,
                       std::int64_t global_every) {
  TransformerConfig c;
  c.architecture = global_every == 2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM";
  c.hidden_size = D, c.intermediate_size = F, c.num_layers = L, c.num_heads = N, c.num_kv_heads = K, c.head_dim = H;
  c.vocab_size = V, c.max_position_embeddings = context, c.tie_word_embeddings = true;
  return {name, c, LocalLayout::hybrid(L, window, global_every)};
}

std::vector<GemmaShape> gemma_shapes(const std::string& model) {
  if (!model.empty()) {  // a Gemma (or any chapter 06) folder or config.json: its own layers
    const HfConfig hf = load_hf_config(model);
    const TransformerConfig c = parse_transformer_config(hf);
    return {{model, c, parse_local_layout(hf, c.num_layers)}};
  }
  return {gemma_shape("gemma-2-9b", 3584, 14336, 42, 16, 8, 256, 256000, 8192, 4096, 2),
          gemma_shape("gemma-2-27b", 4608, 36864, 46, 32, 16, 128, 256000, 8192, 4096, 2),
          gemma_shape("gemma-3-4b", 2560, 10240, 34, 8, 4, 256, 262208, 131072, 1024, 6),
          gemma_shape("gemma-3-27b", 5376, 21504, 62, 32, 16, 128, 262208, 131072, 1024, 6)};
}

int gemma(const std::string& model, const std::vector<std::int64_t>& contexts, std::int64_t bytes_per_value,
          const std::string& json_path) {
  std::printf(
      "KV cache of one sequence, %lld bytes per value: the model's local/global layers (ring caches of W\n"
      "slots for the local ones) against every layer global\n\n",
      static_cast<ll>(bytes_per_value));
  std::printf("%-14s %-32s", "model", "layers");
  for (std::int64_t T : contexts) std::printf(" %10lld tokens: hybrid / global", static_cast<ll>(T));
  std::printf("\n");
  json rows = json::array();
  for (const GemmaShape& g : gemma_shapes(model)) {
    const std::int64_t W = g.layout.locals() ? *std::max_element(g.layout.window.begin(), g.layout.window.end()) : 0;
    const std::string layers = std::to_string(g.layout.locals()) + " local (W = " + std::to_string(W) + "), " +
                               std::to_string(g.layout.globals()) + " global";
    std::printf("%-14s %-32s", g.name.c_str(), layers.c_str());
    json points = json::array();
    for (std::int64_t T : contexts) {
      const std::int64_t hybrid = kv_cache_bytes(g.config, g.layout, T, bytes_per_value),
                         dense = g.config.kv_cache_bytes(T, bytes_per_value);
      std::printf(" %10s / %9s (%4.1f×)", metrics::human_bytes(static_cast<double>(hybrid)).c_str(),
                  metrics::human_bytes(static_cast<double>(dense)).c_str(),
                  static_cast<double>(dense) / static_cast<double>(hybrid));
      points.push_back({{"tokens", T}, {"hybrid_bytes", hybrid}, {"global_bytes", dense}});
    }
    std::printf("%s\n", std::any_of(contexts.begin(), contexts.end(),
                                    [&](std::int64_t T) { return T > g.config.max_position_embeddings; })
                            ? "  (beyond its trained context)"
                            : "");
    rows.push_back({{"model", g.name},
                    {"layers", g.config.num_layers},
                    {"local_layers", g.layout.locals()},
                    {"window", W},
                    {"kv_heads", g.config.num_kv_heads},
                    {"head_dim", g.config.head_dim},
                    {"points", points}});
  }
  std::printf(
      "\nA local layer holds W positions whatever the context; at long contexts the cache tends to the\n"
      "global layers' share alone: L / (global layers) smaller (Gemma 3: one in six).\n");
  if (!json_path.empty()) write_json(json_path, {{"bytes_per_value", bytes_per_value}, {"rows", rows}});
  return 0;
}

int generate(const CommonOptions& o) {
  const LocalModel m = load_local(o.model);
  const bool gguf_file = std::filesystem::path(o.model).extension() == ".gguf";  // its own tokenizer (chapter 09)
  const auto tok = gguf_file ? models::gguf_tokenizer(gguf::File(o.model), "", o.model) : Tokenizer::for_model(o.model);
  const auto prompt = tok->encode(o.prompt);
  models::check_context(m.base, prompt.size(), o.max_new_tokens);
  const std::int64_t S = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
  const RingKVCache cache(m.config(), m.layout, S);
  std::printf("%s: %s; cache for S = %lld: %lld bytes (every layer global: %lld)\n\n", m.base.source.c_str(),
              m.layout.describe().c_str(), static_cast<ll>(S), static_cast<ll>(cache.bytes()),
              static_cast<ll>(m.config().kv_cache_bytes(S, 4)));
  Sampler sampler(o.sampling(*tok, m.config().vocab_size));
  TextStream stream(*tok, prompt);
  const models::Generation g = generate_cached(m, prompt, o.max_new_tokens, sampler, m.config().eos_token_ids,
                                               [&](const models::Generation& gen) { stream.print(gen.tokens); });
  std::printf("\n\n%zu tokens: time to first token %.2f ms, %.2f ms per later token, %.1f tokens/s\n", g.generated.size(),
              g.ttft_s() * 1e3, g.tpot_s() * 1e3, g.tokens_per_s());
  if (!o.json.empty())
    write_json(o.json,
               {{"model", o.model},
                {"prompt", o.prompt},
                {"prompt_tokens", prompt},
                {"layout", m.layout.describe()},
                {"cache_bytes", cache.bytes()},
                {"generated", g.generated},
                {"ttft_s", g.ttft_s()},
                {"tpot_s", g.tpot_s()}},
               {o.model});
  return 0;
}

int headline(const std::string& json_path) {
  std::printf(
      "Local attention (lecture: 局部注意力): a layer sees only its last W positions, so its cache is a ring of W slots\n");
  const auto models = zoo();
  const json bytes = bytes_table(models, {64, 128, 256, 512}, true);
  std::printf(
      "  a token's influence on the last of 512 positions, max |Δ logit| when the token d positions back changes:\n");
  const json infl = influence_table(models, {32, 128, 252, 253, 400}, true);
  const metrics::Ceiling roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf(
      "  one decode step against position (random 4-layer 16-head models, best of 3; GB/s against a streaming\n"
      "  read over as many bytes, cache: in the last-level cache, mem: from memory at %s):\n",
      metrics::describe(roof.read, "B").c_str());
  std::printf("  %-12s", "position");
  for (std::int64_t p : {512, 2048, 8192}) std::printf("  %35lld", static_cast<ll>(p));
  std::printf("\n");
  const json speed = speed_table(roof, 4, 512, {512, 2048, 8192}, 3, Device::CPU, true);
  std::printf("  more: ch06_local_attention memory | speed | recall | hybrids | gemma | generate\n");
  if (!json_path.empty())
    write_json(json_path, {{"bytes", bytes}, {"influence", infl}, {"ceiling", metrics::to_json(roof)}, {"speed", speed}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 06: local attention, ring caches and hybrid stacks", "ch06_local_attention"};
  std::string json_path;
  add_json_option(app, json_path);  // the bare run's
  help_footer(app,
              "the cache bytes of tiny-mha, tiny-swa and tiny-hybrid against context, how much a token d positions "
              "back moves the last logits (exactly nothing beyond tiny-swa's receptive field of 253), and one decode step "
              "against position for a global and a local stack, with GB/s against the measured read ceiling",
              "chapters/06_local_attention/README.md", "局部注意力");
  std::string model;
  std::vector<std::int64_t> contexts = {64, 128, 256, 512};
  auto* sm = app.add_subcommand("memory", "Cache bytes against context (tiny-mha, tiny-swa, tiny-hybrid, or --model)");
  add_json_option(*sm, json_path);
  sm->add_option("--model", model, "A model folder (default: the three bundled ones)");
  sm->add_option("--contexts", contexts, "Sequence lengths")->delimiter(',')->check(number_in(1, 1 << 24));
  ModelOptions dev;
  std::int64_t layers = 4, window = 512;
  std::vector<std::int64_t> positions = {512, 2048, 8192, 32768};
  int steps = 3;
  auto* ss = app.add_subcommand("speed", "One decode step against position, local against global");
  add_device_option(*ss, dev);
  add_json_option(*ss, json_path);
  ss->add_option("--layers", layers, "Layers of the random model")->check(number_in(1, 64))->capture_default_str();
  ss->add_option("--window", window, "The local layers' window")->check(number_in(1, 1 << 20))->capture_default_str();
  ss->add_option("--positions", positions, "Cached positions")->delimiter(',')->check(number_in(1, 1 << 17));
  ss->add_option("--steps", steps, "Timed steps per point (best is kept)")->check(number_in(1, 1000))->capture_default_str();
  std::int64_t per_kind = 200;
  std::string svg = "recall.svg", reach_svg = "reach.svg";
  auto* sr = app.add_subcommand("recall",
                                "Probe accuracy and a token's influence against distance, plotted with the receptive field");
  add_json_option(*sr, json_path);
  sr->add_option("--probes-per-kind", per_kind, "Probes of each kind (0: all)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  sr->add_option("--svg", svg, "Where to write the probe plot ('' for none)")->check(output_file())->capture_default_str();
  sr->add_option("--reach-svg", reach_svg, "Where to write the influence plot ('' for none)")
      ->check(output_file())
      ->capture_default_str();
  std::string hybrid_model = "llama-3-8b";
  std::vector<std::int64_t> hybrid_contexts = {4096, 32768, 131072};
  std::int64_t hybrid_window = 1024, bytes_per_value = 2;
  auto* sh = app.add_subcommand("hybrids", "KV bytes of long-context hybrid stacks for a model you choose");
  add_json_option(*sh, json_path);
  sh->add_option("--model", hybrid_model, "A named model (llama-3-8b, llama-2-13b, ...), a config.json or a folder")
      ->capture_default_str();
  sh->add_option("--contexts", hybrid_contexts, "Sequence lengths")->delimiter(',')->check(number_in(1, 1 << 24));
  sh->add_option("--window", hybrid_window, "The local layers' window")->check(number_in(1, 1 << 24))->capture_default_str();
  sh->add_option("--bytes-per-value", bytes_per_value, "Bytes per cached value (2: bf16)")
      ->check(number_in(1, 8))
      ->capture_default_str();
  std::string gemma_model;
  std::vector<std::int64_t> gemma_contexts = {8192, 131072};
  auto* sgm = app.add_subcommand("gemma",
                                 "KV bytes of Gemma 2 and Gemma 3 (their published shapes and layer patterns) "
                                 "against every layer global");
  add_json_option(*sgm, json_path);
  sgm->add_option("--model", gemma_model, "A model folder or config.json instead (Gemma's, or any chapter 06 runs)");
  sgm->add_option("--contexts", gemma_contexts, "Sequence lengths")->delimiter(',')->check(number_in(1, 1 << 24));
  sgm->add_option("--bytes-per-value", bytes_per_value, "Bytes per cached value (2: bf16)")
      ->check(number_in(1, 8))
      ->capture_default_str();
  CommonOptions go;
  go.model = data_dir() + "/models/tiny-swa";
  auto* sg = app.add_subcommand(
      "generate",
      "Text through the ring cache (tiny-swa, tiny-hybrid, a Mistral/Ministral/Qwen2/Qwen3/Gemma folder, or a GGUF)");
  add_model_option(*sg, go);
  add_generation_options(*sg, go);
  add_json_option(*sg, go.json);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sm) return memory(model, contexts, json_path);
    if (*ss) return speed(dev, layers, window, positions, steps, json_path);
    if (*sr) return recall(per_kind, svg, reach_svg, json_path);
    if (*sh) return hybrids(hybrid_model, hybrid_contexts, hybrid_window, bytes_per_value, json_path);
    if (*sgm) return gemma(gemma_model, gemma_contexts, bytes_per_value, json_path);
    if (*sg) return generate(go);
    return headline(json_path);
  });
}
