// ch07_mamba: a state instead of a KV cache. What a fixed-size state buys (bytes flat in the
// context, decode time flat in the position) and what the lecture says it costs (exact recall).
//   ch07_mamba              the headline
//   ch07_mamba memory       state bytes against KV bytes as the context grows
//   ch07_mamba speed        time per decode token against position, Mamba beside a transformer
//   ch07_mamba scan         a prefill's scan four ways: the loop, threads, chunks, token by token
//   ch07_mamba lti          tiny-lti's scan as one convolution (S4's view), and its kernel
//   ch07_mamba recall       perplexity and probes of tiny-lti, tiny-mamba and tiny-mha
//   ch07_mamba jamba        Jamba's 1:7 hybrid as a worked KV-size calculation
//   ch07_mamba generate     text from tiny-mamba or a MambaForCausalLM folder
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/generate.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/models/batch_decode.h"
#include "common/models/mamba.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::models::mamba;
using nlohmann::json;

namespace {

using ll = long long;

std::string folder_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  return name.empty() ? std::filesystem::path(path).parent_path().filename().string() : name;
}

// --- bytes: the state against the KV cache -------------------------------------------------
json memory_table(const MambaConfig& mamba, const std::string& mamba_name, const TransformerConfig& llama,
                  const std::string& llama_name, const std::vector<std::int64_t>& contexts, bool indent) {
  const char* pad = indent ? "  " : "";
  std::printf("%s%-24s", pad, "bytes at context T");
  for (std::int64_t T : contexts) std::printf(" %12lld", static_cast<ll>(T));
  std::printf("\n%s%-24s", pad, (llama_name + " KV cache").c_str());
  json kv = json::array(), st = json::array();
  for (std::int64_t T : contexts) {
    kv.push_back(llama.kv_cache_bytes(T, 4));
    std::printf(" %12lld", static_cast<ll>(kv.back().get<std::int64_t>()));
  }
  std::printf("\n%s%-24s", pad, (mamba_name + " state").c_str());
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    st.push_back(mamba.state_bytes(4));
    std::printf(" %12lld", static_cast<ll>(mamba.state_bytes(4)));
  }
  std::printf(
      "\n%s(KV: T × K × H × L × 2 × 4 B, growing; state: L × E × ((K_conv − 1) + N) × 4 B = %lld × %lld × (%lld + %lld) × "
      "4, "
      "the same at every T)\n",
      pad, static_cast<ll>(mamba.num_layers), static_cast<ll>(mamba.inner_size), static_cast<ll>(mamba.conv_kernel - 1),
      static_cast<ll>(mamba.state_size));
  return {
      {"contexts", contexts}, {"kv_model", llama_name}, {"kv_bytes", kv}, {"state_model", mamba_name}, {"state_bytes", st}};
}

// --- time per decode token against position ------------------------------------------------
// A transformer and a Mamba of about the same parameters: a Mamba layer (in_proj 4D², out_proj
// 2D², the rest small) is half a Llama layer (attention 4D², MLP 8.25D²), so twice the layers.
TransformerConfig llama_shape(std::int64_t layers) { return models::memory_bound_shape(layers, 16, 8192, 1 << 17); }

MambaConfig mamba_shape(std::int64_t layers) {
  MambaConfig c;
  c.architecture = "MambaForCausalLM";
  c.hidden_size = 1024, c.inner_size = 2048, c.state_size = 16, c.conv_kernel = 4, c.dt_rank = 64;
  c.num_layers = layers, c.vocab_size = 8192;
  return c;
}

// One decode step of the Mamba after `position` tokens: the state holds what they left (random
// values here); the step reads the weights and the state, and writes the state.
ThroughputPoint mamba_step(const MambaModel& m, std::int64_t position, int steps) {
  MambaState state(m.config, m.device());
  for (std::int64_t l = 0; l < m.config.num_layers; ++l)
    fill_random(state.ssm(l), static_cast<std::uint64_t>(l + 1)),
        fill_random(state.conv(l), static_cast<std::uint64_t>(l + 100));
  state.commit(position);
  const double bytes = static_cast<double>(m.step_weight_bytes()) + 2.0 * static_cast<double>(state.bytes());
  return time_decode(1, bytes, steps, m.device(), [&] { forward_cached(m, state, {3}); });
}

