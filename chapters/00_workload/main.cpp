// ch00_workload: the lecture's first technical section as a calculator you can run.
//   ch00_workload                       the headline: why decoding is memory-bound
//   ch00_workload intensity             arithmetic intensity of matmul, MLP and attention
//   ch00_workload memory                KV-cache and parameter bytes; the largest batch that fits
//   ch00_workload latency               the memory-bound latency/throughput model over batch sizes
//   ch00_workload roofline              this machine's measured roofline, with presets and points
//   ch00_workload lecture               every number in the lecture, recomputed
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "chapters/00_workload/lecture.h"
#include "chapters/00_workload/roofline.h"
#include "chapters/00_workload/workload.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/cuda/backend.h"

using namespace inferlab;
using namespace inferlab::ch00;
using nlohmann::json;

namespace {

struct Options {
  CommonOptions common;
  std::int64_t batch = 1, seq = 1024, kv_heads = 0;
  std::string dtype = "bf16", accelerator = "h100", svg, markdown;
  double memory_gb = 0;
  std::vector<std::int64_t> batches = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<std::string> points;
};

std::int64_t bytes_per_value(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "fp8" || dtype == "int8") return 1;
  fail("unknown --dtype '", dtype, "' (use f32, bf16, f16, fp8 or int8)");
}

TransformerConfig model_of(const Options& o) {
  TransformerConfig c = find_model(o.common.model);
  if (o.kv_heads > 0) {
    IL_CHECK(c.num_heads % o.kv_heads == 0, "--kv-heads ", o.kv_heads, " must divide the ", c.num_heads, " query heads");
    c.num_kv_heads = o.kv_heads;
  }
  return c;
}

metrics::Ceiling accelerator_of(const Options& o) {
  metrics::Ceiling a = find_accelerator(o.accelerator);
  if (o.memory_gb > 0) a.memory_bytes = o.memory_gb * 1e9;
  return a;
}

void emit_json(const Options& o, const json& j) {
  if (!o.common.json.empty()) write_json(o.common.json, j, {o.common.model});
}

// ---------------------------------------------------------------------------------------------
int intensity(const Options& o) {
  const TransformerConfig c = model_of(o);
  const auto acc = accelerator_of(o);
  const double w = static_cast<double>(bytes_per_value(o.dtype)), B = static_cast<double>(o.batch),
               S = static_cast<double>(o.seq);
  const double D = c.hidden_size, F = c.intermediate_size;
  std::printf("Arithmetic intensity (FLOPs per byte moved), %s, B = %lld, S = %lld, %s (%.0f bytes/value)\n",
              o.common.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), w);
  std::printf("%s ridge: %.0f FLOP/B (%s); below it a kernel is memory-bound.\n\n", acc.name.c_str(), acc.ridge(),
              acc.source.c_str());
  std::printf("%-40s %14s %14s %11s %9s  %s\n", "", "FLOPs", "bytes", "intensity", "≈ lecture", "bound");
  json rows = json::array();
  auto row = [&](const std::string& name, const Cost& k, double approx) {
    const char* bound = k.intensity() < acc.ridge() ? "memory" : "compute";
    char a[32] = "—";
    if (!std::isnan(approx)) std::snprintf(a, sizeof a, "%.3g", approx);
    std::printf("%-40s %14.4g %14.4g %11.3f %9s  %s\n", name.c_str(), k.flops, k.bytes, k.intensity(), a, bound);
    rows.push_back({{"name", name},
                    {"flops", k.flops},
                    {"bytes", k.bytes},
                    {"intensity", k.intensity()},
                    {"approximation", approx},
                    {"bound", bound}});
  };
  row("matmul (B×D)(D×F), W_up", matmul_cost(B, D, F, w), B);
  for (auto [name, T] : {std::pair{"prefill (T = S)", S}, std::pair{"generation (T = 1)", 1.0}}) {
    std::printf("%s\n", name);
    row("  gated MLP, one layer", mlp_cost(B, T, D, F, w), B * T);
    row("  attention (FlashAttention), one layer", attention_cost(B, S, T, c.num_heads, c.num_kv_heads, c.head_dim, w),
        S * T / (S + T));
    row("  whole forward pass", forward_cost(c, B, S, T, w), NAN);
  }
  if (c.num_kv_heads != c.num_heads)
    std::printf(
        "\nWith K = %lld KV heads for N = %lld query heads, generation attention tends to N/K = %.0f FLOP/B "
        "instead of the lecture's S/(S+1) < 1.\n",
        static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.num_heads),
        static_cast<double>(c.num_heads) / static_cast<double>(c.num_kv_heads));
  emit_json(o, {{"model", o.common.model},
                {"batch", o.batch},
                {"seq", o.seq},
                {"dtype", o.dtype},
                {"accelerator", metrics::to_json(acc)},
                {"rows", rows}});
  return 0;
}

