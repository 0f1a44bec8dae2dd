#include "common/cli.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/cuda/backend.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/lab.h"
#include "common/tokenizer.h"

#ifndef INFERLAB_DATA_DIR
#define INFERLAB_DATA_DIR "data"
#endif
#ifndef INFERLAB_DATA_FROM_BIN
#define INFERLAB_DATA_FROM_BIN "../share/inferlab/data"
#endif

namespace inferlab {

namespace fs = std::filesystem;

std::vector<std::string> data_dir_candidates(const std::string& exe_dir) {
  std::vector<std::string> out;
  if (!exe_dir.empty()) out.push_back((fs::path(exe_dir) / INFERLAB_DATA_FROM_BIN).lexically_normal().string());
  out.push_back(fs::path(INFERLAB_DATA_DIR).lexically_normal().string());
  return out;
}

DataDirLookup find_data_dir(const char* env_value, const std::vector<std::string>& candidates) {
  auto holds_data = [](const std::string& dir) {
    std::error_code ec;
    return fs::is_directory(fs::path(dir) / "models", ec);
  };
  DataDirLookup r;
  if (env_value != nullptr && *env_value != '\0') {
    r.tried.push_back(env_value);
    std::error_code ec;
    if (holds_data(env_value)) r.dir = env_value;
    else
      r.problem = detail::concat("INFERLAB_DATA is set to '", env_value, "', which ",
                                 fs::exists(env_value, ec) ? "has no models/ folder" : "does not exist",
                                 ": point it at the folder that holds models/ and corpus/, or unset it");
    return r;
  }
  r.tried = candidates;
  for (const std::string& c : candidates)
    if (holds_data(c)) {
      r.dir = c;
      return r;
    }
  std::string places;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    places += (i == 0 ? "" : i + 1 == candidates.size() ? " and " : ", ") + candidates[i];
  r.problem = detail::concat("no data folder (models/, corpus/) found: looked in ", places,
                             "; set INFERLAB_DATA to the folder that holds them");
  return r;
}

DataDirLookup find_data_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return find_data_dir(std::getenv("INFERLAB_DATA"), data_dir_candidates(ec ? "" : exe.parent_path().string()));
}

std::string data_dir() {
  DataDirLookup d = find_data_dir();
  return d.problem.empty() ? d.dir : d.tried.front();
}
std::string bundled_model(const std::string& name) { return data_dir() + "/models/" + name; }
std::string default_model_path() { return bundled_model("tiny-mha"); }

Device ModelOptions::resolved_device() const {
  if (device == "cpu") return Device::CPU;
  IL_CHECK(device == "cuda", "unknown device '", device, "' (use cpu or cuda)");
  cuda::require_device();
  return Device::CUDA;
}

SamplingParams GenerationOptions::sampling(const Tokenizer& tok, std::int64_t model_vocab,
                                           const std::string& model_path) const {
  check_tokenizer_vocab(tok, model_vocab, model_path);
  SamplingParams p{temperature, top_k, top_p, seed, tok.vocab_size()};
  validate(p);
  return p;
}

CLI::Validator number_in(double lo, double hi) {
  auto str = [](double v) {
    std::ostringstream o;
    o << std::setprecision(12) << v;
    return o.str();
  };
  const std::string range = "[" + str(lo) + ", " + str(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v)) return "'" + text + "' is not a finite number";
        if (v < lo || v > hi) return text + " is outside " + range;
        return "";
      },
      "in " + range);
}

CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // Digits only: CLI11 would read "-1" as 2^64 - 1 and "" as 0, and a value beyond 2^64 - 1
        // would wrap.
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range) return text + " is beyond the largest seed, 2^64 - 1";
        if (text.empty() || ec != std::errc() || stop != end)
          return "'" + text + "' is not a seed (a whole number in [0, 2^64 - 1])";
        return "";
      },
      "in [0, 2^64 - 1]");
}

namespace {
constexpr const char* kOutputCheck = "output path";  // the name run_cli finds output options by

CLI::Validator path_check(std::string (*reason)(const std::string&)) {
  return CLI::Validator(
      [reason](std::string& path) -> std::string {
        if (path.empty()) return "";
        const std::string why = reason(path);
        return why.empty() ? "" : "cannot write " + path + ": " + why;
      },
      "", kOutputCheck);
}

// The defaults of the output options of `app` and of the subcommands given, checked as the
// option's validator checks a value given on the command line; and every output's path, given
// or default, gathered in `paths` (flag by path) so that two outputs to one file are refused:
// the second would silently replace the first.
void check_default_outputs(CLI::App& app, std::map<std::string, std::string>& paths) {
  for (CLI::Option* opt : app.get_options()) {
    CLI::Validator* check = nullptr;
    try {
      check = opt->get_validator(kOutputCheck);
    } catch (const CLI::OptionNotFound&) {
      continue;
    }
    std::string value = opt->count() > 0 ? opt->results().front() : opt->get_default_str();
    if (opt->count() == 0)
      if (const std::string why = (*check)(value); !why.empty()) throw CLI::ValidationError(opt->get_name(), why);
    if (value.empty()) continue;
    std::error_code ec;
    const std::string key = std::filesystem::weakly_canonical(std::filesystem::absolute(value, ec), ec).string();
    const auto [it, fresh] = paths.emplace(ec ? value : key, opt->get_name());
    if (!fresh)
      throw CLI::ValidationError(opt->get_name(),
                                 value + " is also the path of " + it->second + ": each output needs a file of its own");
  }
  for (CLI::App* sub : app.get_subcommands()) check_default_outputs(*sub, paths);
}
}  // namespace