json speed_table(const metrics::Ceiling& roof, std::int64_t layers, const std::vector<std::int64_t>& positions, int steps,
                 Device dev, bool indent) {
  const char* pad = indent ? "  " : "";
  const models::Llama llama = models::random_llama(llama_shape(layers), 1).to(dev, DType::F32);
  const MambaModel mamba = random_mamba(mamba_shape(2 * layers), 2).to(dev);
  std::printf("%s%-22s", pad, "position");
  for (std::int64_t p : positions) std::printf("  %33lld", static_cast<ll>(p));
  std::printf("\n");
  json rows = json::array();
  metrics::CeilingLegend legend;
  for (const bool is_mamba : {false, true}) {
    const std::string name =
        is_mamba ? "Mamba, " + std::to_string(2 * layers) + " layers" : "transformer, " + std::to_string(layers) + " layers";
    std::printf("%s%-22s", pad, name.c_str());
    json points = json::array();
    for (std::int64_t p : positions) {
      const auto s = is_mamba ? mamba_step(mamba, p, steps) : models::measure_decode(llama, 1, p, steps);
      // Against a streaming read over as many bytes as the step reads (in cache, or from memory).
      const auto read = metrics::read_ceiling_for(roof, s.bytes_per_step);
      std::printf("  %6.2f ms %5.1f GB/s (%3.0f%% %-5s)", s.seconds_per_step * 1e3, s.achieved_bytes_per_s() / 1e9,
                  legend.percent(name + " at " + std::to_string(p), s.achieved_bytes_per_s(), read), read.abbrev());
      std::fflush(stdout);
      points.push_back({{"position", p},
                        {"seconds", s.seconds_per_step},
                        {"bytes", s.bytes_per_step},
                        {"read_ceiling", metrics::to_json(read)}});
    }
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back({{"model", name},
                    {"parameters", is_mamba ? mamba.config.num_parameters() : llama.config.num_parameters()},
                    {"points", points}});
  }
  legend.print(pad);
  return rows;
}

// --- the scan four ways --------------------------------------------------------------------
struct RandomLayer {
  Tensor xz, dbc, u, dt, A, D;
  ScanInputs in;
};

