// The shared command line: defaults, validation, and errors that end in a clear message and
// a non-zero exit status rather than a crash.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <new>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/json_file.h"
#include "common/tokenizer.h"
#include "test_util.h"

namespace inferlab {
namespace {

struct CliRun {
  int status;
  std::string err;
  CommonOptions opts;
};

CliRun run(std::vector<std::string> args, const std::function<int(const CommonOptions&)>& body = nullptr) {
  CLI::App app{"test", "chXX_test"};
  CommonOptions o;
  add_common_options(app, o);
  args.insert(args.begin(), "chXX_test");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::stringstream err;
  auto* old = std::cerr.rdbuf(err.rdbuf());
  const int status = run_cli(app, static_cast<int>(argv.size()), argv.data(), [&] { return body ? body(o) : 0; });
  std::cerr.rdbuf(old);
  return {status, err.str(), o};
}

// run_cli on `app` with a body that does nothing; `err` receives what it printed.
int run_app(CLI::App& app, std::vector<std::string> args, std::string* err) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::stringstream e;
  auto* old = std::cerr.rdbuf(e.rdbuf());
  const int st = run_cli(app, static_cast<int>(argv.size()), argv.data(), [] { return 0; });
  std::cerr.rdbuf(old);
  *err = e.str();
  return st;
}

TEST(Cli, DefaultsAndParsing) {
  CliRun r = run({});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.opts.model, default_model_path());
  EXPECT_EQ(r.opts.device, "cpu");
  r = run({"--prompt", "Hi there", "--max-new-tokens", "5", "--temperature", "0.7", "--top-k", "40", "--top-p", "0.9",
           "--seed", "3", "--json", "out.json"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.opts.prompt, "Hi there");
  EXPECT_EQ(r.opts.max_new_tokens, 5);
  const HfTokenizer tok = HfTokenizer::load(default_model_path());  // 988 tokens for 1024 embedding rows
  EXPECT_EQ(r.opts.sampling(tok, 1024).top_k, 40);
  EXPECT_FLOAT_EQ(r.opts.sampling(tok, 1024).top_p, 0.9f);
  EXPECT_EQ(r.opts.sampling(tok, 1024).vocab, 988);  // the padded rows 988..1023 are never sampled
  test::expect_error([&] { r.opts.sampling(tok, 900); }, {"988 tokens do not fit the vocabulary of 900"});
  EXPECT_EQ(r.opts.json, "out.json");
}

TEST(Cli, BadCommandLinesExitWithStatus2AndSayWhy) {
  for (const auto& [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--bogus"}, "--bogus"},
           {{"--device", "tpu"}, "tpu"},
           {{"--max-new-tokens", "-3"}, "max-new-tokens"},
           {{"--top-p", "1.5"}, "top-p"},
           {{"--temperature", "hot"}, "temperature"},
           {{"--temperature", "nan"}, "'nan' is not a finite number"},
           {{"--max-new-tokens", "0"}, "0 is outside [1, 1048576]"},
           {{"--max-new-tokens", "99999999999999999999"}, "outside [1, 1048576]"},
           {{"--seed", "-1"}, "--seed: '-1' is not a seed (a whole number in [0, 2^64 - 1])"},
           {{"--seed", ""}, "--seed: '' is not a seed"},
           {{"--seed", "1e3"}, "'1e3' is not a seed"},
           {{"--seed", "18446744073709551616"}, "18446744073709551616 is beyond the largest seed, 2^64 - 1"},
           {{"--seed", "18446744073709551617"}, "18446744073709551617 is beyond the largest seed"},
           {{"--top-p", "0"}, "top-p"}}) {
    CliRun r = run(args);
    EXPECT_EQ(r.status, 2) << args[0];
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
  }
}

TEST(Cli, ErrorsInTheBodyExitWithStatus1AndAMessage) {
  CliRun r = run({"--model", "/no/such/model"}, [](const CommonOptions& o) -> int { fail("cannot open ", o.model); });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("error: cannot open /no/such/model"), std::string::npos) << r.err;
  const std::string reason = cuda::unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "a CUDA device is available; the no-device message cannot be checked here";
  r = run({"--device", "cuda"}, [](const CommonOptions& o) {
    o.resolved_device();
    return 0;
  });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no CUDA device available: " + reason), std::string::npos) << r.err;
  // The reason says what is missing in plain words first; the runtime's own message (for a
  // machine without a GPU, "CUDA driver version is insufficient for CUDA runtime version") is
  // only its detail.
  bool plain = false;
  for (const char* start : {"this machine has no NVIDIA GPU", "this build has no CUDA backend", "the NVIDIA driver supports",
                            "the CUDA runtime cannot reach a GPU", "device 0 ("})
    plain = plain || reason.rfind(start, 0) == 0;
  EXPECT_TRUE(plain) << reason;
}