CLI::Validator output_file() { return path_check(&unwritable_file_reason); }
CLI::Validator output_folder() { return path_check(&unwritable_folder_reason); }

CLI::Validator input_file(const std::string& what) {
  return CLI::Validator(
      [what](std::string& path) -> std::string {
        try {
          require_regular_file(path, what);
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "");
}

void add_model_option(CLI::App& app, ModelOptions& o) {
  if (o.model.empty()) o.model = default_model_path();
  app.add_option("--model", o.model, "Model folder (config.json, *.safetensors, tokenizer.json) or file")
      ->capture_default_str();
}

void add_device_option(CLI::App& app, ModelOptions& o) {
  app.add_option("--device", o.device, "Where to run")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
}

void add_quality_options(CLI::App& app, std::int64_t& windows, std::int64_t& per_kind) {
  app.add_option("--windows", windows, "Validation windows of 512 tokens (0: all)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  app.add_option("--probes-per-kind", per_kind, "Probes of each kind (0: all)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
}

void add_json_option(CLI::App& app, std::string& path) {
  app.add_option("--json", path, "Write the results as JSON to this file")->check(output_file());
}

void add_common_options(CLI::App& app, CommonOptions& o) {
  add_model_option(app, o);
  add_device_option(app, o);
  add_generation_options(app, o);
  add_json_option(app, o.json);
}

void bare_run_options_only(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({}))
    for (CLI::Option* opt : app.get_options())
      if (opt != app.get_help_ptr() && opt != app.get_help_all_ptr()) sub->excludes(opt);
}

void help_footer(CLI::App& app, const std::string& bare_run, const std::string& readme, const std::string& lecture) {
  app.footer("Run bare: " + bare_run + "\nReads along with " + readme + " and the lecture's section " + lecture + ".");
}

void add_generation_options(CLI::App& app, GenerationOptions& o) {
  app.add_option("--prompt", o.prompt, "Prompt text")->capture_default_str();
  app.add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Random seed for sampling")->check(seed_number())->capture_default_str();
  app.add_option("--temperature", o.temperature, "Sampling temperature (0 = greedy)")
      ->check(number_in(0, 100))
      ->capture_default_str();
  app.add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = all)")
      ->check(number_in(0, 1 << 24))
      ->capture_default_str();
  app.add_option("--top-p", o.top_p, "Nucleus sampling mass, in (0, 1]")->check(number_in(1e-6, 1))->capture_default_str();
}

namespace {
std::string filesystem_error_message(const std::filesystem::filesystem_error& e) {
  // "cannot access <path>: <reason>", not the library's "filesystem error: status: <reason> [<path>]".
  std::string m = "cannot access " + e.path1().string();
  if (!e.path2().empty()) m += " (or " + e.path2().string() + ")";
  return m + ": " + e.code().message();
}
}  // namespace

double busy_cores(double seconds) {
  // /proc/stat's "cpuN" lines: the jiffies each CPU spent in each state since boot. Only the CPUs
  // this process may run on count (a container's cpuset, taskset), each busy for its share of
  // the interval that was not idle and not waiting for I/O.
  cpu_set_t mine;
  const bool masked = sched_getaffinity(0, sizeof mine, &mine) == 0;
  auto sample = [&](std::vector<double>& busy, std::vector<double>& total) {
    std::ifstream in("/proc/stat");
    busy.clear(), total.clear();
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
      std::istringstream fields(line.substr(3));
      int id = -1;
      double v[8] = {};
      fields >> id;
      for (double& x : v) fields >> x;
      if (!fields || id < 0 || (masked && (id >= CPU_SETSIZE || !CPU_ISSET(id, &mine)))) continue;
      double t = 0;
      for (double x : v) t += x;
      busy.push_back(t - v[3] - v[4]);
      total.push_back(t);
    }
    return !busy.empty();
  };
  std::vector<double> b0, t0, b1, t1;
  if (!sample(b0, t0)) return -1;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  if (!sample(b1, t1) || b1.size() != b0.size()) return -1;  // a CPU came or went: unknown
  double busy = 0;
  for (std::size_t i = 0; i < b0.size(); ++i)
    if (t1[i] > t0[i]) busy += std::clamp((b1[i] - b0[i]) / (t1[i] - t0[i]), 0.0, 1.0);
  return busy;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::clamp(sysconf(_SC_NPROCESSORS_ONLN), 1L, 4096L));
}