RandomLayer random_layer(std::int64_t T, std::int64_t E, std::int64_t N, Device dev) {
  std::mt19937_64 rng(7);
  auto fill = [&](const Shape& s, float lo, float hi) {
    Tensor t = Tensor::empty(s, DType::F32);
    std::uniform_real_distribution<float> d(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t.to(dev);
  };
  RandomLayer r;
  r.xz = fill({T, 2 * E}, -2, 2), r.dbc = fill({T, 64 + 2 * N}, -1, 1), r.u = fill({T, E}, -1, 1);
  r.dt = fill({T, E}, -6, -2), r.A = fill({E, N}, -16, -1), r.D = fill({E}, -1, 1);
  r.in.u = r.u, r.in.dt = r.dt, r.in.A = r.A, r.in.D = r.D, r.in.z = r.xz.slice(1, E, 2 * E);
  r.in.B = r.dbc.slice(1, 64, 64 + N), r.in.C = r.dbc.slice(1, 64 + N, 64 + 2 * N);
  return r;
}

json scan_table(const metrics::Ceiling& roof, const std::vector<std::int64_t>& lengths, Device dev, bool indent) {
  const char* pad = indent ? "  " : "";
  const std::int64_t E = 2048, N = 16;
  using Run = std::function<void(const ScanInputs&, Tensor&, Tensor&)>;
  struct Way {
    std::string name;
    Run run;
  };
  std::vector<Way> ways;
  if (dev == Device::CPU) {
    ways.push_back({"ref:: loop, 1 thread",
                    [](const ScanInputs& in, Tensor& h, Tensor& y) { models::mamba::ref::selective_scan(in, h, y); }});
    ways.push_back({"threads over channels", [](const ScanInputs& in, Tensor& h, Tensor& y) { selective_scan(in, h, y); }});
    ways.push_back({"chunked (associative)", [](const ScanInputs& in, Tensor& h, Tensor& y) { parallel_scan(in, h, y); }});
  } else {
    ways.push_back({"chunked kernel", [](const ScanInputs& in, Tensor& h, Tensor& y) { selective_scan(in, h, y); }});
  }
  ways.push_back({"token by token (step)", [](const ScanInputs& in, Tensor& h, Tensor& y) {
                    for (std::int64_t t = 0; t < in.T(); ++t) {
                      ScanInputs r = in;
                      r.u = in.u.slice(0, t, t + 1), r.z = in.z.slice(0, t, t + 1), r.dt = in.dt.slice(0, t, t + 1);
                      r.B = in.B.slice(0, t, t + 1), r.C = in.C.slice(0, t, t + 1);
                      Tensor y_t = y.slice(0, t, t + 1);
                      selective_scan(r, h, y_t);
                    }
                  }});
  std::printf("%s%-24s", pad, "tokens T");
  for (std::int64_t T : lengths) std::printf("  %48lld", static_cast<ll>(T));
  std::printf("\n");
  json rows = json::array();
  metrics::CeilingLegend legend;
  for (const Way& way : ways) {
    std::printf("%s%-24s", pad, way.name.c_str());
    json points = json::array();
    for (std::int64_t T : lengths) {
      RandomLayer r = random_layer(T, E, N, dev);
      Tensor h = Tensor::zeros({E, N}, DType::F32, dev), y = Tensor::empty({T, E}, DType::F32, dev);
      const double s = time_decode(1, 0, 2, dev, [&] { way.run(r.in, h, y); }).seconds_per_step;
      const double bytes = scan_bytes(T, E, N, false), flops = 7.0 * static_cast<double>(T * E * N);
      const auto read = metrics::read_ceiling_for(roof, bytes);
      std::printf("  %8.2f ms %5.1f GB/s %3.0f%% %-5s %6.1f GFLOP/s %3.0f%%", s * 1e3, bytes / s / 1e9,
                  legend.percent(way.name + " at T = " + std::to_string(T), bytes / s, read), read.abbrev(), flops / s / 1e9,
                  100 * flops / s / roof.flops_per_s);
      std::fflush(stdout);
      points.push_back(
          {{"tokens", T}, {"seconds", s}, {"bytes", bytes}, {"flops", flops}, {"read_ceiling", metrics::to_json(read)}});
    }
    std::printf("\n");
    rows.push_back({{"way", way.name}, {"points", points}});
  }
  legend.print(pad);
  return rows;
}

// --- the LTI layer as a convolution --------------------------------------------------------
json lti_report(bool indent) {
  const char* pad = indent ? "  " : "";
  const MambaModel m = load_mamba(bundled_model("tiny-lti"));
  const auto tokens = eval::validation_tokens(data_dir(), 512);
  std::vector<double> scan, conv;
  const double t_scan = time_decode(1, 0, 2, Device::CPU, [&] {
                          scan = forward_sequence(m, tokens, true).to_double_vector();
                        }).seconds_per_step;
  const double t_conv = time_decode(1, 0, 2, Device::CPU, [&] {
                          conv = forward_sequence(m, tokens, true, ScanPath::Convolution).to_double_vector();
                        }).seconds_per_step;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < scan.size(); ++i)
    diff = std::max(diff, std::fabs(scan[i] - conv[i])), scale = std::max(scale, std::fabs(scan[i]));
  std::printf(
      "%stiny-lti over 512 validation tokens: the scan and the convolution y = K * u give the same logits "
      "(max |Δ| %.2g of logits up to %.1f); %.1f ms by scan, %.1f ms by direct convolution (O(T²); an FFT "
      "makes it O(T log T))\n",
      pad, diff, scale, t_scan * 1e3, t_conv * 1e3);
  const MambaLayer& l = m.layers[0];
  const std::vector<std::int64_t> lags = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 511};
  const Tensor K = lti_kernel(l.dt, l.A, l.B, l.C, 512);
  std::printf("%slayer 0's kernel K[c, k] = Σ_n C·Ā^k·B̄, mean |K| over its %lld channels, against the lag k:\n%s", pad,
              static_cast<ll>(m.config.inner_size), pad);
  json mean_abs = json::array();
  for (std::int64_t k : lags) {
    double s = 0;
    for (std::int64_t c = 0; c < m.config.inner_size; ++c) s += std::fabs(K.at<float>({c, k}));
    s /= static_cast<double>(m.config.inner_size);
    mean_abs.push_back(s);
    std::printf("  k=%lld %.2g", static_cast<ll>(k), s);
  }
  std::printf("\n%s(the same kernel for every input: an LTI layer cannot decide, token by token, what to keep)\n", pad);
  return {{"max_abs_logit_diff", diff}, {"max_abs_logit", scale}, {"scan_seconds", t_scan},
          {"conv_seconds", t_conv},     {"lags", lags},           {"kernel_mean_abs", mean_abs}};
}