// What escapes a body without a better name still says what and where: a path the filesystem
// refused ("cannot access <path>: <reason>", not "filesystem error: status: ... [<path>]"), and
// running out of memory with what may fit.
TEST(Cli, FilesystemErrorsAndRunningOutOfMemoryEndInAMessageThatHelps) {
  CliRun r = run({}, [](const CommonOptions&) -> int {
    throw std::filesystem::filesystem_error("status", std::filesystem::path("/models/loop"),
                                            std::make_error_code(std::errc::too_many_symbolic_link_levels));
  });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("chXX_test: error: cannot access /models/loop: Too many levels of symbolic links"), std::string::npos)
      << r.err;
  r = run({}, [](const CommonOptions&) -> int { throw std::bad_alloc(); });
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("error: out of host memory (the defaults need more memory than this machine has free)"),
            std::string::npos)
      << r.err;
  // The advice names the options this command was given (chapter 12's `speed --context 16777216`
  // was told to use fewer --max-new-tokens, which it does not take); outputs are not sizes.
  r = run({"--max-new-tokens", "4096", "--json", "x.json"}, [](const CommonOptions&) -> int { throw std::bad_alloc(); });
  EXPECT_NE(r.err.find("error: out of host memory (smaller values of --max-new-tokens 4096 may fit)"), std::string::npos)
      << r.err;
}

// An option is registered on exactly the (sub)commands that use it, so one that a command would
// ignore is a command-line error (status 2), and --help lists only what the command takes.
TEST(Cli, OptionsACommandDoesNotUseAreNotAccepted) {
  auto status = [](std::vector<std::string> args, std::string* help = nullptr) {
    CLI::App app{"test", "chXX_test"};
    CommonOptions o;
    add_model_option(app, o);  // the bare run's option
    help_footer(app, "does a thing", "chapters/XX/README.md", "一节");
    CLI::App* calc = app.add_subcommand("calc", "a subcommand");
    add_json_option(*calc, o.json);
    bare_run_options_only(app);
    args.insert(args.begin(), "chXX_test");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    std::stringstream out, err;
    auto* old_out = std::cout.rdbuf(out.rdbuf());
    auto* old_err = std::cerr.rdbuf(err.rdbuf());
    const int s = run_cli(app, static_cast<int>(argv.size()), argv.data(), [] { return 0; });
    std::cout.rdbuf(old_out), std::cerr.rdbuf(old_err);
    if (help) *help = out.str();
    return s;
  };
  EXPECT_EQ(status({"--model", "m"}), 0);
  EXPECT_EQ(status({"calc", "--json", "x.json"}), 0);
  EXPECT_EQ(status({"calc", "--model", "m"}), 2);  // calc takes no model
  EXPECT_EQ(status({"--model", "m", "calc"}), 2);  // the bare run's option with a subcommand
  EXPECT_EQ(status({"--device", "cuda"}), 2);      // never registered
  std::string help;
  EXPECT_EQ(status({"--help"}, &help), 0);
  EXPECT_NE(help.find("--model"), std::string::npos) << help;
  EXPECT_EQ(help.find("--json"), std::string::npos) << help;
  EXPECT_NE(help.find("Run bare: does a thing\nReads along with chapters/XX/README.md and the lecture's section 一节."),
            std::string::npos)
      << help;
}

