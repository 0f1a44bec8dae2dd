#pragma once
/// @file cli.h
/// @brief The command-line options every chapter executable shares, and its error handling.
///
/// Every `chNN_*` program takes the same core flags (CLI11):
///   --model PATH          model folder (config.json + safetensors + tokenizer.json) or file
///   --prompt TEXT         --max-new-tokens N   --device cpu|cuda   --seed N
///   --temperature T       --top-k K            --top-p P           --json FILE
/// and runs its body through run_cli(), which turns any inferlab::Error into one clear line on
/// stderr and exit status 1 (2 for a bad command line), so that nothing ends in a crash.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "common/dtype.h"
#include "common/metrics.h"
#include "common/sampling.h"

namespace inferlab {

class Tokenizer;

struct CommonOptions {
  std::string model;  ///< defaults to default_model_path()
  std::string prompt = "Once upon a time";
  int max_new_tokens = 32;
  std::string device = "cpu";
  std::uint64_t seed = 0;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  std::string json;  ///< where to write machine-readable results ("" = nowhere)

  /// The device asked for; throws "no CUDA device available: <reason>" for cuda without one.
  Device resolved_device() const;
  /// The sampling options for a model (this->model) whose embedding table has `model_vocab`
  /// rows, generating with `tok`: only the tokenizer's ids are ever sampled (a padded table's
  /// extra rows decode to nothing; see SamplingParams::vocab). Throws when the two do not fit
  /// (check_tokenizer_vocab: a llama2.c tokenizer.bin must match exactly).
  SamplingParams sampling(const Tokenizer& tok, std::int64_t model_vocab) const;
};

/// Throws if any of `options` was given on the command line: for the (sub)commands that do
/// not use them, so that e.g. `--device cuda` there is an error rather than silently ignored.
/// The error names the command as parsed: the program and its subcommand, if one was chosen.
void reject_options(const CLI::App& app, std::initializer_list<const char*> options);

/// A CLI11 check that an option is a finite number in [lo, hi], with a message in plain words
/// ("0 is outside [1, 16777216]") instead of CLI11's default (which prints DBL_MAX in full).
CLI::Validator number_in(double lo, double hi);

/// The bundled default model: `data_dir()/models/tiny-mha`.
std::string default_model_path();
/// The folder holding the bundled models and goldens (set at configure time).
std::string data_dir();

/// Registers the shared options on `app`.
void add_common_options(CLI::App& app, CommonOptions& o);

/// Parses argv and runs `body`; returns the process exit status (0 ok, 1 error, 2 usage).
int run_cli(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

/// Writes `j` (pretty-printed) to `path`; throws naming the path on failure.
void write_json(const std::string& path, const nlohmann::json& j);
/// Writes `text` to `path`; throws naming the path on failure.
void write_text(const std::string& path, const std::string& text);

/// A progress line on stderr for work that takes more than about two seconds: silent before
/// that, then "label 37/120 (31%), 4.2 s" redrawn in place on a terminal, or a line every 10%
/// when stderr is a file or pipe.
class Progress {
 public:
  Progress(std::string label, std::int64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(std::int64_t done);
  void finish();

 private:
  std::string label_;
  std::int64_t total_;
  metrics::Timer timer_;
  double last_print_ = 0;
  int last_decile_ = -1;
  bool printed_ = false, tty_;
};

}  // namespace inferlab