// --- quality: perplexity and probes --------------------------------------------------------
json recall_table(std::int64_t windows, std::int64_t per_kind) {
  const MambaModel lti = load_mamba(bundled_model("tiny-lti")), mamba = load_mamba(bundled_model("tiny-mamba"));
  const models::Llama mha = models::load_llama(bundled_model("tiny-mha"));
  auto ssm = [](const MambaModel& m) {
    return eval::LogitsFn([&m](const std::vector<std::int32_t>& t) { return forward_sequence(m, t, true); });
  };
  const std::vector<eval::Scored> models = {
      {"tiny-lti", 0, ssm(lti)},
      {"tiny-mamba", 0, ssm(mamba)},
      {"tiny-mha", mha.config.kv_cache_bytes(1, 4),
       [&mha](const std::vector<std::int32_t>& t) { return ch01::forward(mha, t, true); }}};
  json rows = eval::quality_table(models, data_dir(), windows, per_kind);
  std::printf(
      "(cache B/tok 0: a fixed state of %lld bytes whatever the length; recall@N: a fact N tokens back, "
      "AR: associative recall; chance is 1/16 to 1/12 for a fact and 1/10 for a digit, see docs/model-zoo.md)\n",
      static_cast<ll>(mamba.config.state_bytes(4)));
  return rows;
}