// An output path is checked as the command line is parsed: a mistyped folder used to fail only
// when the results were written, after the whole run.
// A seed is read exactly: 2^64 - 1 is the largest, and 2^64 + 1 is refused rather than wrapped
// to 1 (the campaign found it giving 2^64 - 1's text).
TEST(Cli, SeedsAreReadExactly) {
  const CliRun r = run({"--seed", "18446744073709551615"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.opts.seed, 18446744073709551615ull);
  EXPECT_EQ(run({"--seed", "0"}).opts.seed, 0u);
}

// Two outputs to one path (chapter 06's `recall --svg X --reach-svg X`): the second would replace
// the first, so the command line is refused, whether the paths are spelled alike or not.
TEST(Cli, TwoOutputsToOnePathAreRefused) {
  test::TempDir dir;
  auto status = [&](std::vector<std::string> args, std::string* err) {
    CLI::App app{"test", "chXX_test"};
    std::string svg, reach_svg, json;
    CLI::App* recall = app.add_subcommand("recall", "two plots");
    recall->add_option("--svg", svg, "a plot")->check(output_file());
    recall->add_option("--reach-svg", reach_svg, "another plot")->check(output_file());
    add_json_option(*recall, json);
    args.insert(args.begin(), {"chXX_test", "recall"});
    return run_app(app, args, err);
  };
  const std::string x = dir.file("x.svg");
  std::string err;
  EXPECT_EQ(status({"--svg", x, "--reach-svg", x}, &err), 2);
  EXPECT_NE(err.find("--reach-svg: " + x + " is also the path of --svg: each output needs a file of its own"),
            std::string::npos)
      << err;
  EXPECT_EQ(status({"--svg", x, "--json", dir.path().string() + "/./x.svg"}, &err), 2);
  EXPECT_NE(err.find("is also the path of --svg"), std::string::npos) << err;
  EXPECT_EQ(status({"--svg", x, "--reach-svg", dir.file("y.svg"), "--json", ""}, &err), 0) << err;
  EXPECT_EQ(status({"--svg", "", "--reach-svg", ""}, &err), 0) << err;  // '' is no output
}

// A device node, a FIFO or a socket is not a file to replace: `--json /dev/null` is refused as
// the command line is parsed (as root, the rename used to replace /dev/null with a file).
TEST(Cli, AnOutputThatIsADeviceOrAFifoIsRefused) {
  test::TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [path, words] : std::vector<std::pair<std::string, std::string>>{
           {"/dev/null", "--json: cannot write /dev/null: it is a character device, not a regular file"},
           {fifo, "it is a FIFO (named pipe), not a regular file"}}) {
    const CliRun r = run({"--json", path});
    EXPECT_EQ(r.status, 2) << path;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
  }
}

TEST(Cli, OutputPathsAreCheckedBeforeAnyWork) {
  test::TempDir dir;
  const std::string file = dir.file("plain.txt");
  test::write_file(file, "x");
  bool ran = false;
  auto body = [&](const CommonOptions&) {
    ran = true;
    return 0;
  };
  for (const auto& [path, words] : std::vector<std::pair<std::string, std::string>>{
           {"/no/such/dir/x.json", "--json: cannot write /no/such/dir/x.json: folder /no/such/dir does not exist"},
           {dir.path().string(), "it is a folder"},
           {file + "/x.json", file + " is not a folder"}}) {
    ran = false;
    const CliRun r = run({"--json", path}, body);
    EXPECT_EQ(r.status, 2) << path;
    EXPECT_FALSE(ran) << path;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
  }
  EXPECT_EQ(run({"--json", dir.file("new.json")}, body).status, 0);
  EXPECT_EQ(run({"--json", "relative.json"}, body).status, 0);  // the working folder's
  EXPECT_TRUE(ran);
}

