// ch03_gqa: grouped-query attention. What it saves (KV bytes), what it costs (quality, measured
// on models converted without retraining), and what it buys (decode throughput by batch size).
//   ch03_gqa                 the headline
//   ch03_gqa memory          KV bytes per token and the largest batch for MHA, GQA and MQA
//   ch03_gqa throughput      measured decode throughput against batch size, with the prediction
//   ch03_gqa convert         tiny-mha mean-pooled to GQA/MQA against tiny-gqa/tiny-mqa
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/00_workload/workload.h"
#include "chapters/01_naive_decode/generate.h"
#include "chapters/03_gqa/gqa.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/cuda/backend.h"
#include "common/eval.h"
#include "common/models/batch_decode.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch03;
using nlohmann::json;

namespace {

// The shape the throughput sweep uses: big enough that weights and caches live in DRAM.
TransformerConfig sweep_shape(std::int64_t kv_heads) { return models::memory_bound_shape(8, kv_heads, 8192, 1 << 16); }

std::string variant_name(std::int64_t K, std::int64_t N) { return K == N ? "MHA" : K == 1 ? "MQA" : "GQA"; }

int memory(const CommonOptions& o, std::int64_t seq, double memory_gb) {
  const HfConfig hf = load_hf_config(o.model);
  // Mixtral and Qwen2-MoE keep Llama's cache: their experts change the FFN, not the cache.
  IL_CHECK(models::llama_family(hf.architecture()) || moe_llama_family(hf.architecture()), hf.path, ": architecture '",
           hf.architecture(),
           "' does not keep a Llama-style cache of 2 × L × K × H values per token; this table would be wrong for it",
           where_it_runs(hf.architecture()));
  const auto base = parse_transformer_config(hf);
  const std::int64_t N = base.num_heads;
  std::printf("%s: N = %lld query heads, H = %lld, L = %lld; S = %lld, f32 cache, %.1f GB budget\n\n", o.model.c_str(),
              static_cast<long long>(N), static_cast<long long>(base.head_dim), static_cast<long long>(base.num_layers),
              static_cast<long long>(seq), memory_gb);
  std::printf("%-5s %4s %16s %18s %12s %10s\n", "", "K", "KV bytes/token", "KV bytes/sequence", "weights", "max batch");
  json rows = json::array();
  for (std::int64_t K : {N, std::max<std::int64_t>(1, N / 4), std::int64_t{1}}) {
    auto c = base;
    c.num_kv_heads = K;
    // Chapter 00's memory arithmetic, at 4 bytes per value (f32).
    const std::int64_t per_token = c.kv_cache_bytes(1, 4), per_seq = c.kv_cache_bytes(seq, 4);
    const std::int64_t weights = ch00::param_bytes(c, 4), max_b = ch00::max_batch(c, seq, memory_gb * 1e9, 4);
    std::printf("%-5s %4lld %16lld %18lld %12lld %10lld\n", variant_name(K, N).c_str(), static_cast<long long>(K),
                static_cast<long long>(per_token), static_cast<long long>(per_seq), static_cast<long long>(weights),
                static_cast<long long>(max_b));
    rows.push_back({{"kv_heads", K},
                    {"kv_bytes_per_token", per_token},
                    {"kv_bytes_per_sequence", per_seq},
                    {"weight_bytes", weights},
                    {"max_batch", max_b}});
  }
  std::printf("\nThe cache shrinks by K/N; the weights barely move (only the k and v projections shrink).\n");
  if (!o.json.empty())
    write_json(o.json, {{"model", o.model}, {"seq", seq}, {"memory_gb", memory_gb}, {"rows", rows}}, {o.model});
  return 0;
}

int throughput(const CommonOptions& o, std::int64_t seq, std::vector<std::int64_t> batches, int steps) {
  const Device dev = o.resolved_device();
  const auto roof = metrics::measure_ceiling(dev);
  const auto shape = sweep_shape(16);
  // The largest batch of MHA caches must fit, or the sweep ends in an allocation failure minutes in.
  const std::int64_t max_b = *std::max_element(batches.begin(), batches.end());
  const double need = static_cast<double>(shape.num_parameters()) * 4 + static_cast<double>(max_b) *
                                                                            static_cast<double>(seq + steps + 1) *
                                                                            static_cast<double>(shape.kv_cache_bytes(1, 4));
  IL_CHECK(roof.memory_bytes <= 0 || need <= 0.8 * roof.memory_bytes, "B = ", max_b, " at context ", seq, " needs ",
           metrics::human_bytes(need), " of weights and KV caches; ", roof.name, " has ",
           metrics::human_bytes(roof.memory_bytes), " (use smaller --batches or --seq)");
  std::printf(
      "Decode throughput at context %lld, random weights (speed does not depend on their values), "
      "D = %lld, L = %lld, N = 16, H = 64, f32, %s\n",
      static_cast<long long>(seq), static_cast<long long>(shape.hidden_size), static_cast<long long>(shape.num_layers),
      device_name(dev).data());
  std::printf("measured: %s read from memory, %s (ridge %.1f FLOP/B)\n", metrics::describe(roof.read, "B").c_str(),
              metrics::describe(roof.compute, "FLOP").c_str(), roof.ridge());
  std::printf(
      "memory model = B × bandwidth / (weights + B × cache); roofline = B / max(bytes/bandwidth, FLOPs/peak);\n"
      "bandwidth = the read ceiling of each row's kind: a streaming read over as many bytes as its step reads\n\n");
  std::printf("%-4s %3s %5s %11s %13s %10s %9s %6s %-16s %9s %8s\n", "", "K", "B", "tokens/s", "memory model", "roofline",
              "GB/s", "%", "of ceiling", "FLOP/B", "vs MHA");
  json rows = json::array();
  metrics::CeilingLegend legend;
  std::map<std::int64_t, double> mha;
  for (std::int64_t K : {16, 4, 1}) {
    const models::Llama m = models::random_llama(sweep_shape(K), 1).to(dev, DType::F32);
    for (std::int64_t B : batches) {
      const auto p = models::measure_decode(m, B, seq, steps);
      const auto read = metrics::read_ceiling_for(roof, p.bytes_per_step);
      const double bw = read.bytes_per_s();
      if (K == 16) mha[B] = p.tokens_per_s();
      std::printf("%-4s %3lld %5lld %11.1f %13.1f %10.1f %9.2f %5.0f%% %-16s %9.2f %7.2f×\n", variant_name(K, 16).c_str(),
                  static_cast<long long>(K), static_cast<long long>(B), p.tokens_per_s(), p.memory_bound_tokens_per_s(bw),
                  p.roofline_tokens_per_s(bw, roof.flops_per_s), p.achieved_bytes_per_s() / 1e9,
                  legend.percent(variant_name(K, 16) + " B = " + std::to_string(B), p.achieved_bytes_per_s(), read),
                  read.kind.c_str(), p.flops_per_step / p.bytes_per_step, p.tokens_per_s() / mha[B]);
      json row = to_json(p, read, roof.flops_per_s);
      row["kv_heads"] = K;
      rows.push_back(row);
    }
    std::printf("\n");
  }
  legend.print("");
  std::printf(
      "\nGQA's cache is 4× and MQA's 16× smaller than MHA's. Their speed-up approaches that only where the cache\n"
      "dominates the bytes of a step (large B, long context) and the step is still memory-bound: once B×FLOP/B\n"
      "passes the ridge, the matmuls are compute-bound and fewer KV bytes no longer buy time.\n");
  if (!o.json.empty())
    write_json(o.json, {{"device", device_name(dev)}, {"seq", seq}, {"ceiling", metrics::to_json(roof)}, {"rows", rows}});
  return 0;
}

int convert(const CommonOptions& o, std::int64_t windows, std::int64_t per_kind) {
  const std::string data = data_dir();
  const models::Llama mha = models::load_llama(data + "/models/tiny-mha");
  const std::vector<std::pair<std::string, models::Llama>> models = {
      {"tiny-mha (K = 8, trained)", mha},
      {"tiny-mha mean-pooled to K = 2", mean_pool_kv_heads(mha, 2)},
      {"tiny-gqa (K = 2, trained)", models::load_llama(data + "/models/tiny-gqa")},
      {"tiny-mha mean-pooled to K = 1", mean_pool_kv_heads(mha, 1)},
      {"tiny-mqa (K = 1, trained)", models::load_llama(data + "/models/tiny-mqa")}};
  std::printf("Validation perplexity (%s windows of 512) and probe accuracy (%lld per kind), no retraining\n\n",
              windows ? std::to_string(windows).c_str() : "all", static_cast<long long>(per_kind));
  std::vector<eval::Scored> rows;
  for (const auto& [name, m] : models)
    rows.push_back({name, m.config.kv_cache_bytes(1, 4),
                    [&m](const std::vector<std::int32_t>& t) { return ch01::forward(m, t, true); }});
  const json out = eval::quality_table(rows, data, windows, per_kind);
  if (!o.json.empty())
    write_json(o.json, {{"rows", out}, {"probes_per_kind", per_kind}},
               {data + "/models/tiny-mha", data + "/models/tiny-gqa", data + "/models/tiny-mqa"});
  return 0;
}

// The bare run's two measurements against K: the cache a sequence keeps (the formula
// 2·L·K·H·S·4 bytes as the line, each variant a point) and the decode throughput beside the
// roofline's prediction.
void plot_headline(const json& rows, const TransformerConfig& shape, std::int64_t context, const std::string& path) {
  plot::Figure bytes, speed;
  bytes.title = "KV cache per sequence against KV heads (random 16-head model, context " + std::to_string(context) + ")";
  speed.title = "Decode throughput against KV heads (B = 4, context " + std::to_string(context) + ", measured here)";
  bytes.x.label = speed.x.label = "KV heads K (of N = 16 query heads)";
  bytes.x.log = speed.x.log = true;
  bytes.x.min = speed.x.min = 0.8, bytes.x.max = speed.x.max = 20;
  bytes.y.label = "KV bytes per sequence (MB)";
  speed.y.label = "tokens per second";
  const double per_head = static_cast<double>(shape.kv_cache_bytes(context, 4)) / static_cast<double>(shape.num_kv_heads);
  plot::Series formula = plot::curve("2·L·K·H·S × 4 bytes", 1, 16, 32, true, [&](double K) { return K * per_head / 1e6; });
  formula.dashed = true;
  plot::Series cache, measured, roofline;
  cache.label = "each variant";
  measured.label = "measured (best of 3 steps)";
  roofline.label = "roofline: max(bytes / read ceiling, FLOPs / peak)";
  cache.line = false, cache.label_points = measured.markers = measured.label_points = true;
  roofline.dashed = roofline.markers = true;
  for (const json& r : rows) {
    const double K = r["kv_heads"].get<double>();
    const std::string name = variant_name(r["kv_heads"].get<std::int64_t>(), 16);
    cache.x.push_back(K), cache.y.push_back(K * per_head / 1e6), cache.point_labels.push_back(name);
    measured.x.push_back(K), measured.y.push_back(r["tokens_per_s"].get<double>()), measured.point_labels.push_back(name);
    roofline.x.push_back(K), roofline.y.push_back(r["roofline_tokens_per_s"].get<double>());
  }
  bytes.series = {formula, cache};
  speed.series = {measured, roofline};
  bytes.height = speed.height = 420;
  plot::save_svg(std::vector<plot::Figure>{bytes, speed}, path);
  std::printf("  wrote %s\n", path.c_str());
}

int headline(const std::string& json_path, const std::string& svg) {
  const std::string data = data_dir();
  std::printf("Grouped-query attention (lecture: 分组查询注意力 GQA): N query heads share K KV heads\n");
  for (const char* name : {"tiny-mha", "tiny-gqa", "tiny-mqa"}) {
    const auto c = parse_transformer_config(load_hf_config(data + "/models/" + name));
    std::printf("  %-9s N = %lld, K = %lld: %6lld KV bytes per token (f32), %lld weight bytes\n", name,
                static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
                static_cast<long long>(c.kv_cache_bytes(1, 4)), static_cast<long long>(c.num_parameters() * 4));
  }
  // The ceilings, measured more briefly than `throughput` does (a 1024³ GEMM, 3 runs each), so
  // that a bare run takes seconds. Each row's GB/s is compared with the read rate over as many
  // bytes as its step reads: in cache, partly or from memory, whatever its working set is here.
  const metrics::Ceiling roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf("  measured here: %s read from memory, %s (f32 GEMM 1024³)\n", metrics::describe(roof.read, "B").c_str(),
              metrics::describe(roof.compute, "FLOP").c_str());
  json rows = json::array();
  double mha = 0;
  for (std::int64_t K : {16, 4, 1}) {
    // The sweep's layer shape with 4 layers instead of 8 (weights and the four caches are
    // 0.2-0.4 GB in f32), and half the time to build.
    TransformerConfig shape = sweep_shape(K);
    shape.num_layers = 4;
    const models::Llama m = models::random_llama(shape, 1);
    const auto p = models::measure_decode(m, 4, 1024, 3);
    const auto read = metrics::read_ceiling_for(roof, p.bytes_per_step);
    if (K == 16) mha = p.tokens_per_s();
    std::printf(
        "  %s (K = %2lld), B = 4 at context 1024: %6.1f tokens/s measured (%.2f× MHA), %6.1f by the roofline, "
        "%s\n",
        variant_name(K, 16).c_str(), static_cast<long long>(K), p.tokens_per_s(), p.tokens_per_s() / mha,
        p.roofline_tokens_per_s(read.bytes_per_s(), roof.flops_per_s),
        metrics::against(p.achieved_bytes_per_s(), read).c_str());
    json row = to_json(p, read, roof.flops_per_s);
    row["kv_heads"] = K, row["layers"] = shape.num_layers, row["context"] = 1024;
    rows.push_back(row);
  }
  std::printf("  (random 16-head models, 4 layers, the best of 3 decode steps; the full sweep: ch03_gqa throughput)\n");
  std::printf("  more: ch03_gqa memory | throughput | convert\n");
  if (!svg.empty()) {
    TransformerConfig shape = sweep_shape(16);
    shape.num_layers = 4;
    plot_headline(rows, shape, 1024, svg);
  }
  if (!json_path.empty()) write_json(json_path, {{"ceiling", metrics::to_json(roof)}, {"decode", rows}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 03: grouped-query and multi-query attention", "ch03_gqa"};
  CommonOptions o;
  add_json_option(app, o.json);  // the bare run's
  std::string svg;
  app.add_option("--svg", svg, "Also plot KV bytes and decode throughput against K as SVG")->check(output_file());
  help_footer(app,
              "the KV bytes per token of tiny-mha, tiny-gqa and tiny-mqa, then MHA, GQA and MQA decoding at B = 4, "
              "context 1024 (random 4-layer models): tokens/s beside the roofline and GB/s against the read ceiling, "
              "both measured in the same run",
              "chapters/03_gqa/README.md", "分组查询注意力（GQA）");
  std::int64_t seq = 1024, windows = 0, per_kind = 200;
  double memory_gb = 80;
  int steps = 3;
  std::vector<std::int64_t> batches = {1, 2, 4, 8, 16, 32, 64};
  auto* sm = app.add_subcommand("memory", "KV bytes per token and the largest batch for MHA, GQA and MQA");
  add_model_option(*sm, o);
  add_json_option(*sm, o.json);
  sm->add_option("--seq", seq, "Context length S")->check(number_in(1, 1 << 24))->capture_default_str();
  sm->add_option("--memory-gb", memory_gb, "Memory budget in GB")->check(number_in(1e-3, 1e6))->capture_default_str();
  auto* st = app.add_subcommand("throughput", "Measured decode throughput against batch size, with the prediction");
  add_device_option(*st, o);
  add_json_option(*st, o.json);
  st->add_option("--seq", seq, "Context length")->check(number_in(1, 1 << 16))->capture_default_str();
  st->add_option("--batches", batches, "Batch sizes")->delimiter(',')->check(number_in(1, 4096));
  st->add_option("--steps", steps, "Timed steps per point (best is kept)")->check(number_in(1, 1000))->capture_default_str();
  auto* sc = app.add_subcommand("convert", "tiny-mha mean-pooled to GQA/MQA against models trained that way");
  add_json_option(*sc, o.json);
  add_quality_options(*sc, windows, per_kind);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sm) return memory(o, seq, memory_gb);
    if (*st) return throughput(o, seq, batches, steps);
    if (*sc) return convert(o, windows, per_kind);
    return headline(o.json, svg);
  });
}
