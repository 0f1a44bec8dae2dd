// ch01_naive_decode: generation that re-runs the whole sequence for every token, with each
// step's time and counted FLOPs, so the cost's growth is there to see.
#include <cmath>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/convert.h"
#include "chapters/01_naive_decode/generate.h"
#include "common/cli.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch01;
using namespace inferlab::models;

namespace {

std::optional<double> power_law_exponent(const std::vector<double>& x, const std::vector<double>& y) {
  const plot::PowerLaw p = plot::fit_power_law(x, y);
  return p.ok ? std::optional<double>(p.exponent) : std::nullopt;
}

// Time per step against the length of the sequence it runs over, with the power law fitted to it.
void plot_steps(const std::vector<double>& len, const std::vector<double>& secs, std::optional<double> attn_exponent,
                const std::string& model, const std::string& path) {
  plot::Figure f;
  f.title = "Naive decoding: every step re-runs the whole sequence (" + model + ")";
  f.x.label = "tokens in the sequence (the step's position + 1)";
  f.y.label = "time per token (ms)";
  plot::Series s;
  s.label = "measured, one step each";
  s.line = false, s.markers = true;
  for (std::size_t i = 0; i < len.size(); ++i) s.x.push_back(len[i]), s.y.push_back(secs[i] * 1e3);
  f.series.push_back(s);
  const plot::PowerLaw fit = plot::fit_power_law(s.x, s.y);
  if (fit.ok && len.size() > 1) {
    char label[96];
    std::snprintf(label, sizeof label, "fit: time ∝ T^%.2f", fit.exponent);
    plot::Series c = plot::curve(label, len.front(), len.back(), 64, false, fit);
    c.dashed = true;
    f.series.push_back(c);
  }
  if (attn_exponent) {
    // A legend entry without points: the FLOPs the run counted, fitted the same way.
    plot::Series note;
    char label[96];
    std::snprintf(label, sizeof label, "(attention FLOPs per step ∝ T^%.2f)", *attn_exponent);
    note.label = label;
    note.line = false, note.color = "none";
    f.series.push_back(note);
  }
  plot::save_svg(f, path);
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 01: naive decoding, re-running the whole sequence for every new token", "ch01_naive_decode"};
  CommonOptions o;
  std::string tokenizer_path, dtype = "f32", svg;
  bool all_steps = false;
  add_common_options(app, o);
  help_footer(app,
              "tiny-mha continues \"Once upon a time\" for 32 tokens, re-running the whole sequence each step, "
              "with each step's time and FLOPs",
              "chapters/01_naive_decode/README.md", "朴素推理与 KV Cache");
  app.add_option("--tokenizer", tokenizer_path, "Tokenizer file (default: the one beside the model)");
  app.add_option("--dtype", dtype, "Weight dtype: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_flag("--steps", all_steps, "Print every step (default: eight spread over the run)");
  app.add_option("--svg", svg, "Also plot the time per token against position as SVG")->check(output_file());
  std::string conv_in, conv_out, conv_to;
  auto* conv = app.add_subcommand("convert", "Convert between a llama2.c checkpoint and a Hugging Face folder");
  conv->add_option("input", conv_in, "llama2.c .bin checkpoint, or Hugging Face model folder")->required();
  conv->add_option("output", conv_out, "output folder (to hf) or .bin file (to llama2c)")
      ->required()
      ->check(output_folder());
  conv->add_option("--to", conv_to, "hf or llama2c")->required()->check(CLI::IsMember({"hf", "llama2c"}));
  conv->add_option("--tokenizer", tokenizer_path, "llama2.c tokenizer.bin (default: the one beside the checkpoint)");
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*conv) {
      if (conv_to == "hf") convert_llama2c_to_hf(conv_in, tokenizer_path, conv_out);
      else convert_hf_to_llama2c(conv_in, conv_out);
      std::printf("wrote %s\n", conv_out.c_str());
      return 0;
    }
    const Device dev = o.resolved_device();
    const DType wt = dtype == "bf16" ? DType::BF16 : dtype == "f16" ? DType::F16 : DType::F32;
    Llama m = load_llama(o.model).to(dev, wt);
    const auto tok = Tokenizer::for_model(o.model, tokenizer_path);
    const auto prompt = tok->encode(o.prompt);          // an empty prompt is the BOS token alone
    check_context(m, prompt.size(), o.max_new_tokens);  // before the prompt is echoed
    std::vector<std::int64_t> eos = m.config.eos_token_ids;
    if (m.rope_pairing == RopePairing::Adjacent) eos.push_back(1);  // llama2.c models end a story with BOS
    std::printf("%s: %s, %.2f M parameters, %s weights on %s\n", app.get_name().c_str(), m.source.c_str(),
                static_cast<double>(m.config.num_parameters()) / 1e6, dtype_name(m.weight_dtype()).data(),
                device_name(dev).data());
    std::printf("naive decoding: each step runs the forward pass over the whole sequence so far\n\n");
    Sampler sampler(o.sampling(*tok, m.config.vocab_size));
    TextStream stream(*tok, prompt);
    const Generation g =
        generate_naive(m, prompt, o.max_new_tokens, sampler, eos, [&](const Generation& gen) { stream.print(gen.tokens); });
    std::printf("\n\n%6s %8s %11s %14s %14s %10s\n", "step", "tokens", "time (ms)", "attn MFLOP", "other MFLOP", "MB moved");
    std::vector<double> len, attn, other, secs;
    double total_s = 0, total_flops = 0;
    for (const Step& s : g.steps) total_s += s.seconds, total_flops += s.work.flops;
    // Per-step split of the work: attention (grows like T²) against the rest (like T).
    for (std::size_t i = 0; i < g.steps.size(); ++i) {
      const Step& s = g.steps[i];
      const double at = s.attention_flops, rest = s.work.flops - s.attention_flops;
      len.push_back(static_cast<double>(s.tokens_in)), attn.push_back(at), other.push_back(rest), secs.push_back(s.seconds);
      const std::size_t n = g.steps.size();
      const bool show = all_steps || n <= 8 || i == 0 || i + 1 == n || i % std::max<std::size_t>(1, n / 6) == 0;
      if (show)
        std::printf("%6zu %8lld %11.3f %14.3f %14.3f %10.2f\n", i + 1, static_cast<long long>(s.tokens_in), s.seconds * 1e3,
                    at / 1e6, rest / 1e6, s.work.bytes / 1e6);
    }
    const std::optional<double> ea = power_law_exponent(len, attn), eo = power_law_exponent(len, other);
    std::printf("\n%zu tokens in %.1f ms (%.1f tokens/s), %.3f GFLOP in all%s.\n", g.generated.size(), total_s * 1e3,
                static_cast<double>(g.generated.size()) / total_s, total_flops / 1e9,
                g.stopped_at_eos ? "; the model ended the text (an end-of-text token)" : "");
    if (ea && eo)
      std::printf(
          "Per step, attention FLOPs grow like T^%.2f and the rest like T^%.2f; summed over T steps, the\n"
          "attention costs O(T^3) and the rest O(T^2). Chapter 02's KV cache makes each step O(T).\n",
          *ea, *eo);
    else
      std::printf(
          "With %zu step%s there is no growth to fit (it takes two lengths or more; more --max-new-tokens, or\n"
          "a prompt the model does not end at once).\n",
          g.steps.size(), g.steps.size() == 1 ? "" : "s");
    if (!svg.empty()) plot_steps(len, secs, ea, m.source.substr(m.source.find_last_of('/') + 1), svg);
    if (!o.json.empty()) {
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& s : g.steps)
        steps.push_back({{"tokens_in", s.tokens_in},
                         {"seconds", s.seconds},
                         {"flops", s.work.flops},
                         {"attention_flops", s.attention_flops},
                         {"bytes", s.work.bytes},
                         {"token", s.token}});
      write_json(o.json,
                 {{"model", m.source},
                  {"device", device_name(dev)},
                  {"weight_dtype", dtype_name(m.weight_dtype())},
                  {"prompt", o.prompt},
                  {"prompt_tokens", prompt},
                  {"generated_tokens", g.generated},
                  {"text", tok->decode(g.generated, true)},
                  {"steps", steps},
                  {"attention_flops_exponent", ea ? nlohmann::json(*ea) : nlohmann::json()},
                  {"other_flops_exponent", eo ? nlohmann::json(*eo) : nlohmann::json()}},
                 {o.model, tokenizer_path});
    }
    return 0;
  });
}