int memory(const Options& o) {
  const TransformerConfig c = model_of(o);
  const auto acc = accelerator_of(o);
  const std::int64_t w = bytes_per_value(o.dtype);
  const std::int64_t per_token = c.kv_cache_bytes(1, w), per_seq = c.kv_cache_bytes(o.seq, w);
  const std::int64_t params = param_bytes(c, w), mb = max_batch(c, o.seq, acc.memory_bytes, w);
  const double per_batch = static_cast<double>(per_seq) * static_cast<double>(o.batch);  // may pass 2^63 bytes
  std::printf("%s in %s: %.2f billion parameters\n", o.common.model.c_str(), o.dtype.c_str(),
              static_cast<double>(c.num_parameters()) / 1e9);
  std::printf("  KV cache per token     S×K×H×L×2×w = 1×%lld×%lld×%lld×2×%lld = %lld bytes\n",
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.num_layers), static_cast<long long>(w), static_cast<long long>(per_token));
  std::printf("  KV cache per sequence  S = %lld: %lld bytes (%s)\n", static_cast<long long>(o.seq),
              static_cast<long long>(per_seq), metrics::human_bytes(static_cast<double>(per_seq)).c_str());
  std::printf("  KV cache for B = %lld    %.0f bytes (%s)\n", static_cast<long long>(o.batch), per_batch,
              metrics::human_bytes(per_batch).c_str());
  std::printf("  parameters             %lld bytes (%.1f GB)\n", static_cast<long long>(params), params / 1e9);
  if (mb < 0)
    std::printf("  on %s (%.0f GB): does not fit: the weights alone need %.1f GB\n", acc.name.c_str(),
                acc.memory_bytes / 1e9, params / 1e9);
  else
    std::printf("  on %s (%.0f GB): the largest batch at S = %lld is %lld\n", acc.name.c_str(), acc.memory_bytes / 1e9,
                static_cast<long long>(o.seq), static_cast<long long>(mb));
  emit_json(o, {{"model", o.common.model},
                {"dtype", o.dtype},
                {"seq", o.seq},
                {"batch", o.batch},
                {"parameters", c.num_parameters()},
                {"kv_bytes_per_token", per_token},
                {"kv_bytes_per_sequence", per_seq},
                {"kv_bytes_batch", per_batch},
                {"param_bytes", params},
                {"accelerator", metrics::to_json(acc)},
                {"max_batch", mb}});
  return 0;
}

int latency(const Options& o) {
  const TransformerConfig c = model_of(o);
  const auto acc = accelerator_of(o);
  const std::int64_t w = bytes_per_value(o.dtype);
  std::printf("Memory-bound decoding: %s (K = %lld), S = %lld, %s on %s (%.2f TB/s, %.0f GB, %s)\n", o.common.model.c_str(),
              static_cast<long long>(c.num_kv_heads), static_cast<long long>(o.seq), o.dtype.c_str(), acc.name.c_str(),
              acc.bytes_per_s / 1e12, acc.memory_bytes / 1e9, acc.source.c_str());
  std::printf("latency = (parameters + B × KV cache) / bandwidth; throughput = B / latency\n\n");
  std::printf("%6s %12s %14s %16s %16s  %s\n", "B", "memory (GB)", "latency (ms)", "throughput (t/s)", "compute (ms)", "");
  json rows = json::array();
  plot::Figure fig;
  fig.title = o.common.model + " on " + acc.name + ": the memory-bound model";
  fig.x = {"batch size B", true, 0, 0};
  fig.y = {"tokens per second (solid) / ms per token (dashed)", true, 0, 0};
  plot::Series thr, lat;
  thr.label = "throughput (tokens/s)", lat.label = "latency (ms/token)";
  lat.dashed = true;
  thr.markers = lat.markers = true;
  for (std::int64_t B : o.batches) {
    const auto p = memory_bound_latency(c, o.seq, B, acc, w);
    std::printf("%6lld %12.1f %14.2f %16.0f %16.3f  %s\n", static_cast<long long>(B), p.memory_bytes / 1e9,
                p.latency_s * 1e3, p.throughput, p.compute_s * 1e3, p.fits ? "" : "does not fit");
    rows.push_back({{"batch", B},
                    {"memory_bytes", p.memory_bytes},
                    {"latency_s", p.latency_s},
                    {"throughput_tokens_per_s", p.throughput},
                    {"compute_s", p.compute_s},
                    {"fits", p.fits}});
    if (p.fits) {
      thr.x.push_back(static_cast<double>(B)), thr.y.push_back(p.throughput);
      lat.x.push_back(static_cast<double>(B)), lat.y.push_back(p.latency_s * 1e3);
    }
  }
  std::printf(
      "\n'compute' is the forward pass's FLOPs over the %s peak: while it is below the latency, the step is\n"
      "memory-bound, as the lecture says.\n",
      acc.name.c_str());
  fig.series = {thr, lat};
  if (!o.svg.empty()) {
    plot::save_svg(fig, o.svg);
    std::printf("plot: %s\n", o.svg.c_str());
  }
  emit_json(o, {{"model", o.common.model},
                {"seq", o.seq},
                {"dtype", o.dtype},
                {"kv_heads", c.num_kv_heads},
                {"accelerator", metrics::to_json(acc)},
                {"rows", rows}});
  return 0;
}