// --- Jamba's hybrid, worked ----------------------------------------------------------------
// ai21labs/Jamba-v0.1's config.json: 32 layers, attention at attn_layer_offset 4 every
// attn_layer_period 8 (layers 4, 12, 20, 28), the rest Mamba; 32 query and 8 KV heads of 128;
// mamba_d_state 16, mamba_d_conv 4, mamba_expand 2; bf16; 256K context.
json jamba_table(const std::vector<std::int64_t>& contexts, std::int64_t bytes_per_value, bool indent) {
  const char* pad = indent ? "  " : "";
  TransformerConfig attn;
  attn.hidden_size = 4096, attn.num_heads = 32, attn.num_kv_heads = 8, attn.head_dim = 128;
  const std::int64_t layers = 32, period = 8, attention_layers = layers / period;
  MambaConfig ssm;
  ssm.hidden_size = 4096, ssm.inner_size = 2 * 4096, ssm.state_size = 16, ssm.conv_kernel = 4;
  ssm.num_layers = layers - attention_layers;
  attn.num_layers = attention_layers;
  const std::int64_t jamba_per_token = attn.kv_cache_bytes(1, bytes_per_value);
  attn.num_layers = layers;
  const std::int64_t dense_per_token = attn.kv_cache_bytes(1, bytes_per_value);
  std::printf(
      "%sJamba-v0.1: %lld layers, 1 attention layer in %lld (%lld of them; GQA 32 query / 8 KV heads of 128), the "
      "other %lld Mamba (E = 8192, N = 16, K = 4); %lld bytes per value\n",
      pad, static_cast<ll>(layers), static_cast<ll>(period), static_cast<ll>(attention_layers),
      static_cast<ll>(ssm.num_layers), static_cast<ll>(bytes_per_value));
  std::printf("%sKV per token: %lld attention layers × 2 × 8 × 128 × %lld B = %lld B (all 32 layers attention: %lld B)\n",
              pad, static_cast<ll>(attention_layers), static_cast<ll>(bytes_per_value), static_cast<ll>(jamba_per_token),
              static_cast<ll>(dense_per_token));
  std::printf("%s%-34s", pad, "context");
  for (std::int64_t T : contexts) std::printf(" %12lld", static_cast<ll>(T));
  std::printf("\n");
  json dense = json::array(), hybrid = json::array();
  const std::int64_t state = ssm.state_bytes(bytes_per_value);
  for (std::int64_t T : contexts) dense.push_back(checked_mul(dense_per_token, T, "KV bytes"));
  for (std::int64_t T : contexts)
    hybrid.push_back(checked_add(checked_mul(jamba_per_token, T, "KV bytes"), state, "KV bytes"));
  auto row = [&](const char* name, const json& v) {
    std::printf("%s%-34s", pad, name);
    for (const auto& b : v) std::printf(" %12s", metrics::human_bytes(b.get<double>()).c_str());
    std::printf("\n");
  };
  row("32 attention layers (KV)", dense);
  row("Jamba: 4 attention + 28 Mamba", hybrid);
  std::printf(
      "%s(the 28 Mamba layers' state: 28 × 8192 × (3 + 16) × %lld B = %s at every context; the hybrid's KV is 1/8 "
      "of the dense one's, the lecture's \"about 8×\")\n",
      pad, static_cast<ll>(bytes_per_value), metrics::human_bytes(static_cast<double>(state)).c_str());
  return {{"contexts", contexts},
          {"bytes_per_value", bytes_per_value},
          {"dense_kv_bytes", dense},
          {"jamba_bytes", hybrid},
          {"jamba_kv_bytes_per_token", jamba_per_token},
          {"dense_kv_bytes_per_token", dense_per_token},
          {"mamba_state_bytes", state}};
}

// --- the commands --------------------------------------------------------------------------
// --- figures -------------------------------------------------------------------------------
// speed_table()'s rows: one decode step against position, a transformer's growing with its KV
// cache, a Mamba's flat (its state does not grow).
plot::Figure speed_figure(const json& rows) {
  plot::Figure f;
  f.title = "One decode step against position: attention reads its cache, Mamba its fixed state";
  f.x.label = "cached positions";
  f.y.label = "time per decode step (ms, best of the steps)";
  f.x.log = true;
  for (const json& r : rows) {
    plot::Series s;
    char label[96];
    std::snprintf(label, sizeof label, "%s (%.0f M parameters)", r["model"].get<std::string>().c_str(),
                  r["parameters"].get<double>() / 1e6);
    s.label = label;
    s.markers = true;
    for (const json& p : r["points"])
      s.x.push_back(p["position"].get<double>()), s.y.push_back(p["seconds"].get<double>() * 1e3);
    f.series.push_back(s);
  }
  return f;
}

// recall_table()'s rows: associative-recall accuracy against the number of key-value pairs to
// keep, for each model (the "ar_N" probe kinds), with chance (one digit in ten).
plot::Figure recall_figure(const json& rows, std::int64_t per_kind) {
  plot::Figure f;
  f.title = "Associative recall against pairs to remember (" + std::to_string(per_kind) + " probes per point)";
  f.x.label = "key-value pairs in the prompt";
  f.y.label = "accuracy (fraction right)";
  f.x.log = true;
  f.y.min = 0, f.y.max = 1.05;
  double lo = 1e300, hi = 0;
  for (const json& r : rows) {
    plot::Series s;
    s.label = r["model"].get<std::string>();
    s.markers = true;
    for (const auto& [kind, acc] : r["probes"].items())
      if (kind.rfind("ar_", 0) == 0 && kind.size() > 3 && std::isdigit(static_cast<unsigned char>(kind[3]))) {
        const double n = std::stod(kind.substr(3));
        s.x.push_back(n), s.y.push_back(acc.get<double>()), lo = std::min(lo, n), hi = std::max(hi, n);
      }
    std::vector<std::size_t> order(s.x.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return s.x[a] < s.x[b]; });
    plot::Series sorted = s;
    for (std::size_t i = 0; i < order.size(); ++i) sorted.x[i] = s.x[order[i]], sorted.y[i] = s.y[order[i]];
    f.series.push_back(sorted);
  }
  if (hi > 0) {
    plot::Series chance = plot::curve("chance (1 digit in 10)", lo, hi, 2, true, [](double) { return 0.1; });
    chance.dashed = true, chance.color = "#777";
    f.series.push_back(chance);
  }
  return f;
}

