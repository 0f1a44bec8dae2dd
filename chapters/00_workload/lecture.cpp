// The lecture's numbers, recomputed with this chapter's functions. Each claim says what the
// lecture prints and what the code gives; a disagreement comes with one sentence on why.
#include "chapters/00_workload/lecture.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "chapters/00_workload/workload.h"
#include "common/metrics.h"

namespace inferlab::ch00 {

double speculative_expected_tokens(double alpha, int gamma) { return (1 - std::pow(alpha, gamma + 1)) / (1 - alpha); }

double e4m3_max(bool ieee_like) {
  const int max_exponent_field = ieee_like ? 14 : 15;         // 15 is all ones
  const double max_mantissa = ieee_like ? 7.0 / 8 : 6.0 / 8;  // E4M3FN: 1111.111 is NaN
  return (1 + max_mantissa) * std::ldexp(1.0, max_exponent_field - 7);
}

namespace {

std::string fmt(const char* f, double v) {
  char b[256];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string with_commas(double v) {
  std::string s = fmt("%.0f", v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}
constexpr double MiB = 1 << 20, GB = 1e9;

// True when `computed` rounds to the lecture's figure at the precision the lecture prints it
// (rel: the half-width of the last printed digit, relative).
bool close(double computed, double lecture, double rel) { return std::fabs(computed - lecture) <= rel * std::fabs(lecture); }

}  // namespace

std::vector<Claim> lecture_claims() {
  std::vector<Claim> c;
  auto add = [&](std::string sec, std::string claim, std::string lec, std::string comp, bool agree, double value,
                 std::string why = "") {
    c.push_back({std::move(sec), std::move(claim), std::move(lec), std::move(comp), agree ? Claim::Agree : Claim::Disagree,
                 std::move(why), value});
  };
  auto external = [&](std::string sec, std::string claim, std::string lec, std::string source) {
    c.push_back({std::move(sec), std::move(claim), std::move(lec), "", Claim::External, std::move(source), NAN});
  };

  // --- Scale of inference -------------------------------------------------------------------
  const std::string s0 = "Introduction (推理的规模)";
  external(s0, "OpenAI generates words per day", "> 100 billion", "a public statement by OpenAI; not derivable");
  external(s0, "Cursor accepted lines of code per day", "≈ 1 billion", "a public statement by Cursor; not derivable");

  // --- Arithmetic intensity ---------------------------------------------------------------------
  const std::string s1 = "Arithmetic intensity (回顾：算术强度)";
  {
    const Cost m = matmul_cost(1, 4096, 4096);
    add(s1, "(B×D)(D×F) intensity ≈ B when B ≪ D, F (B = 1, D = F = 4096)", "≈ 1", fmt("%.4f", m.intensity()),
        close(m.intensity(), 1, 0.01), m.intensity());
  }
  const TransformerConfig l405 = find_model("llama-3.1-405b");
  add(s1, "Llama 3 405B W_up is D × F", "16384 × 53248",
      std::to_string(l405.hidden_size) + " × " + std::to_string(l405.intermediate_size),
      l405.hidden_size == 16384 && l405.intermediate_size == 53248, static_cast<double>(l405.intermediate_size));
  {
    const Cost b1 = matmul_cost(1, 16384, 53248);
    add(s1, "405B W_up at B = 1: FLOPs 2BDF", "≈ 1.74 × 10⁹", with_commas(b1.flops), close(b1.flops, 1.745e9, 0.003),
        b1.flops);
    add(s1, "405B W_up at B = 1: bytes 2BD + 2DF + 2BF", "≈ 1.74 × 10⁹", with_commas(b1.bytes),
        close(b1.bytes, 1.745e9, 0.003), b1.bytes);
    add(s1, "405B W_up at B = 1: intensity", "≈ 1.0", fmt("%.5f", b1.intensity()), close(b1.intensity(), 1, 0.05),
        b1.intensity());
    const Cost b256 = matmul_cost(256, 16384, 53248);
    add(s1, "405B W_up at B = 256: intensity ≈ B", "≈ 256", fmt("%.1f", b256.intensity()),
        close(b256.intensity(), 256, 0.03), b256.intensity(),
        "agrees as an approximation: the exact value is 2% lower because 2BD + 2BF is no longer negligible");
    const auto h100 = find_accelerator("h100");
    add(s1, "…which is still below the H100's accelerator intensity (memory-bound)", "256 < 295",
        fmt("%.1f", b256.intensity()) + " < " + fmt("%.1f", h100.ridge()), b256.intensity() < h100.ridge(),
        b256.intensity());
    external(s1, "H100 bf16 peak", "989 TFLOP/s", "NVIDIA H100 SXM datasheet (dense); used as the H100 preset");
    external(s1, "H100 HBM bandwidth", "3.35 TB/s", "NVIDIA H100 SXM datasheet; used as the H100 preset");
    add(s1, "H100 accelerator intensity = 989 / 3.35", "≈ 295", fmt("%.1f", h100.ridge()), close(h100.ridge(), 295, 0.002),
        h100.ridge());
  }

  // --- Naive inference and the KV cache -------------------------------------------------------
  const std::string s2 = "Naive inference and the KV cache (朴素推理与 KV Cache)";
  const TransformerConfig l70 = find_model("llama-2-70b");
  {
    // FLOPs of generating T tokens from scratch, attention part: naive re-runs a length-t
    // forward for every t; cached runs one token against t keys.
    auto attn_naive = [&](double T) {
      double f = 0;
      for (double t = 1; t <= T; ++t) f += attention_cost(1, t, t, 64, 8, 128).flops / 2;  // causal half
      return f;
    };
    auto attn_cached = [&](double T) {
      double f = 0;
      for (double t = 1; t <= T; ++t) f += attention_cost(1, t, 1, 64, 8, 128).flops;
      return f;
    };
    const double e_naive = std::log2(attn_naive(2048) / attn_naive(1024));
    const double e_cached = std::log2(attn_cached(2048) / attn_cached(1024));
    add(s2, "Naive decoding: T tokens cost O(T³) FLOPs (attention; doubling T multiplies by 2^e)", "e = 3",
        "e = " + fmt("%.2f", e_naive), std::fabs(e_naive - 3) < 0.01, e_naive);
    add(s2, "With a KV cache: O(T²)", "e = 2", "e = " + fmt("%.2f", e_cached), std::fabs(e_cached - 2) < 0.01, e_cached);
  }
  add(s2, "Llama 2 70B: K, H, L", "8, 128, 80",
      std::to_string(l70.num_kv_heads) + ", " + std::to_string(l70.head_dim) + ", " + std::to_string(l70.num_layers),
      l70.num_kv_heads == 8 && l70.head_dim == 128 && l70.num_layers == 80, 80);
  const double kv70 = static_cast<double>(l70.kv_cache_bytes(4096, 2));
  const std::string half_why =
      "4096 × 8 × 128 × 80 × 2 × 2 is 1,342,177,280; the printed result is half of that, one of the two factors of 2 "
      "(K and V, or 2 bytes per bf16 value) having been dropped";
  add(s2, "Llama 2 70B KV cache per sequence, S = 4096: S × K × H × L × 2 × 2", "671,088,640 bytes",
      with_commas(kv70) + " bytes", false, kv70, half_why);
  add(s2, "…in MB", "≈ 640 MB", fmt("%.0f MiB", kv70 / MiB), false, kv70 / MiB, "follows from the row above");
  add(s2, "B = 16", "10,240 MB ≈ 10 GB", with_commas(16 * kv70 / MiB) + " MiB", false, 16 * kv70 / MiB,
      "follows from the per-sequence size");
  add(s2, "B = 128 (fills an H100's HBM)", "81,920 MB ≈ 80 GB",
      with_commas(128 * kv70 / MiB) + " MiB = " + fmt("%.0f GB", 128 * kv70 / GB), false, 128 * kv70 / MiB,
      "follows from the per-sequence size: the caches alone need about two H100s, not one");
  const double p70 = static_cast<double>(param_bytes(l70));
  add(s2, "Llama 2 70B parameters in bf16", "≈ 140 GB", fmt("%.1f GB", p70 / GB), close(p70 / GB, 140, 0.02), p70 / GB);
  const double total128 = p70 + 128 * kv70;
  add(s2, "Total at B = 128", "≈ 220 GB", fmt("%.0f GB", total128 / GB), false, total128 / GB,
      "138 GB of weights plus 172 GB of caches (the lecture's 220 GB uses the halved cache size)");
  const double gpus = std::ceil(total128 / find_accelerator("h100").memory_bytes);
  add(s2, "H100s needed at B = 128 (80 GB each)", "at least 3", fmt("%.0f", gpus), false, gpus,
      "310 GB over 80 GB per GPU needs 4");

  // --- MLP and attention intensity ------------------------------------------------------------
  const std::string s3 = "MLP and attention intensity (MLP 层 / 注意力层的算术强度)";
  const TransformerConfig l13 = find_model("llama-2-13b");
  {
    const Cost m = mlp_cost(1, 1, 5120, 13824);
    add(s3, "Gated MLP FLOPs = 6·BTDF (three matmuls of 2·BTDF)", "6BTDF", fmt("%.0f", m.flops / (5120.0 * 13824)) + "·BTDF",
        m.flops == 6.0 * 5120 * 13824, m.flops);
    const Cost m4 = mlp_cost(4, 1, 5120, 13824);
    add(s3, "MLP intensity ≈ BT when BT ≪ D, F (Llama 2 13B, B = 4, T = 1)", "≈ 4", fmt("%.3f", m4.intensity()),
        close(m4.intensity(), 4, 0.01), m4.intensity());
    const Cost pre = attention_cost(1, 1024, 1024, 40, 40, 128), gen = attention_cost(1, 1024, 1, 40, 40, 128);
    add(s3, "Attention intensity ST/(S+T); prefill T = S = 1024 gives S/2", "512", fmt("%.1f", pre.intensity()),
        pre.intensity() == 512, pre.intensity());
    add(s3, "Generation T = 1: S/(S+1) < 1 (S = 1024)", "< 1", fmt("%.5f", gen.intensity()), gen.intensity() < 1,
        gen.intensity());
    const Cost gqa = attention_cost(1, 1024, 1, 64, 8, 128);
    add(s3, "(not in the lecture) with GQA, generation intensity tends to N/K, not 1 (N = 64, K = 8)", "—",
        fmt("%.2f", gqa.intensity()), true, gqa.intensity());
  }

  // --- Latency and throughput -----------------------------------------------------------------
  const std::string s4 = "Latency and throughput (延迟与吞吐量的理论分析), Llama 2 13B on an H100, S = 1024";
  const auto h100 = find_accelerator("h100");
  add(s4, "Llama 2 13B: D, F, N, K, H, L, V", "5120, 13824, 40, 40, 128, 40, 32000",
      std::to_string(l13.hidden_size) + ", " + std::to_string(l13.intermediate_size) + ", " + std::to_string(l13.num_heads) +
          ", " + std::to_string(l13.num_kv_heads) + ", " + std::to_string(l13.head_dim) + ", " +
          std::to_string(l13.num_layers) + ", " + std::to_string(l13.vocab_size),
      l13.hidden_size == 5120 && l13.num_kv_heads == 40, 0);
  add(s4, "Parameters", "≈ 13 billion", with_commas(static_cast<double>(l13.num_parameters())),
      close(static_cast<double>(l13.num_parameters()), 13e9, 0.04), static_cast<double>(l13.num_parameters()));
  for (auto [B, mem, lat, thr] : {std::tuple{1, 26.0, 8.0, 124.0}, std::tuple{64, 79.0, 24.0, 2700.0}}) {
    const auto p = memory_bound_latency(l13, 1024, B, h100);
    const std::string b = "B = " + std::to_string(B) + ": ";
    add(s4, b + "memory (weights + B KV caches)", fmt("≈ %.0f GB", mem), fmt("%.1f GB", p.memory_bytes / GB),
        close(p.memory_bytes / GB, mem, 0.035), p.memory_bytes / GB,
        B == 1 ? "agrees: 26.0 GB of weights and 0.84 GB of cache, which the lecture rounds down" : "");
    add(s4, b + "latency = memory / 3.35 TB/s", fmt("≈ %.0f ms", lat), fmt("%.2f ms", p.latency_s * 1e3),
        close(p.latency_s * 1e3, lat, 0.05), p.latency_s * 1e3);
    add(s4, b + "throughput = B / latency", fmt("≈ %.0f tokens/s", thr), fmt("%.0f tokens/s", p.throughput),
        close(p.throughput, thr, 0.02), p.throughput);
  }
  {
    const auto p = memory_bound_latency(l13, 1024, 256, h100);
    add(s4, "B = 256: memory", "≈ 240 GB", fmt("%.1f GB", p.memory_bytes / GB), close(p.memory_bytes / GB, 240, 0.01),
        p.memory_bytes / GB);
    add(s4, "B = 256 exceeds the H100's 80 GB", "does not fit", p.fits ? "fits" : "does not fit", !p.fits, p.memory_bytes);
    TransformerConfig g = l13;
    g.num_kv_heads = 8;
    const auto q64 = memory_bound_latency(g, 1024, 64, h100), q256 = memory_bound_latency(g, 1024, 256, h100);
    add(s4, "With GQA (K = 8), B = 64: much less memory, more throughput", "qualitative",
        fmt("%.1f GB, ", q64.memory_bytes / GB) + fmt("%.1f ms, ", q64.latency_s * 1e3) +
            fmt("%.0f tokens/s", q64.throughput),
        q64.memory_bytes < 79e9, q64.throughput);
    add(s4, "With GQA (K = 8), B = 256 now fits in an H100", "fits",
        fmt("%.1f GB: ", q256.memory_bytes / GB) + (q256.fits ? "fits, " : "does not fit, ") +
            fmt("%.0f tokens/s", q256.throughput),
        q256.fits, q256.throughput);
  }

  // --- GQA table --------------------------------------------------------------------------------
  const std::string s5 = "GQA table (KV Cache 大小对比), S = 4096, bf16, H100 80 GB";
  struct Row {
    const char* model;
    double mb;
    double ratio;
    double bmax;  // 0: "—"
  };
  for (const Row& r : {Row{"Llama-2-7B", 1024, 1, 50}, Row{"Llama-2-70B", 640, 8, 100}, Row{"Llama-3-8B", 256, 4, 200},
                       Row{"Llama-3-70B", 640, 8, 100}, Row{"Llama-3.1-405B", 1280, 16, 0}}) {
    const TransformerConfig m = find_model(r.model);
    const double kv = static_cast<double>(m.kv_cache_bytes(4096, 2));
    const std::string name = r.model;
    add(s5, name + ": KV cache per sequence", fmt("%.0f MB", r.mb), fmt("%.0f MiB", kv / MiB), close(kv / MiB, r.mb, 0.01),
        kv / MiB,
        name == "Llama-3.1-405B"
            ? "126 layers × 8 × 128 × 4096 × 2 × 2 bytes is 2016 MiB; the table's figure is 2 × 640, as if it had "
              "twice the layers of the 70B models and the same dropped factor of 2"
            : "S × K × H × L × 2 × 2 bytes is twice the table's figure (the same dropped factor of 2 as above)");
    const double ratio = static_cast<double>(m.num_heads) / static_cast<double>(m.num_kv_heads);
    add(s5, name + ": compression N/K", fmt("%.0f×", r.ratio), fmt("%.0f×", ratio), ratio == r.ratio, ratio);
    const double bmax = static_cast<double>(max_batch(m, 4096, h100.memory_bytes));
    const std::string comp = bmax < 0 ? "weights alone do not fit" : fmt("%.0f", bmax);
    if (r.bmax == 0) {
      add(s5, name + ": largest batch on one H100", "—", comp, bmax < 0, bmax);
    } else {
      add(s5, name + ": largest batch on one H100", fmt("≈ %.0f", r.bmax), comp, false, bmax,
          bmax < 0
              ? fmt("the bf16 weights (%.0f GB) are larger than the 80 GB of one H100, so no batch fits",
                    static_cast<double>(param_bytes(m)) / GB)
              : fmt("(80 GB − %.1f GB of weights) / the per-sequence cache; even with the table's halved cache it ",
                    static_cast<double>(param_bytes(m)) / GB) +
                    fmt("would be %.0f", std::floor((h100.memory_bytes - static_cast<double>(param_bytes(m))) / (kv / 2))));
    }
  }

  // --- MLA, CLA, local attention, summary table ------------------------------------------------
  const std::string s6 = "MLA, CLA, local attention (多头潜在注意力 …)";
  add(s6, "DeepSeek-V2 MHA KV width N × H (128 heads × 128)", "16384", with_commas(128.0 * 128), true, 16384);
  external(s6, "DeepSeek-V2 latent width C", "512", "kv_lora_rank in DeepSeek-V2's config.json");
  add(s6, "Compression N·H / C", "> 30×", fmt("%.0f×", 16384.0 / 512), 16384.0 / 512 > 30, 32,
      "(counting both K and V, MHA caches 2 × 16384 = 32768 values per token per layer against MLA's 576: 56.9×)");
  add(s6, "Latent plus the decoupled RoPE key: 512 + 64", "576", fmt("%.0f", 512.0 + 64), true, 576);
  add(s6, "Summary: GQA compresses 4–16× (Llama 3 8B: 32/8; 405B: 128/8)", "4–16×", "4× – 16×", true, 16);
  external(s6, "Summary: CLA 2–4×, MQA N×, local attention w/S", "2–4×, N×, w/S",
           "definitions: the sharing factor, the head count, the window over the sequence length. Chapter 05 counts "
           "CLA's exactly, L / ceil(L/s): 2.86× for s = 3 on 40 layers, not 3×; chapter 06 shows that w/S holds only "
           "when every layer is local (one global layer in six leaves Llama 3 8B at 6.1× by 128K tokens)");
  external(s6, "character.ai: one global-attention layer in every 6", "1 in 6", "character.ai's blog post (2024)");

  // --- Alternative architectures --------------------------------------------------------------
  const std::string s7 = "Alternative architectures (Transformer 的替代架构)";
  add(s7, "Jamba: 1 attention layer in 8 ⇒ KV cache about 8× smaller", "≈ 8×", fmt("%.0f×", 8.0 / 1), true, 8,
      "chapter 07 works Jamba-v0.1's config.json (`ch07_mamba jamba`): 4 attention layers of 8 KV heads of 128 keep "
      "16 KiB per token in bf16 against 128 KiB for 32 attention layers, 4.01 GiB against 32 GiB at 256K tokens, and "
      "the 28 Mamba layers' state is 8.3 MiB at any length");
  external(s7, "Jamba: 52B parameters, 12B active, 256K context; attention:Mamba ≈ 1:7", "52B / 12B / 256K",
           "AI21's Jamba paper (2024)");
  external(s7, "MiniMax-01: 456B-parameter MoE", "456B", "MiniMax-01 report (2025)");
  external(s7, "Mamba matches Transformers at 1B scale", "1B", "Gu & Dao (2023)");
  external(s7, "Diffusion refinement steps", "R = 8–32",
           "a typical range, not derivable; chapter 08 measures tokens per pass (L / R), FLOP per byte and the ELBO "
           "against R (`ch08_diffusion_lm`)");

  // --- Quantization ---------------------------------------------------------------------------
  const std::string s8 = "Quantization (量化与模型剪枝)";
  add(s8, "fp8 (e4m3) range", "[−240, 240]", fmt("±%.0f", e4m3_max(false)), false, e4m3_max(false),
      "the OCP E4M3FN format that Hopper implements reaches ±448; ±240 is the maximum only if the top exponent is "
      "reserved for infinities as in IEEE 754 (AMD's FNUZ variant also stops at 240)");
  add(s8, "int8 range", "[−128, 127]", "[−128, 127]", true, 127);
  add(s8, "int4 range", "[−8, 7]", "[−8, 7]", true, 7);
  add(s8, "Bytes per value: fp32, bf16, fp8, int8, int4", "4, 2, 1, 1, 0.5", "4, 2, 1, 1, 0.5", true, 0.5);
  add(s8, "Memory saved relative to fp32: bf16, fp8, int8, int4, int3", "2×, 4×, 4×, 8×, 10.7×",
      fmt("2×, 4×, 4×, 8×, %.1f×", 32.0 / 3), true, 32.0 / 3);
  add(s8, "int8 absmax quantization: divide by max |x|, multiply by 128", "× 128", "× 127", false, 127,
      "with 128 the largest magnitude maps to ±128, and +128 is outside int8's [−128, 127]; absmax scales by 127 (and "
      "LLM.int8() does)");
  external(s8, "LLM.int8(): outlier columns, slowdown, BLOOM 176B", "≈ 0.1%, 15–23%, 176B", "Dettmers et al. (2022)");
  add(s8, "AWQ fp16 → int4: memory reduction", "4×", fmt("%.0f×", 16.0 / 4), true, 4);
  {
    // AWQ as the paper (Lin et al. 2023) ships it and chapter 09 implements it (awq.h): int4 in
    // groups of 128 along each row's input, a 16-bit scale and zero point per group.
    const double awq_bits = 4 + 32.0 / 128, ch09_bits = 4 + 40.0 / 128;  // ch09: f32 scale, u8 zero
    add(s8, "AWQ fp16 → int4, counting the scale and zero point of each group of 128", "4×",
        fmt("%.2f×", 16 / awq_bits) + fmt(" (chapter 09's int4_g128_asym: %.2f×)", 16 / ch09_bits),
        close(16 / awq_bits, 4, 0.125), 16 / awq_bits,
        "4.25 bits per weight, not 4: the lecture's 4× rounds the group scales away");
    add(s8, "AWQ fp16 → int3: memory reduction", "4× (said of int3/int4)",
        fmt("%.1f×", 16.0 / 3) + fmt(", %.1f× with group scales", 16 / (3 + 32.0 / 128)), false, 16.0 / 3,
        "4× is int4's ratio; int3 stores 3 bits per weight (3.25 with the scales of groups of 128), so it saves more. "
        "Chapter 09 has no 3-bit format");
    add(s8, "AWQ keeps the most salient 0.1–1% of weights in high precision", "0.1–1% in fp16",
        "0% (every weight int4; salient input channels scaled up instead)", false, 0,
        "the AWQ paper measures that keeping 0.1–1% of the weights (the input channels with the largest activations) in "
        "fp16 recovers most of the quantisation loss, and then does not do it, because mixed precision is slow on "
        "hardware. What it ships, and chapter 09 implements (awq.h), quantises every weight: each input channel c is "
        "scaled up by s_c = mean|x_c|^α before rounding and its input divided by s_c, with α searched per layer group "
        "on calibration text");
    add(s8, "AWQ: 3.2× faster inference than fp16", "3.2×", fmt("≤ %.2f× (fp16 bytes / int4 bytes)", 16 / awq_bits), true,
        16 / awq_bits,
        "decoding reads every weight once per token, so the bytes bound the speed-up; the paper's 3.2× (its GPU "
        "kernels, Lin et al. 2023) is 85% of that bound. Chapter 09's `ch09_quantization speed` measures its formats "
        "against the same bound on the machine it runs on");
  }
  external(s8, "Pruning calibration set", "≈ 1024 samples", "NVIDIA's Minitron recipe");

  // --- Speculative sampling -------------------------------------------------------------------
  const std::string s9 = "Speculative sampling (投机采样)";
  {
    const double qa = 0.3, pa = 0.6, pb = 0.4;  // any p(A) > q(A)
    const double PA = pa * (qa / pa) + pb * 1 * 0, PB = pb * 1 + pa * (1 - qa / pa) * 1;
    add(s9, "Two-token proof: P[A] = q(A), P[B] = q(B) (q = (0.3, 0.7), p = (0.6, 0.4))", "exact",
        fmt("P[A] = %.3f, ", PA) + fmt("P[B] = %.3f", PB), std::fabs(PA - 0.3) < 1e-12 && std::fabs(PB - 0.7) < 1e-12, PA);
    add(s9, "Draft 4 tokens at 2 ms", "8 ms", fmt("%.0f ms", 4 * 2.0), true, 8);
    add(s9, "Round time: draft + 30 ms verification", "38 ms", fmt("%.0f ms", 4 * 2.0 + 30), true, 38);
    const double e8 = speculative_expected_tokens(0.8, 4), e5 = speculative_expected_tokens(0.5, 4);
    add(s9, "Expected tokens per round, α = 0.8, γ = 4", "≈ 3.54", fmt("%.4f", e8), false, e8,
        "the expectation is (1 − α^(γ+1)) / (1 − α) = 1 + α + α² + α³ + α⁴; the lecture adds (1 − α⁴) for the bonus "
        "token instead of α⁴");
    add(s9, "Speed-up at α = 0.8: tokens × 30 ms / 38 ms", "≈ 2.8×", fmt("%.2f×", e8 * 30 / 38), false, e8 * 30 / 38,
        "follows from the row above");
    add(s9, "Expected tokens at α = 0.5", "≈ 1.94", fmt("%.4f", e5), close(e5, 1.94, 0.003), e5,
        "(here the lecture uses the correct formula)");
    add(s9, "Speed-up at α = 0.5", "≈ 1.5×", fmt("%.2f×", e5 * 30 / 38), close(e5 * 30 / 38, 1.5, 0.034), e5 * 30 / 38);
    external(s9, "Target/draft pairs; end-to-end speed-up", "70B/8B, 8B/1B; ≈ 2×",
             "Leviathan et al. (2023), Chen et al. (2023); chapter 10 measures 1.4–2.0× at γ = 4 for a memory-bound "
             "100M-parameter model drafting for itself in int8 or q8_0 on a 2-core CPU, and none for the zoo's tiny models: "
             "tiny-draft drafting for tiny-mha accepts α = 0.79–0.86 but runs at 0.70–0.95×, because the cached "
             "3.5 MB target is not memory-bound and its pass over γ + 1 tokens costs 1.5–3.8 single steps "
             "(`ch10_speculative_sampling sweep`, docs/performance.md)");
  }

  // --- Dynamic workloads ----------------------------------------------------------------------
  const std::string s10 = "Continuous batching and PagedAttention (处理动态工作负载)";
  const double util = (10.0 + 50 + 100) / (3 * 100);
  add(s10, "Static batching of 10, 50, 100-token requests at batch 3: utilisation", "≈ 53%", fmt("%.1f%%", 100 * util),
      close(100 * util, 53, 0.01), util);
  external(s10, "Continuous batching throughput gain", "2–3×",
           "Orca (Yu et al., 2022); chapter 11 counts 2.6–3.4× in steps (a step costing the same at any batch) on "
           "seeded traces with log-normal output lengths at caps of 8–32, and measures 0.9–1.3× on a 2-core CPU, "
           "where a step's cost grows with its rows (`ch11_continuous_batching`, docs/performance.md)");
  add(s10, "Selective batching concatenates [3, H], [9, H], [5, H]", "[17, H]", fmt("[%.0f, H]", 3.0 + 9 + 5), true, 17);
  add(s10, "Paged storage removes internal and external fragmentation", "消除内部和外部碎片",
      "external: none; internal: up to B − 1 = 15 positions per sequence", false, 15,
      "a sequence's last block is partly empty, B/2 positions on average: internal fragmentation is bounded by one "
      "block, not removed. Chapter 12 measures 7.3% of the charged KV memory empty at B = 16 on chapter 11's trace, "
      "against 43.8% for max-length contiguous allocation (`ch12_paged_attention`, docs/performance.md)");
  return c;
}

std::string lecture_markdown() {
  const auto claims = lecture_claims();
  int agree = 0, disagree = 0, external = 0;
  for (const auto& c : claims) (c.verdict == Claim::Agree ? agree : c.verdict == Claim::Disagree ? disagree : external)++;
  std::ostringstream o;
  o << "# The lecture's numbers, recomputed\n\n"
    << "<!-- Generated by `ch00_workload lecture --markdown docs/lecture-numbers.md`; a test keeps this file and the\n"
    << "     code in step. Edit chapters/00_workload/lecture.cpp, not this page. -->\n\n"
    << "Every number in CS336 Lecture 10 (`../shared/lecture/`), each recomputed by chapter 00's code "
    << "(`chapters/00_workload/`). Model dimensions come from the models' published `config.json`; accelerator "
    << "figures come from NVIDIA's datasheets (dense bf16, decimal GB). A claim agrees when our value rounds to the "
    << "lecture's at the precision the lecture prints. Where the lecture's arithmetic is wrong, the code is right, "
    << "and the row says why. Figures that cite the outside world (usage statistics, paper results) are listed as "
    << "*external*: there is nothing to recompute.\n\n"
    << "**" << claims.size() << " claims: " << agree << " agree, " << disagree << " disagree, " << external
    << " external.**\n";
  std::string section;
  for (const auto& c : claims) {
    if (c.section != section) {
      section = c.section;
      o << "\n## " << section << "\n\n| claim | lecture | computed | verdict | note |\n|---|---|---|---|---|\n";
    }
    const char* v = c.verdict == Claim::Agree ? "agree" : c.verdict == Claim::Disagree ? "**disagree**" : "external";
    o << "| " << c.claim << " | " << c.lecture << " | " << (c.computed.empty() ? "—" : c.computed) << " | " << v << " | "
      << c.why << " |\n";
  }
  return o.str();
}

}  // namespace inferlab::ch00