int roofline(const Options& o) {
  const Device dev = o.common.resolved_device();
  std::printf("Measuring this machine's ceilings on %s ...\n", device_name(dev).data());
  const metrics::Ceiling measured = metrics::measure_ceiling(dev);
  std::printf("  %s: read from memory %s, %s %s (%s)\n  ridge %.1f FLOP/B\n", measured.name.c_str(),
              metrics::describe(measured.read, "B").c_str(), metrics::describe(measured.compute, "FLOP").c_str(),
              measured.flops_dtype.c_str(), measured.source.c_str(), measured.ridge());
  auto points = measure_matmul_points(dev, measured);
  for (const auto& f : o.points) {
    auto more = load_points(f, measured);
    points.insert(points.end(), more.begin(), more.end());
  }
  std::printf(
      "\nPoints (each against the measured ceiling of its kind: a working set in cache against a streaming read\n"
      "of as many bytes in cache, a larger one against the read from memory):\n");
  for (const auto& p : points) std::printf("  %-28s %s\n", p.label.c_str(), metrics::describe(p).c_str());
  std::vector<metrics::Ceiling> roofs = {measured};
  for (const auto& c : metrics::accelerator_presets()) roofs.push_back(c);
  if (!o.svg.empty()) {
    plot::save_svg(roofline_figure(roofs, points), o.svg);
    std::printf("\nplot: %s\n", o.svg.c_str());
  }
  json jp = json::array();
  for (const auto& p : points) jp.push_back(metrics::to_json(p));
  json jr = json::array();
  for (const auto& c : roofs) jr.push_back(metrics::to_json(c));
  emit_json(o, {{"ceilings", jr}, {"roofline_points", jp}});
  return 0;
}

int lecture(const Options& o) {
  const auto claims = lecture_claims();
  int dis = 0;
  for (const auto& c : claims) {
    if (c.verdict != Claim::Disagree) continue;
    ++dis;
    std::printf("✗ %s\n    lecture: %s   computed: %s\n    %s\n", c.claim.c_str(), c.lecture.c_str(), c.computed.c_str(),
                c.why.c_str());
  }
  std::printf("\n%zu numbers checked; %d disagree (listed above). The full table: docs/lecture-numbers.md\n", claims.size(),
              dis);
  if (!o.markdown.empty()) {
    write_text(o.markdown, lecture_markdown());
    std::printf("wrote %s\n", o.markdown.c_str());
  }
  json j = json::array();
  for (const auto& c : claims)
    j.push_back({{"section", c.section},
                 {"claim", c.claim},
                 {"lecture", c.lecture},
                 {"computed", c.computed},
                 {"verdict", c.verdict == Claim::Agree      ? "agree"
                             : c.verdict == Claim::Disagree ? "disagree"
                                                            : "external"},
                 {"why", c.why}});
  emit_json(o, j);
  return 0;
}