void save_figures(const std::vector<plot::Figure>& panels, const std::string& path, const char* pad) {
  if (path.empty()) return;
  if (panels.size() == 1) plot::save_svg(panels[0], path);
  else plot::save_svg(panels, path);
  std::printf("%swrote %s\n", pad, path.c_str());
}

int memory(const std::string& model, const std::vector<std::int64_t>& contexts, const std::string& json_path) {
  const MambaModel m = load_mamba(model.empty() ? bundled_model("tiny-mamba") : model);
  const models::Llama mha = models::load_llama(bundled_model("tiny-mha"));
  std::printf(
      "One sequence's memory against its length (f32): attention keeps every position, a state-space layer a "
      "summary of fixed size\n\n");
  const json t =
      memory_table(m.config, model.empty() ? "tiny-mamba" : folder_name(model), mha.config, "tiny-mha", contexts, false);
  if (!json_path.empty()) write_json(json_path, t);
  return 0;
}

int speed(const ModelOptions& o, std::int64_t layers, const std::vector<std::int64_t>& positions, int steps,
          const std::string& json_path, const std::string& svg) {
  const Device dev = o.resolved_device();
  const auto roof = metrics::measure_ceiling(dev);
  std::printf(
      "One decode step against position, random weights, f32, %s, best of %d: a transformer (D = 1024, 16 heads "
      "of 64, F = 2816) and a Mamba of about the same parameters (D = 1024, E = 2048, N = 16); GB/s = bytes "
      "the step reads (weights + KV cache, or weights + state read and written) / time, %% of a streaming read "
      "over as many bytes (cache: in the last-level cache, part: partly, mem: from memory, %s)\n\n",
      device_name(dev).data(), steps, metrics::describe(roof.read, "B").c_str());
  const json rows = speed_table(roof, layers, positions, steps, dev, false);
  if (!svg.empty()) save_figures({speed_figure(rows)}, svg, "");
  if (!json_path.empty())
    write_json(json_path, {{"device", device_name(dev)}, {"ceiling", metrics::to_json(roof)}, {"rows", rows}});
  return 0;
}

int scan(const ModelOptions& o, const std::vector<std::int64_t>& lengths, const std::string& json_path) {
  const Device dev = o.resolved_device();
  const auto roof = metrics::measure_ceiling(dev);
  std::printf(
      "One layer's selective scan (E = 2048 channels, N = 16 states, random inputs) over a prefill of T tokens, "
      "%s, best of 2; GB/s = the bytes a scan must move (u, Δ, z, y, B, C, the state) / time, %% of a streaming "
      "read over as many bytes (cache, part or mem as above; from memory %s); GFLOP/s = 7 per token, channel "
      "and state (an exp counted as one) / time, %% of the %s peak %.1f GFLOP/s\n\n",
      device_name(dev).data(), metrics::describe(roof.read, "B").c_str(), roof.flops_dtype.c_str(), roof.flops_per_s / 1e9);
  const json rows = scan_table(roof, lengths, dev, false);
  if (!json_path.empty())
    write_json(json_path, {{"device", device_name(dev)}, {"ceiling", metrics::to_json(roof)}, {"rows", rows}});
  return 0;
}

int lti(const std::string& json_path) {
  std::printf("S4's view: with Δ, B, C fixed the scan is a convolution with one kernel per channel\n\n");
  const json r = lti_report(false);
  if (!json_path.empty()) write_json(json_path, r);
  return 0;
}