// A default output path (a plot written unless told '') is checked as a given one, but only for
// the command that runs; an input file must exist before the work that precedes reading it.
TEST(Cli, DefaultOutputsAndInputFilesAreCheckedToo) {
  test::TempDir dir;
  auto status = [&](std::vector<std::string> args, std::string* err) {
    CLI::App app{"test", "chXX_test"};
    std::string svg = "/no/such/dir/plot.svg", other = "/no/such/dir/other.svg";
    std::vector<std::string> points;
    CLI::App* plot = app.add_subcommand("plot", "writes a plot");
    plot->add_option("--svg", svg, "the plot ('' for none)")->check(output_file())->capture_default_str();
    plot->add_option("--points", points, "inputs")->check(input_file("roofline points"));
    CLI::App* calc = app.add_subcommand("calc", "writes nothing by default");
    calc->add_option("--svg", other, "a plot")->check(output_file())->capture_default_str();
    args.insert(args.begin(), "chXX_test");
    return run_app(app, args, err);
  };
  std::string err;
  EXPECT_EQ(status({"plot"}, &err), 2);
  EXPECT_NE(err.find("--svg: cannot write /no/such/dir/plot.svg: folder /no/such/dir does not exist"), std::string::npos)
      << err;
  EXPECT_EQ(status({"plot", "--svg", ""}, &err), 0) << err;
  EXPECT_EQ(status({"plot", "--svg", dir.file("p.svg")}, &err), 0) << err;
  EXPECT_EQ(status({}, &err), 0) << err;  // neither subcommand runs: neither default matters
  EXPECT_EQ(status({"plot", "--svg", "", "--points", "/no/such/points.json"}, &err), 2);
  EXPECT_NE(err.find("--points: cannot open roofline points /no/such/points.json"), std::string::npos) << err;
  EXPECT_EQ(status({"plot", "--svg", "", "--points", dir.path().string()}, &err), 2);
  EXPECT_NE(err.find("it is a directory"), std::string::npos) << err;
}

// A folder a writer creates with its parents: what exists above it must be a writable folder.
TEST(Cli, OutputFoldersMayBeNewButNotInsideAFile) {
  test::TempDir dir;
  EXPECT_EQ(unwritable_folder_reason(dir.file("a/b/c")), "");
  EXPECT_EQ(unwritable_folder_reason(dir.path().string()), "");
  test::write_file(dir.file("f"), "x");
  EXPECT_NE(unwritable_folder_reason(dir.file("f/out")).find("is a file, not a folder"), std::string::npos);
  EXPECT_NE(unwritable_folder_reason(dir.file("f")).find("is a file, not a folder"), std::string::npos);
  test::expect_error([&] { require_writable_folder(dir.file("f/out"), "output folder"); },
                     {"cannot write output folder", "f/out", "is a file, not a folder"});
  test::expect_error([&] { require_writable_file("/no/such/dir/x.gguf", "GGUF"); },
                     {"cannot write GGUF /no/such/dir/x.gguf: folder /no/such/dir does not exist"});
}

TEST(Cli, WriteTextNamesAnUnwritablePath) {
  test::expect_error([] { write_text("/no/such/dir/x.md", "hi"); }, {"cannot write /no/such/dir/x.md"});
}

// --json pointed at a file of the model the command read used to replace it with the results.
TEST(Cli, JsonNeverReplacesTheModelItRead) {
  test::TempDir dir;  // a model folder
  const std::string folder = dir.path().string(), config = dir.file("config.json"), weights = dir.file("model.bin");
  test::write_file(config, "{}");
  test::write_file(weights, "weights");
  test::expect_error([&] { write_json(config, {{"ppl", 3}}, {folder}); }, {config, "the folder this command reads"});
  test::expect_error([&] { write_json(weights, {{"ppl", 3}}, {weights}); }, {weights, "which this command reads"});
  test::expect_error([&] { write_json(folder + "/./model.bin", {{"ppl", 3}}, {weights}); }, {"which this command reads"});
  EXPECT_EQ(test::read_file(config), "{}");
  EXPECT_EQ(test::read_file(weights), "weights");
  write_json(dir.file("results.json"), {{"ppl", 3}}, {folder});  // a new file beside the model is fine
  EXPECT_EQ(load_json(dir.file("results.json"))["ppl"], 3);
}

// A write that fails halfway (here at a file size limit, as on a full disk) used to leave a
// truncated file in place of the old one.
TEST(Cli, AFailedWriteKeepsTheOldFileAndLeavesNoOther) {
  test::TempDir dir;
  const std::string path = dir.file("results.json");
  write_json(path, {{"old", true}});
  const std::string before = test::read_file(path);
  {
    test::FileSizeLimit limit(1000);
    test::expect_error([&] { write_text(path, std::string(5000, 'x')); }, {"error writing", path});
  }
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(test::list_folder(dir.path().string()), std::vector<std::string>{"results.json"});
}