// No subcommand: the tour's few lines.
int headline(const Options& o) {
  const TransformerConfig c = find_model("Llama-2-13B");
  const auto h100 = find_accelerator("h100");
  const Cost step = forward_cost(c, 1, 1024, 1);
  const auto p1 = memory_bound_latency(c, 1024, 1, h100), p64 = memory_bound_latency(c, 1024, 64, h100);
  std::printf("Why decoding is memory-bound (lecture: 理解推理工作负载)\n");
  std::printf("  Llama-2-13B, one decode step at B = 1, S = 1024, bf16: %.1f GFLOP over %.1f GB moved = %.2f FLOP/B\n",
              step.flops / 1e9, step.bytes / 1e9, step.intensity());
  std::printf("  H100 (datasheet) ridge: %.0f FLOP/B, so the step is memory-bound: %.1f ms/token, %.0f tokens/s;\n",
              h100.ridge(), p1.latency_s * 1e3, p1.throughput);
  std::printf("  at B = 64 the same bytes serve 64 sequences: %.1f ms/token, %.0f tokens/s\n", p64.latency_s * 1e3,
              p64.throughput);
  const auto cpu = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf("  this CPU (measured): %s read from memory, %s f32 GEMM: ridge %.1f FLOP/B\n",
              metrics::describe(cpu.read, "B").c_str(), metrics::describe(cpu.compute, "FLOP").c_str(), cpu.ridge());
  int dis = 0;
  for (const auto& cl : lecture_claims()) dis += cl.verdict == Claim::Disagree;
  std::printf("  %zu numbers in the lecture recomputed, %d disagree: ch00_workload lecture\n", lecture_claims().size(), dis);
  auto point = [](const LatencyPoint& p) {
    return json{{"latency_s", p.latency_s}, {"throughput_tokens_per_s", p.throughput}, {"memory_bytes", p.memory_bytes}};
  };
  emit_json(o, {{"model", "Llama-2-13B"},
                {"seq", 1024},
                {"dtype", "bf16"},
                {"accelerator", metrics::to_json(h100)},
                {"decode_step", {{"flops", step.flops}, {"bytes", step.bytes}, {"intensity", step.intensity()}}},
                {"batch_1", point(p1)},
                {"batch_64", point(p64)},
                {"cpu_ceiling", metrics::to_json(cpu)},
                {"lecture_numbers", lecture_claims().size()},
                {"lecture_disagreements", dis}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 00: the inference workload (arithmetic intensity, memory, latency, roofline)", "ch00_workload"};
  Options o;
  o.common.model = "Llama-2-13B";
  add_json_option(app, o.common.json);  // the bare run's
  help_footer(app, "the lecture's headline numbers for Llama-2-13B on an H100, and how to see more",
              "chapters/00_workload/README.md", "理解推理工作负载");
  auto add_model_opts = [&](CLI::App* s) {
    add_model_option(*s, o.common);
    s->get_option("--model")->description(
        "A named model (Llama-2-7B/13B/70B, Llama-3-8B/70B, Llama-3.1-405B) or a config.json");
    add_json_option(*s, o.common.json);
    s->add_option("--dtype", o.dtype, "Bytes per value: f32, bf16, f16, fp8 or int8")
        ->check(CLI::IsMember({"f32", "bf16", "f16", "fp8", "int8"}))
        ->capture_default_str();
    s->add_option("--accelerator", o.accelerator, "Datasheet preset: h100, h200, a100")->capture_default_str();
    s->add_option("--memory-gb", o.memory_gb, "Override the accelerator's memory (GB)")->check(number_in(1e-3, 1e6));
    s->add_option("--seq", o.seq, "Context length S")->check(number_in(1, 1 << 24))->capture_default_str();
    s->add_option("--kv-heads", o.kv_heads, "Override the number of KV heads (a GQA variant)")->check(number_in(1, 4096));
  };
  auto* si = app.add_subcommand("intensity", "Arithmetic intensity of matmul, MLP and attention, prefill and generation");
  add_model_opts(si);
  si->add_option("--batch", o.batch, "Batch size B")->check(number_in(1, 1 << 20))->capture_default_str();
  auto* sm = app.add_subcommand("memory", "KV-cache and parameter bytes; the largest batch that fits");
  add_model_opts(sm);
  sm->add_option("--batch", o.batch, "Batch size B")->check(number_in(1, 1 << 20))->capture_default_str();
  auto* sl = app.add_subcommand("latency", "The memory-bound latency/throughput model over batch sizes");
  add_model_opts(sl);
  sl->add_option("--batches", o.batches, "Batch sizes to sweep")->check(number_in(1, 1 << 20))->delimiter(',');
  sl->add_option("--svg", o.svg, "Write the plot here")->check(output_file());
  auto* sr = app.add_subcommand("roofline", "Measure this machine's roofline and draw it with presets and points");
  add_device_option(*sr, o.common);
  add_json_option(*sr, o.common.json);
  sr->add_option("--points", o.points, "JSON files with roofline points written by the chapters")
      ->check(input_file("roofline points"));
  sr->add_option("--svg", o.svg, "Write the plot here")->check(output_file());
  auto* sc = app.add_subcommand("lecture", "Every number in the lecture, recomputed");
  add_json_option(*sc, o.common.json);
  sc->add_option("--markdown", o.markdown, "Write the table as Markdown (docs/lecture-numbers.md)")->check(output_file());
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*si) return intensity(o);
    if (*sm) return memory(o);
    if (*sl) return latency(o);
    if (*sr) return roofline(o);
    if (*sc) return lecture(o);
    return headline(o);
  });
}