int recall(std::int64_t windows, std::int64_t per_kind, const std::string& json_path, const std::string& svg) {
  std::printf(
      "Quality of the zoo's LTI SSM, Mamba and attention models (same data, tokenizer and budget): validation "
      "perplexity over %lld windows of 512 and probe accuracy, %lld probes per kind\n\n",
      static_cast<ll>(windows), static_cast<ll>(per_kind));
  const json rows = recall_table(windows, per_kind);
  if (!svg.empty()) save_figures({recall_figure(rows, per_kind)}, svg, "");
  if (!json_path.empty()) write_json(json_path, {{"rows", rows}});
  return 0;
}

int jamba(const std::vector<std::int64_t>& contexts, std::int64_t bytes_per_value, const std::string& json_path) {
  const json t = jamba_table(contexts, bytes_per_value, false);
  if (!json_path.empty()) write_json(json_path, t);
  return 0;
}

int generate(const CommonOptions& o) {
  const MambaModel m = load_mamba(o.model).to(o.resolved_device());
  const auto tok = Tokenizer::for_model(o.model);
  const auto prompt = tok->encode(o.prompt);
  const MambaState state(m.config);
  std::printf("%s: %s, %lld parameters; state %s\n\n", o.model.c_str(), m.config.architecture.c_str(),
              static_cast<ll>(m.config.num_parameters()), state.layout().c_str());
  Sampler sampler(o.sampling(*tok, m.config.vocab_size));
  TextStream stream(*tok, prompt);
  const models::Generation g = models::mamba::generate(m, prompt, o.max_new_tokens, sampler, m.config.eos_token_ids,
                                                       [&](const models::Generation& gen) { stream.print(gen.tokens); });
  std::printf(
      "\n\n%zu tokens: time to first token %.2f ms, %.2f ms per later token, %.1f tokens/s; the state stayed at "
      "%lld bytes\n",
      g.generated.size(), g.ttft_s() * 1e3, g.tpot_s() * 1e3, g.tokens_per_s(), static_cast<ll>(state.bytes()));
  if (!o.json.empty())
    write_json(o.json,
               {{"model", o.model},
                {"prompt", o.prompt},
                {"prompt_tokens", prompt},
                {"state_bytes", state.bytes()},
                {"generated", g.generated},
                {"ttft_s", g.ttft_s()},
                {"tpot_s", g.tpot_s()}},
               {o.model});
  return 0;
}