int threads_beside(double busy, int cores) {
  if (busy < 0) return cores;  // not known: all of them
  // A core counts as taken once other work keeps three quarters of it busy.
  const int taken = static_cast<int>(std::floor(busy + 0.25));
  return std::clamp(cores - taken, 1, cores);
}

void wait_passively(char** argv) {
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    changed = setenv("GOMP_SPINCOUNT", kWaitSpins, 1) == 0;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = usable_cores();
    const double busy = busy_cores(0.05);
    const int n = threads_beside(busy, cores);
    if (n < cores && setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1) == 0) {
      changed = true;
      std::fprintf(stderr,
                   "%s: other work keeps %.1f of this machine's %d cores busy: running on %d thread%s, so that its "
                   "timings hold%s (OMP_NUM_THREADS chooses)\n",
                   std::filesystem::path(argv[0]).filename().c_str(), busy, cores, n, n == 1 ? "" : "s",
                   n == 1 ? "; the work is timed by its thread's time on the CPU, which other programs taking turns "
                            "on its core do not add to"
                          : "");
    }
  }
  if (!changed) return;
  execv("/proc/self/exe", argv);
  // Still here: no /proc (or no exec). OpenMP keeps its defaults for this run.
}

namespace {
bool is_output(CLI::Option& opt) {
  try {
    return opt.get_validator(kOutputCheck) != nullptr;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

// " (smaller values of --context 16777216 may fit)": the options given to the command that ran
// and its parents, with their values; or what to try when only defaults were used.
std::string size_advice(CLI::App& app) {
  std::string given;
  std::function<void(CLI::App&)> collect = [&](CLI::App& a) {
    for (CLI::Option* opt : a.get_options()) {
      if (opt->count() == 0 || opt->get_expected_min() == 0 || is_output(*opt)) continue;
      given += (given.empty() ? "" : ", ") + opt->get_name();
      for (const std::string& v : opt->results()) given += " " + v;
    }
    for (CLI::App* sub : a.get_subcommands()) collect(*sub);
  };
  collect(app);
  return given.empty() ? " (the defaults need more memory than this machine has free)"
                       : " (smaller values of " + given + " may fit)";
}
}  // namespace

int run_cli(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
    std::map<std::string, std::string> outputs;
    check_default_outputs(app, outputs);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\nRun with --help for the options.\n";
    return 2;
  }
  // The bundled data (the default models, the corpus): a bad INFERLAB_DATA or an install without
  // its data is reported here, before a command runs into a missing file.
  if (const DataDirLookup d = find_data_dir(); !d.problem.empty()) {
    std::cerr << app.get_name() << ": error: " << d.problem << "\n";
    return 1;
  }
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave: their error, not ours
    std::cerr << app.get_name() << ": error: " << filesystem_error_message(e) << "\n";
    return 1;
  } catch (const lab::ExerciseNotDone& e) {  // a student tree's stub (common/lab.h)
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    // The loaders, caches and the generate loop name what they were allocating (with_context);
    // this is an allocation outside them. The advice names the options this command was given
    // (a fixed list named --max-new-tokens to commands that do not have it).
    std::cerr << app.get_name() << ": error: out of host memory" << size_advice(app) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": internal error: " << e.what() << "\n";
    return 1;
  }
}

void write_json(const std::string& path, const nlohmann::json& j, const std::vector<std::string>& inputs) {
  check_not_input(path, inputs);
  write_text(path, j.dump(2) + "\n");
}

void write_text(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

Progress::Progress(std::string label, std::int64_t total)
    : label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { finish(); }

void Progress::update(std::int64_t done) {
  const double t = timer_.seconds();
  if (tty_) {
    if (t < 2.0 || (t - last_print_ < 0.1 && done < total_)) return;
  } else if (t < 10.0 || (printed_ && t - last_print_ < 30.0)) {  // a log gets a line now and then, not a stream
    return;
  }
  last_print_ = t, printed_ = true;
  std::fprintf(stderr, "%s%s %lld/%lld (%d%%), %.1f s%s", tty_ ? "\r" : "", label_.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), total_ > 0 ? static_cast<int>(100 * done / total_) : 0, t,
               tty_ ? "\033[K" : "\n");
  std::fflush(stderr);
}

void Progress::finish() {
  if (printed_ && tty_) std::fprintf(stderr, "\n");
  printed_ = false;
}

}  // namespace inferlab