// An output path that is a symbolic link: the file it names gets the bytes, and the link stays a
// link (a rename onto the link used to replace it with a file). A link loop is a named error.
TEST(Cli, AWriteThroughASymbolicLinkWritesTheFileItNames) {
  test::TempDir dir;
  const std::string target = dir.file("runs/results.json"), link = dir.file("latest.json");
  std::filesystem::create_directories(dir.file("runs"));
  write_text(target, "old");
  std::filesystem::create_symlink(target, link);
  write_text(link, "new");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(test::read_file(target), "new");
  EXPECT_EQ(test::list_folder(dir.file("runs")), std::vector<std::string>{"results.json"});
  const std::string loop = dir.file("loop.json");
  std::filesystem::create_symlink(loop, loop);
  test::expect_error([&] { write_text(loop, "x"); }, {"cannot write", loop});
  EXPECT_TRUE(std::filesystem::is_symlink(loop));
}

// Where an executable finds the bundled data: INFERLAB_DATA overrides everything (and a bad one is
// an error, not a silent fallback); otherwise the install tree beside the executable's bin/, then
// the source tree. With none of them, the error names every place looked at and INFERLAB_DATA.
TEST(Cli, TheDataFolderIsFoundByInferlabDataThenBesideTheExecutableThenInTheSourceTree) {
  test::TempDir dir;
  const std::filesystem::path installed = dir.path() / "share" / "inferlab" / "data";
  std::filesystem::create_directories(installed / "models");
  std::filesystem::create_directories(dir.path() / "bin");
  std::filesystem::create_directories(dir.path() / "empty");

  const std::vector<std::string> places = data_dir_candidates((dir.path() / "bin").string());
  ASSERT_EQ(places.size(), 2u);
  EXPECT_EQ(places[0], installed.string());
  EXPECT_EQ(places[1], std::filesystem::path(INFERLAB_DATA_DIR).lexically_normal().string());

  DataDirLookup d = find_data_dir(nullptr, places);  // installed: beside bin/
  EXPECT_EQ(d.dir, installed.string());
  EXPECT_EQ(d.problem, "");
  d = find_data_dir("", data_dir_candidates(dir.file("empty/bin")));  // in the build tree: the source's data/
  EXPECT_EQ(d.dir, places[1]);
  d = find_data_dir(INFERLAB_DATA_DIR, places);  // INFERLAB_DATA wins over the installed folder
  EXPECT_EQ(d.dir, INFERLAB_DATA_DIR);
  EXPECT_EQ(d.tried, std::vector<std::string>{INFERLAB_DATA_DIR});

  for (const std::string& bad : {dir.file("missing"), dir.file("empty")}) {
    d = find_data_dir(bad.c_str(), places);
    EXPECT_EQ(d.dir, "");
    for (const std::string& word : {std::string("INFERLAB_DATA"), bad, std::string("models/")})
      EXPECT_NE(d.problem.find(word), std::string::npos) << d.problem;
  }
  const std::vector<std::string> nowhere{dir.file("a"), dir.file("empty")};
  d = find_data_dir(nullptr, nowhere);
  EXPECT_EQ(d.dir, "");
  EXPECT_EQ(d.tried, nowhere);
  for (const std::string& word : {std::string("INFERLAB_DATA"), nowhere[0], nowhere[1]})
    EXPECT_NE(d.problem.find(word), std::string::npos) << d.problem;
}

// A bad INFERLAB_DATA ends a command with one line naming it and status 1; --help still works.
TEST(Cli, ABadInferlabDataIsAnErrorBeforeTheCommandRuns) {
  test::TempDir dir;
  const std::string bad = dir.file("no-such-folder");
  ::setenv("INFERLAB_DATA", bad.c_str(), 1);
  bool ran = false;
  const CliRun r = run({}, [&](const CommonOptions&) { return ran = true, 0; });
  const CliRun help = run({"--help"});
  ::unsetenv("INFERLAB_DATA");
  EXPECT_EQ(r.status, 1);
  EXPECT_FALSE(ran);
  EXPECT_NE(r.err.find("INFERLAB_DATA is set to '" + bad + "', which does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(help.status, 0);
  EXPECT_EQ(run({}).status, 0);  // unset again: the source tree's data
}

}  // namespace
}  // namespace inferlab
