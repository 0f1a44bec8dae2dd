// The shared command line: defaults, validation, and errors that end in a clear message and
// a non-zero exit status rather than a crash.
#include <sstream>

#include "common/cli.h"
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

TEST(Cli, DefaultsAndParsing) {
  CliRun r = run({});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.opts.model, default_model_path());
  EXPECT_EQ(r.opts.device, "cpu");
  r = run({"--prompt", "Hi there", "--max-new-tokens", "5", "--temperature", "0.7", "--top-k", "40", "--top-p",
           "0.9", "--seed", "3", "--json", "out.json"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.opts.prompt, "Hi there");
  EXPECT_EQ(r.opts.max_new_tokens, 5);
  EXPECT_EQ(r.opts.sampling().top_k, 40);
  EXPECT_FLOAT_EQ(r.opts.sampling().top_p, 0.9f);
  EXPECT_EQ(r.opts.json, "out.json");
}

TEST(Cli, BadCommandLinesExitWithStatus2AndSayWhy) {
  for (const auto& [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--bogus"}, "--bogus"},
           {{"--device", "tpu"}, "tpu"},
           {{"--max-new-tokens", "-3"}, "max-new-tokens"},
           {{"--top-p", "1.5"}, "top-p"},
           {{"--temperature", "hot"}, "temperature"}}) {
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
}

}  // namespace
}  // namespace inferlab