int headline(const std::string& json_path, const std::string& svg) {
  std::printf(
      "State-space models (lecture: 状态空间模型): a layer keeps a fixed-size state instead of every position's "
      "keys and values\n");
  const MambaModel tiny = load_mamba(bundled_model("tiny-mamba"));
  const models::Llama mha = models::load_llama(bundled_model("tiny-mha"));
  const json bytes = memory_table(tiny.config, "tiny-mamba", mha.config, "tiny-mha", {64, 512, 4096, 32768, 1 << 20}, true);
  const metrics::Ceiling roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf(
      "  one decode step against position (random models of about 60M parameters, best of 3; GB/s against a\n"
      "  streaming read over as many bytes, cache: in the last-level cache, mem: from memory at %s):\n",
      metrics::describe(roof.read, "B").c_str());
  const json speed = speed_table(roof, 4, {512, 2048, 8192}, 3, Device::CPU, true);
  std::printf("  the lecture's reason for selection, on the zoo (20 probes per kind, 2 validation windows):\n");
  const json quality = recall_table(2, 20);
  std::printf("  Jamba's hybrid at 256K tokens:\n");
  const json jam = jamba_table({4096, 262144}, 2, true);
  std::printf("  more: ch07_mamba memory | speed | scan | lti | recall | jamba | generate\n");
  if (!svg.empty()) save_figures({speed_figure(speed), recall_figure(quality, 20)}, svg, "  ");
  if (!json_path.empty())
    write_json(
        json_path,
        {{"bytes", bytes}, {"ceiling", metrics::to_json(roof)}, {"speed", speed}, {"quality", quality}, {"jamba", jam}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 07: Mamba, selective state spaces", "ch07_mamba"};
  std::string json_path;
  add_json_option(app, json_path);  // the bare run's
  std::string svg;
  app.add_option("--svg", svg, "Also plot the step time against position and the recall against pairs as SVG")
      ->check(output_file());
  help_footer(app,
              "tiny-mamba's fixed state against tiny-mha's growing KV cache, one decode step against position for a "
              "Mamba and a transformer of the same size (GB/s against the measured read ceiling), perplexity and probe "
              "accuracy of tiny-lti, tiny-mamba and tiny-mha, and Jamba's 1:7 hybrid at 256K tokens",
              "chapters/07_mamba/README.md", "状态空间模型");
  std::string model;
  std::vector<std::int64_t> contexts = {64, 512, 4096, 32768, 1 << 20};
  auto* sm = app.add_subcommand("memory", "State bytes against KV bytes as the context grows (tiny-mamba, or --model)");
  add_json_option(*sm, json_path);
  sm->add_option("--model", model, "A MambaForCausalLM folder (default: tiny-mamba)");
  sm->add_option("--contexts", contexts, "Sequence lengths")->delimiter(',')->check(number_in(1, 1 << 30));
  ModelOptions dev;
  std::int64_t layers = 4;
  std::vector<std::int64_t> positions = {1024, 4096, 16384, 32768};
  int steps = 3;
  auto* ss = app.add_subcommand("speed", "Time per decode token against position: Mamba beside a transformer");
  add_device_option(*ss, dev);
  add_json_option(*ss, json_path);
  ss->add_option("--svg", svg, "Also plot the step time against position as SVG")->check(output_file());
  ss->add_option("--layers", layers, "The transformer's layers (the Mamba has twice as many)")
      ->check(number_in(1, 32))
      ->capture_default_str();
  ss->add_option("--positions", positions, "Cached positions")->delimiter(',')->check(number_in(1, 1 << 17));
  ss->add_option("--steps", steps, "Timed steps per point (best is kept)")->check(number_in(1, 1000))->capture_default_str();
  std::vector<std::int64_t> lengths = {256, 1024, 4096};
  auto* sc = app.add_subcommand("scan", "One layer's scan over a prefill: the loop, threads, chunks, token by token");
  add_device_option(*sc, dev);
  add_json_option(*sc, json_path);
  sc->add_option("--tokens", lengths, "Prefill lengths")->delimiter(',')->check(number_in(1, 1 << 20));
  auto* sl = app.add_subcommand("lti", "tiny-lti's scan as one convolution, and its kernel against the lag");
  add_json_option(*sl, json_path);
  std::int64_t windows = 8, per_kind = 200;
  auto* sr = app.add_subcommand("recall", "Perplexity and probe accuracy of tiny-lti, tiny-mamba and tiny-mha");
  add_json_option(*sr, json_path);
  sr->add_option("--svg", svg, "Also plot the recall against pairs as SVG")->check(output_file());
  add_quality_options(*sr, windows, per_kind);
  std::vector<std::int64_t> jamba_contexts = {4096, 32768, 262144};
  std::int64_t bytes_per_value = 2;
  auto* sj = app.add_subcommand("jamba", "Jamba-v0.1's 1:7 hybrid as a worked KV-size calculation");
  add_json_option(*sj, json_path);
  sj->add_option("--contexts", jamba_contexts, "Sequence lengths")->delimiter(',')->check(number_in(1, 1 << 30));
  sj->add_option("--bytes-per-value", bytes_per_value, "Bytes per cached value (2: bf16)")
      ->check(number_in(1, 8))
      ->capture_default_str();
  CommonOptions go;
  go.model = bundled_model("tiny-mamba");
  auto* sg = app.add_subcommand("generate", "Text from tiny-mamba, tiny-lti or a MambaForCausalLM folder");
  add_common_options(*sg, go);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sm) return memory(model, contexts, json_path);
    if (*ss) return speed(dev, layers, positions, steps, json_path, svg);
    if (*sc) return scan(dev, lengths, json_path);
    if (*sl) return lti(json_path);
    if (*sr) return recall(windows, per_kind, json_path, svg);
    if (*sj) return jamba(jamba_contexts, bytes_per_value, json_path);
    if (*sg) return generate(go);
    return headline(json_path, svg);
  });
}
