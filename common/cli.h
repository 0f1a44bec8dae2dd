#pragma once
/// @file cli.h
/// @brief The command-line options every chapter executable shares, and its error handling.
///
/// The `chNN_*` programs share their flags (CLI11), registered on exactly the (sub)commands that
/// use them, so that `--help` never lists an option a command would ignore:
///   model:       --model PATH (model folder or file)       --device cpu|cuda
///   generation:  --prompt TEXT  --max-new-tokens N  --seed N  --temperature T  --top-k K  --top-p P
///   output:      --json FILE
/// Every `--help` ends with what a bare run does and what it reads along with (help_footer).
/// Each program runs its body through run_cli(), which turns any inferlab::Error into one clear
/// line on stderr and exit status 1 (2 for a bad command line), so that nothing ends in a crash.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>
#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"
#include "common/metrics.h"
#include "common/sampling.h"

namespace inferlab {

class Tokenizer;

/// Which model to run, and where.
struct ModelOptions {
  std::string model;  ///< defaults to default_model_path()
  std::string device = "cpu";
  /// The device asked for; throws "no CUDA device available: <reason>" for cuda without one.
  Device resolved_device() const;
};

/// What to generate and how to sample it.
struct GenerationOptions {
  std::string prompt = "Once upon a time";
  int max_new_tokens = 32;
  std::uint64_t seed = 0;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  /// The sampling options for a model (at `model_path`) whose embedding table has `model_vocab`
  /// rows, generating with `tok`: only the tokenizer's ids are ever sampled (a padded table's
  /// extra rows decode to nothing; see SamplingParams::vocab). Throws when the two do not fit
  /// (check_tokenizer_vocab: a llama2.c tokenizer.bin must match exactly).
  SamplingParams sampling(const Tokenizer& tok, std::int64_t model_vocab, const std::string& model_path) const;
};

/// The options of a chapter that generates text: a model, generation, and --json.
struct CommonOptions : ModelOptions, GenerationOptions {
  std::string json;  ///< where to write machine-readable results ("" = nowhere)
  SamplingParams sampling(const Tokenizer& tok, std::int64_t model_vocab) const {
    return GenerationOptions::sampling(tok, model_vocab, model);
  }
};

/// A CLI11 check that an option is a finite number in [lo, hi], with a message in plain words
/// ("0 is outside [1, 16777216]") instead of CLI11's default (which prints DBL_MAX in full).
CLI::Validator number_in(double lo, double hi);

/// A CLI11 check that an option is a seed: decimal digits only, at most 2^64 - 1 ("-1", "" and
/// 2^64 + 1 are refused rather than read as 2^64 - 1, 0 and 1).
CLI::Validator seed_number();

/// A CLI11 check that an option names a file the command can write (unwritable_file_reason): its
/// folder exists and is writable. "" passes (no output). It runs as the command line is parsed,
/// so a mistyped path is a usage error naming the flag ("--json: cannot write /no/dir/x.json:
/// folder /no/dir does not exist") before any work; run_cli checks a default the same way.
CLI::Validator output_file();
/// The same for a folder the command creates and fills (unwritable_folder_reason).
CLI::Validator output_folder();
/// A CLI11 check that an option names a regular file to read (require_regular_file), `what` it
/// is in the message: "--points: cannot open roofline points /no/such.json: No such file or
/// directory".
CLI::Validator input_file(const std::string& what);

/// A bundled model's folder: `data_dir()/models/<name>` (tiny-mha, tiny-mamba, ...).
std::string bundled_model(const std::string& name);
/// The bundled default model: `data_dir()/models/tiny-mha`.
std::string default_model_path();
/// The folder holding the bundled models and corpus: the first of data_dir_candidates() that
/// exists (find_data_dir). When none does it returns the first place looked at, so that defaults
/// still print, and run_cli() reports the problem before any command runs.
std::string data_dir();

/// Where the bundled data was looked for, and what was found (find_data_dir).
struct DataDirLookup {
  std::string dir;                 ///< the folder found, "" when there is none
  std::vector<std::string> tried;  ///< every place looked at, in order
  std::string problem;             ///< "" when found; else an error naming the places and INFERLAB_DATA
};

/// The places an executable looks for its data when INFERLAB_DATA is not set, in order:
/// `exe_dir`/../share/inferlab/data (an installed executable: the install tree's data beside its
/// bin/, from any prefix), then the source tree's data/ (an executable in the build tree).
std::vector<std::string> data_dir_candidates(const std::string& exe_dir);

/// The data folder: `env_value` ($INFERLAB_DATA) when it is set and not empty, and then nowhere
/// else; otherwise the first of `candidates` that exists. A folder counts when it holds models/.
DataDirLookup find_data_dir(const char* env_value, const std::vector<std::string>& candidates);

/// find_data_dir for this process: $INFERLAB_DATA, and the candidates beside this executable
/// (/proc/self/exe).
DataDirLookup find_data_dir();

/// --model (default: the bundled model, unless `o.model` already names another).
void add_model_option(CLI::App& app, ModelOptions& o);
/// --device cpu|cuda.
void add_device_option(CLI::App& app, ModelOptions& o);
/// --prompt, --max-new-tokens, --seed, --temperature, --top-k, --top-p.
void add_generation_options(CLI::App& app, GenerationOptions& o);
/// --json FILE, checked with output_file().
void add_json_option(CLI::App& app, std::string& path);
/// --windows N (validation windows of 512 tokens, 0: all) and --probes-per-kind N (0: all): what a
/// quality table (eval::quality_table) measures.
void add_quality_options(CLI::App& app, std::int64_t& windows, std::int64_t& per_kind);
/// All of the above: for the commands that load a model and generate with it.
void add_common_options(CLI::App& app, CommonOptions& o);

/// The program's own options belong to its bare run: given together with a subcommand (which
/// registers the options it uses itself) they are a command-line error, not silently ignored.
/// Call after adding the subcommands.
void bare_run_options_only(CLI::App& app);

/// The last lines of `--help`: what a bare run does, and the README and lecture section the
/// program reads along with.
void help_footer(CLI::App& app, const std::string& bare_run, const std::string& readme, const std::string& lecture);

/// The first line of every chapter's main(): sets OpenMP up so that timings hold on a machine
/// other jobs are using.
///  - Waiting threads spin briefly, then sleep (GOMP_SPINCOUNT=kWaitSpins: some 20-50 µs of
///    `pause`), unless the environment sets OMP_WAIT_POLICY or GOMP_SPINCOUNT. With the default
///    policy, threads that finish a parallel region first spin for milliseconds and take the cores
///    the program's own threads need: a decode step measured 400 ms spinning and 11 ms passive
///    (docs/performance.md). Sleeping at once (OMP_WAIT_POLICY=passive) costs a wake-up, tens of
///    µs on a VM, at every one of a decode step's dozens of regions, which is as long as a small
///    model's products themselves; a spin that short catches the next region without holding a
///    core another program needs for longer than that.
///  - Cores that other work keeps busy (sampled over 50 ms, busy_cores) are left to it
///    (OMP_NUM_THREADS, unless the environment sets it; a line on stderr says so): a region of
///    two threads ends when the later one does, and on a taken core the scheduler sets it aside
///    for a time slice now and then, which short regions feel most.
///  - On one thread, a measured speed counts the thread's CPU time (metrics::Clock::Work), so a
///    thread that takes turns on a core with other work is timed by the turns it ran, and its
///    ceiling is measured the same way.
/// OpenMP reads its settings once, when the program loads, so this sets them and runs the program
/// again (execv of /proc/self/exe with the same argv); where that cannot be done the program
/// carries on as it is.
void wait_passively(char** argv);
/// The spin count wait_passively sets (libgomp's GOMP_SPINCOUNT): iterations of a `pause` loop,
/// 20 ns each on the development machine's Xeon.
inline constexpr const char* kWaitSpins = "1000";
/// How many of the cores this process may run on other work keeps busy, sampled from
/// /proc/stat's per-CPU lines over `seconds` (-1 when it cannot tell).
double busy_cores(double seconds);
/// The cores this process may run on (its affinity mask).
int usable_cores();
/// The threads a program takes beside `busy` cores of other work on `cores`: every core but
/// those at least three quarters busy, and at least one (all of them when `busy` is unknown).
int threads_beside(double busy, int cores);

/// Parses argv and runs `body`; returns the process exit status (0 ok, 1 error, 2 usage). Before
/// the body, the defaults of the output options (output_file, output_folder) of the commands
/// given are checked as a given value is.
int run_cli(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

/// Writes `j` (pretty-printed) to `path`; throws naming the path on failure, or when `path` is
/// one of `inputs` (the model the command read: see check_not_input).
void write_json(const std::string& path, const nlohmann::json& j, const std::vector<std::string>& inputs = {});
/// Writes `text` to `path`, complete or not at all (write_file_atomically); throws naming the
/// path on failure.
void write_text(const std::string& path, const std::string& text);

/// A progress line on stderr for long work, its label saying what is measured ("tiny-mamba:
/// probes"): on a terminal "label 37/120 (31%), 4.2 s" redrawn in place from two seconds on;
/// when stderr is a file or pipe, a line after ten seconds and then one every thirty, so that a
/// log holds a few lines, not one per step.
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
  bool printed_ = false, tty_;
};

}  // namespace inferlab
