// ch05_cla: cross-layer attention. What sharing K and V between adjacent layers saves (cache
// bytes, parameters), what it buys (more sequences in a memory budget, so more tokens/s), and
// what it costs (quality).
//   ch05_cla              the headline
//   ch05_cla memory       KV bytes per token and the largest batch in a budget, by sharing factor
//   ch05_cla throughput   decode measured at a fixed memory budget: each s at the batch that fits
//   ch05_cla quality      tiny-cla's perplexity and probes beside tiny-mha, tiny-gqa, tiny-mqa
//   ch05_cla recipe       Character.AI's MQA + local + cross-layer recipe as KV arithmetic
//   ch05_cla generate     text through the shared cache
#include <algorithm>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "chapters/00_workload/workload.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/models/cla.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::models::cla;
using nlohmann::json;

namespace {

using ll = long long;

// The shape the throughput measurement uses (chapter 03's sweep shape, 4 layers): weights and
// caches far beyond any on-chip cache.
TransformerConfig sweep_shape(std::int64_t layers) { return models::memory_bound_shape(layers, 16, 8192, 1 << 16); }

// The largest batch whose caches fit in `budget` bytes beside nothing else (the budget is for caches).
std::int64_t batch_in(double budget, std::int64_t per_sequence) {
  return static_cast<std::int64_t>(budget / static_cast<double>(per_sequence));
}

// Decode at a fixed memory budget for caches: every sharing factor at the largest batch it fits.
json budget_sweep(const metrics::Ceiling& roof, const TransformerConfig& shape, std::int64_t seq, double budget,
                  const std::vector<std::int64_t>& shares, int steps, Device dev, bool indent) {
  json rows = json::array();
  double base = 0;
  IL_CHECK(seq > steps + 1, "the context (", seq, ") must exceed the timed steps + 1 (", steps + 1, ")");
  const models::Llama model = models::random_llama(shape, 1).to(dev, DType::F32);  // one draw; share_kv shares its weights
  for (std::int64_t s : shares) {
    const ClaModel m = share_kv(model, s);
    // Every cache holds `seq` positions: decode is timed at context seq - steps - 1, so the last
    // timed step fills it.
    const std::int64_t per_seq = kv_cache_bytes(shape, m.layout, seq, 4);
    const std::int64_t B = batch_in(budget, per_seq);
    IL_CHECK(B >= 1, "a budget of ", metrics::human_bytes(budget), " holds no cache of ", metrics::human_bytes(per_seq),
             " (s = ", s, ", context ", seq, "): raise --memory-mb or lower --seq");
    const auto p = measure_decode(m, B, seq - steps - 1, steps);
    // The read ceiling of the step's own kind: a streaming read over as many bytes as it reads.
    const auto read = metrics::read_ceiling_for(roof, p.bytes_per_step);
    if (rows.empty()) base = p.tokens_per_s();
    std::printf("%ss = %lld: %3lld storage layers, B = %3lld fit: %8.1f tokens/s (%.2f× s = %lld), roofline %8.1f, %s\n",
                indent ? "  " : "", static_cast<ll>(s), static_cast<ll>(m.layout.storage_layers()), static_cast<ll>(B),
                p.tokens_per_s(), p.tokens_per_s() / base, static_cast<ll>(shares.front()),
                p.roofline_tokens_per_s(read.bytes_per_s(), roof.flops_per_s),
                metrics::against(p.achieved_bytes_per_s(), read).c_str());
    std::fflush(stdout);
    json row = to_json(p, read, roof.flops_per_s);
    row["share_factor"] = s, row["storage_layers"] = m.layout.storage_layers(), row["cache_bytes_per_sequence"] = per_seq;
    rows.push_back(row);
  }
  return rows;
}

// budget_sweep()'s rows against the sharing factor: the sequences whose caches fit the budget
// (each s stores ceil(L/s) layers: B = budget / (ceil(L/s) × one layer's cache)), and the decode
// throughput at that batch beside the roofline's prediction.
void plot_sweep(const json& rows, std::int64_t layers, double budget, std::int64_t seq, const std::string& path) {
  plot::Figure fit, speed;
  const std::string setting = metrics::human_bytes(budget) + " for caches of " + std::to_string(seq) + " positions";
  fit.title = "Sequences that fit against the sharing factor (" + setting + ")";
  speed.title = "Decode throughput at the batch that fits (" + std::to_string(layers) + " layers, measured here)";
  fit.x.label = speed.x.label = "sharing factor s (layers per stored K/V)";
  fit.y.label = "sequences that fit (batch B)";
  speed.y.label = "tokens per second";
  plot::Series formula, got, measured, roofline;
  formula.label = "budget / (ceil(L/s) × one layer's cache)";
  got.label = "batch the run used";
  measured.label = "measured (best of the timed steps)";
  roofline.label = "roofline: max(bytes / read ceiling, FLOPs / peak)";
  formula.dashed = roofline.dashed = true;
  got.line = false, got.markers = measured.markers = roofline.markers = true;
  double per_layer = 0;
  for (const json& r : rows) {
    const double s = r["share_factor"].get<double>(), B = r["batch"].get<double>();
    per_layer = r["cache_bytes_per_sequence"].get<double>() / r["storage_layers"].get<double>();
    got.x.push_back(s), got.y.push_back(B);
    measured.x.push_back(s), measured.y.push_back(r["tokens_per_s"].get<double>());
    roofline.x.push_back(s), roofline.y.push_back(r["roofline_tokens_per_s"].get<double>());
  }
  for (std::int64_t s = 1; s <= std::max<std::int64_t>(1, static_cast<std::int64_t>(got.x.empty() ? 1 : got.x.back()));
       ++s) {
    const double stored = static_cast<double>((layers + s - 1) / s);
    formula.x.push_back(static_cast<double>(s)), formula.y.push_back(std::floor(budget / (stored * per_layer)));
  }
  fit.series = {formula, got};
  speed.series = {measured, roofline};
  fit.height = speed.height = 420;
  plot::save_svg(std::vector<plot::Figure>{fit, speed}, path);
  std::printf("wrote %s\n", path.c_str());
}

int memory(const std::string& model, std::int64_t seq, double memory_gb, std::int64_t bytes_per_value,
           const std::string& json_path) {
  const TransformerConfig base = ch00::find_model(model);
  const std::int64_t N = base.num_heads, L = base.num_layers;
  std::printf(
      "%s: L = %lld, N = %lld, K = %lld, H = %lld; S = %lld, %lld bytes per value, %.1f GB for weights and caches\n\n",
      model.c_str(), static_cast<ll>(L), static_cast<ll>(N), static_cast<ll>(base.num_kv_heads),
      static_cast<ll>(base.head_dim), static_cast<ll>(seq), static_cast<ll>(bytes_per_value), memory_gb);
  std::printf("%4s %4s %8s %15s %18s %16s %10s\n", "K", "s", "storing", "KV bytes/token", "KV bytes/sequence",
              "weight bytes", "max batch");
  json rows = json::array();
  std::vector<std::int64_t> heads = {N};
  if (base.num_kv_heads != N) heads.push_back(base.num_kv_heads);
  if (heads.back() != 1) heads.push_back(1);
  for (std::int64_t K : heads) {
    TransformerConfig c = base;
    c.num_kv_heads = K;
    for (std::int64_t s : {1, 2, 3, 4}) {
      if (s > L) break;
      const ClaLayout layout = ClaLayout::groups_of(L, s);
      const std::int64_t per_token = kv_cache_bytes(c, layout, 1, bytes_per_value);
      const std::int64_t per_seq = kv_cache_bytes(c, layout, seq, bytes_per_value);
      const std::int64_t weights = num_parameters(c, layout) * bytes_per_value;
      const double left = memory_gb * 1e9 - static_cast<double>(weights);
      const std::int64_t max_b = left < 0 ? -1 : batch_in(left, per_seq);
      std::printf("%4lld %4lld %8lld %15lld %18lld %16lld %10s\n", static_cast<ll>(K), static_cast<ll>(s),
                  static_cast<ll>(layout.storage_layers()), static_cast<ll>(per_token), static_cast<ll>(per_seq),
                  static_cast<ll>(weights), max_b < 0 ? "no fit" : std::to_string(max_b).c_str());
      rows.push_back({{"kv_heads", K},
                      {"share_factor", s},
                      {"storage_layers", layout.storage_layers()},
                      {"kv_bytes_per_token", per_token},
                      {"kv_bytes_per_sequence", per_seq},
                      {"weight_bytes", weights},
                      {"max_batch", max_b}});
    }
  }
  std::printf(
      "\nThe cache shrinks by ceil(L/s)/L and composes with GQA's K/N; the weights lose only the sharing layers'\n"
      "K and V projections. What a decode step reads per sequence does not shrink: every layer still attends.\n");
  if (!json_path.empty())
    write_json(
        json_path,
        {{"model", model}, {"seq", seq}, {"memory_gb", memory_gb}, {"bytes_per_value", bytes_per_value}, {"rows", rows}});
  return 0;
}

int throughput(const ModelOptions& o, std::int64_t seq, double memory_mb, std::vector<std::int64_t> shares, int layers,
               int steps, const std::string& json_path, const std::string& svg) {
  const Device dev = o.resolved_device();
  const auto roof = metrics::measure_ceiling(dev);
  const TransformerConfig shape = sweep_shape(layers);
  std::sort(shares.begin(), shares.end());
  std::printf(
      "Decode with %.0f MiB for KV caches of %lld positions, random weights (speed does not depend on their values): "
      "D = 1024, L = %d, N = K = 16, H = 64, f32, %s\n",
      memory_mb, static_cast<ll>(seq), layers, device_name(dev).data());
  std::printf("measured: %s read from memory, %s (ridge %.1f FLOP/B)\n\n", metrics::describe(roof.read, "B").c_str(),
              metrics::describe(roof.compute, "FLOP").c_str(), roof.ridge());
  const json rows = budget_sweep(roof, shape, seq, memory_mb * (1 << 20), shares, steps, dev, false);
  std::printf(
      "\nMore sequences fit, and one weight read serves all of them; each sequence's step still reads every\n"
      "layer's attention over its cached positions, so the gain shrinks as the cache reads dominate a step.\n");
  if (!svg.empty()) plot_sweep(rows, layers, memory_mb * (1 << 20), seq, svg);
  if (!json_path.empty())
    write_json(json_path, {{"device", device_name(dev)},
                           {"seq", seq},
                           {"memory_bytes", memory_mb * (1 << 20)},
                           {"ceiling", metrics::to_json(roof)},
                           {"rows", rows}});
  return 0;
}

// The bundled models by name, and tiny-mha with its K and V shared by 2 layers without retraining.
std::vector<std::pair<std::string, ClaModel>> zoo(const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, ClaModel>> out;
  for (const std::string& n : names) out.emplace_back(n, load_cla(data_dir() + "/models/" + n));
  out.emplace_back("tiny-mha, K/V shared untrained", share_kv(load_cla(data_dir() + "/models/tiny-mha").base, 2));
  return out;
}

std::vector<eval::Scored> zoo_rows(const std::vector<std::pair<std::string, ClaModel>>& models) {
  std::vector<eval::Scored> rows;
  for (const auto& [name, m] : models) {
    rows.push_back({name, kv_cache_bytes(m.config(), m.layout, 1, 4), [&m](const std::vector<std::int32_t>& t) {
                      SharedKVCache cache(m.config(), m.layout, static_cast<std::int64_t>(t.size()));
                      return forward_cached(m, cache, t, true);
                    }});
  }
  return rows;
}

int quality(std::int64_t windows, std::int64_t per_kind, const std::string& json_path) {
  const auto models = zoo({"tiny-mha", "tiny-gqa", "tiny-mqa", "tiny-cla"});
  std::printf(
      "Validation perplexity (%s windows of 512) and probe accuracy (%lld per kind); the last row is tiny-mha\n"
      "with layers 1 and 3 reading layers 0 and 2's K and V, without retraining\n\n",
      windows ? std::to_string(windows).c_str() : "all", static_cast<ll>(per_kind));
  const json out = eval::quality_table(zoo_rows(models), data_dir(), windows, per_kind);
  if (!json_path.empty()) write_json(json_path, {{"rows", out}, {"probes_per_kind", per_kind}});
  return 0;
}

int recipe(const std::string& model, std::int64_t seq, std::int64_t window, std::int64_t global_every,
           std::int64_t share_factor, std::int64_t bytes_per_value, const std::string& json_path) {
  const TransformerConfig c = ch00::find_model(model);
  std::printf(
      "Character.AI's recipe (\"Optimizing AI Inference at Character.AI\", 2024) on %s: L = %lld, N = %lld, "
      "K = %lld, H = %lld; one sequence of %lld tokens, %lld bytes per value\n\n",
      model.c_str(), static_cast<ll>(c.num_layers), static_cast<ll>(c.num_heads), static_cast<ll>(c.num_kv_heads),
      static_cast<ll>(c.head_dim), static_cast<ll>(seq), static_cast<ll>(bytes_per_value));
  const auto steps = character_ai_recipe(c, seq, window, global_every, share_factor, bytes_per_value);
  json rows = json::array();
  for (const RecipeStep& s : steps) {
    std::printf("  %-92s %12s  %7.1f× smaller\n", s.what.c_str(), metrics::human_bytes(static_cast<double>(s.bytes)).c_str(),
                static_cast<double>(steps.front().bytes) / static_cast<double>(s.bytes));
    rows.push_back({{"step", s.what}, {"bytes", s.bytes}});
  }
  std::printf(
      "\nEach step is the one formula, S × K × H × (layers that store) × 2 × bytes, with a local layer's S capped\n"
      "at its window. Character.AI report more than 20× from the three together against the GQA models most\n"
      "open checkpoints are (their MQA step alone: 8×, K = 8 → 1); how much more depends on S against W.\n");
  if (!json_path.empty())
    write_json(json_path, {{"model", model},
                           {"seq", seq},
                           {"window", window},
                           {"global_every", global_every},
                           {"share_factor", share_factor},
                           {"bytes_per_value", bytes_per_value},
                           {"steps", rows}});
  return 0;
}

int generate(const CommonOptions& o) {
  const ClaModel m = load_cla(o.model);
  const auto tok = Tokenizer::for_model(o.model);
  const auto prompt = tok->encode(o.prompt);
  const auto& c = m.config();
  models::check_context(m.base, prompt.size(), o.max_new_tokens);
  const std::int64_t S = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
  const SharedKVCache cache(c, m.layout, S);
  std::printf("%s: %s; shared cache for S = %lld: %s = %lld bytes (every layer storing: %lld)\n\n", m.base.source.c_str(),
              m.layout.describe().c_str(), static_cast<ll>(S), cache.storage().layout().c_str(),
              static_cast<ll>(cache.bytes()), static_cast<ll>(c.kv_cache_bytes(S, 4)));
  Sampler sampler(o.sampling(*tok, c.vocab_size));
  std::optional<TextStream> stream;
  stream.emplace(*tok, prompt);
  const models::Generation g = generate_cached(m, prompt, o.max_new_tokens, sampler, c.eos_token_ids,
                                               [&](const models::Generation& gen) { stream->print(gen.tokens); });
  std::printf("\n\n%zu tokens: time to first token %.2f ms, %.2f ms per later token, %.1f tokens/s\n", g.generated.size(),
              g.ttft_s() * 1e3, g.tpot_s() * 1e3, g.tokens_per_s());
  if (!o.json.empty())
    write_json(o.json,
               {{"model", o.model},
                {"prompt", o.prompt},
                {"layout", m.layout.describe()},
                {"cache_bytes", cache.bytes()},
                {"generated", g.generated},
                {"ttft_s", g.ttft_s()},
                {"tpot_s", g.tpot_s()},
                {"tokens_per_s", g.tokens_per_s()}},
               {o.model});
  return 0;
}

int headline(const std::string& json_path, const std::string& svg) {
  const std::string data = data_dir();
  std::printf("Cross-layer attention (lecture: 跨层注意力 CLA): s adjacent layers share one set of keys and values\n");
  json models = json::array();
  const auto bundled = zoo({"tiny-mha", "tiny-cla"});
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& [name, m] = bundled[i];
    const std::int64_t per_token = kv_cache_bytes(m.config(), m.layout, 1, 4), params = num_parameters(m.config(), m.layout);
    std::printf("  %-8s s = %lld (%s): %5lld KV bytes per token (f32), %s at 512 tokens, %lld parameters\n", name.c_str(),
                static_cast<ll>(m.layout.share_factor), m.layout.describe().c_str(), static_cast<ll>(per_token),
                metrics::human_bytes(static_cast<double>(per_token * 512)).c_str(), static_cast<ll>(params));
    models.push_back({{"model", name},
                      {"share_factor", m.layout.share_factor},
                      {"kv_bytes_per_token", per_token},
                      {"parameters", params}});
  }
  // A real model's size: Llama 2 13B (the lecture's GQA example) in bf16 on one 80 GB accelerator.
  const TransformerConfig big = ch00::find_model("llama-2-13b");
  std::printf("  Llama 2 13B, bf16, S = 4096, 80 GB:");
  json big_rows = json::array();
  for (std::int64_t s : {1, 2, 4}) {
    const ClaLayout layout = ClaLayout::groups_of(big.num_layers, s);
    const std::int64_t per_seq = kv_cache_bytes(big, layout, 4096, 2), weights = num_parameters(big, layout) * 2;
    const std::int64_t B = batch_in(80e9 - static_cast<double>(weights), per_seq);
    std::printf("%s s = %lld: %s per sequence, B = %lld fit", s == 1 ? "" : ";", static_cast<ll>(s),
                metrics::human_bytes(static_cast<double>(per_seq)).c_str(), static_cast<ll>(B));
    big_rows.push_back(
        {{"share_factor", s}, {"kv_bytes_per_sequence", per_seq}, {"weight_bytes", weights}, {"max_batch", B}});
  }
  std::printf("\n");
  // As chapter 03's bare run: 3 runs, a 1024³ GEMM, so that a bare run takes seconds.
  const metrics::Ceiling roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf("  measured here: %s read from memory, %s (f32 GEMM 1024³)\n", metrics::describe(roof.read, "B").c_str(),
              metrics::describe(roof.compute, "FLOP").c_str());
  std::printf("  decode with 128 MiB for caches of 1024 positions (random 16-head models, 4 layers, best of 3 steps):\n");
  const json sweep = budget_sweep(roof, sweep_shape(4), 1024, 128.0 * (1 << 20), {1, 2, 4}, 3, Device::CPU, true);
  // Quality, briefly: 4 validation windows (ch05_cla quality runs them all, with the probes).
  const auto tok = Tokenizer::for_model(data + "/models/tiny-cla");
  const auto val = eval::tokenize_documents(*tok, data + "/corpus/val.txt");
  std::printf("  validation perplexity (4 windows of 512):");
  json quality = json::array();
  for (const eval::Scored& r : zoo_rows(bundled)) {
    const auto ppl = eval::perplexity(r.logits, val, 512, 4, r.name);
    std::printf("%s %s %.3f", quality.empty() ? "" : ",", r.name.c_str(), ppl.ppl);
    quality.push_back({{"model", r.name}, {"val_ppl", ppl.ppl}, {"val_tokens", ppl.tokens}});
  }
  std::printf("\n  more: ch05_cla memory | throughput | quality | recipe | generate\n");
  if (!svg.empty()) plot_sweep(sweep, 4, 128.0 * (1 << 20), 1024, svg);
  if (!json_path.empty())
    write_json(json_path, {{"models", models},
                           {"llama_2_13b", big_rows},
                           {"ceiling", metrics::to_json(roof)},
                           {"decode_at_fixed_memory", sweep},
                           {"quality", quality}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 05: cross-layer attention", "ch05_cla"};
  std::string json_path;
  add_json_option(app, json_path);  // the bare run's
  std::string svg;
  app.add_option("--svg", svg, "Also plot the sequences that fit and the throughput against s as SVG")->check(output_file());
  help_footer(app,
              "tiny-cla's cache bytes per token against tiny-mha's, the batch a shared cache fits for Llama 2 13B, "
              "then decode measured at a fixed memory budget for caches (s = 1, 2, 4 at the batch each fits: tokens/s "
              "beside the roofline and GB/s against the read ceiling), and the perplexity of tiny-mha, tiny-cla and "
              "tiny-mha shared without retraining",
              "chapters/05_cla/README.md", "跨层注意力（CLA）");
  std::string model = "llama-2-13b";
  std::int64_t seq = 4096, bytes_per_value = 2, windows = 0, per_kind = 200, window = 1024, global_every = 6, share = 2;
  double memory_gb = 80, memory_mb = 128;
  int steps = 3, layers = 4;
  std::vector<std::int64_t> shares = {1, 2, 4};
  auto* sm = app.add_subcommand("memory", "KV bytes per token and the largest batch in a budget, by sharing factor");
  auto* sr = app.add_subcommand("recipe", "Character.AI's MQA + local + cross-layer recipe as KV arithmetic");
  std::string recipe_model = "llama-3-8b";
  std::int64_t recipe_seq = 32768;
  for (CLI::App* sub : {sm, sr}) {
    const bool r = sub == sr;
    add_json_option(*sub, json_path);
    sub->add_option("--model", r ? recipe_model : model,
                    "A named model (llama-2-7b, llama-2-13b, llama-3-8b, ...), a config.json or a folder")
        ->capture_default_str();
    sub->add_option("--seq", r ? recipe_seq : seq, "Context length S")->check(number_in(1, 1 << 24))->capture_default_str();
    sub->add_option("--bytes-per-value", bytes_per_value, "Bytes per cached value and weight (2: bf16)")
        ->check(number_in(1, 8))
        ->capture_default_str();
  }
  sm->add_option("--memory-gb", memory_gb, "Memory for weights and caches, in GB")
      ->check(number_in(1e-3, 1e6))
      ->capture_default_str();
  sr->add_option("--window", window, "Local layers' window W")->check(number_in(1, 1 << 24))->capture_default_str();
  sr->add_option("--global-every", global_every, "One global layer in this many")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  sr->add_option("--share", share, "Layers sharing one K/V")->check(number_in(1, 4096))->capture_default_str();
  ModelOptions dev;
  std::int64_t tp_seq = 1024;
  auto* st = app.add_subcommand("throughput", "Decode measured at a fixed memory budget: each s at the batch that fits");
  add_device_option(*st, dev);
  add_json_option(*st, json_path);
  st->add_option("--svg", svg, "Also plot the sequences that fit and the throughput against s as SVG")->check(output_file());
  st->add_option("--seq", tp_seq, "Context length")->check(number_in(1, 1 << 16))->capture_default_str();
  st->add_option("--memory-mb", memory_mb, "Memory for the KV caches, in MiB")
      ->check(number_in(1, 1 << 24))
      ->capture_default_str();
  st->add_option("--shares", shares, "Sharing factors")->delimiter(',')->check(number_in(1, 64));
  st->add_option("--layers", layers, "Layers of the random model")->check(number_in(1, 64))->capture_default_str();
  st->add_option("--steps", steps, "Timed steps per point (best is kept)")->check(number_in(1, 1000))->capture_default_str();
  auto* sq = app.add_subcommand("quality", "tiny-cla's perplexity and probes beside tiny-mha, tiny-gqa and tiny-mqa");
  add_json_option(*sq, json_path);
  add_quality_options(*sq, windows, per_kind);
  CommonOptions go;
  go.model = data_dir() + "/models/tiny-cla";
  auto* sg = app.add_subcommand("generate", "Text through the shared cache (tiny-cla, or any Llama-family folder as s = 1)");
  add_model_option(*sg, go);
  add_generation_options(*sg, go);
  add_json_option(*sg, go.json);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sm) return memory(model, seq, memory_gb, bytes_per_value, json_path);
    if (*sr) return recipe(recipe_model, recipe_seq, window, global_every, share, bytes_per_value, json_path);
    if (*st) return throughput(dev, tp_seq, memory_mb, shares, layers, steps, json_path, svg);
    if (*sq) return quality(windows, per_kind, json_path);
    if (*sg) return generate(go);
    return headline(json_path, svg);
  });
}
