// The command line: the fuzzer's bytes split at NUL into arguments, parsed by options and
// subcommands laid out as the chapters lay theirs (numbers with ranges, lists, flags).
#include <sstream>
#include <vector>

#include "common/cli.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  std::vector<std::string> args = {"chXX_fuzz"};
  std::string cur;
  for (std::size_t i = 0; i < size && args.size() < 32; ++i) {
    if (data[i] == 0) args.push_back(cur), cur.clear();
    else cur += static_cast<char>(data[i]);
  }
  args.push_back(cur);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());

  CLI::App app{"fuzz", "chXX_fuzz"};
  CommonOptions o;
  add_common_options(app, o);
  help_footer(app, "nothing", "chapters/XX/README.md", "一节");
  std::int64_t seq = 1024;
  std::vector<std::int64_t> batches;
  bool flag = false;
  CLI::App* sub = app.add_subcommand("sub", "a subcommand");
  add_json_option(*sub, o.json);
  sub->add_option("--seq", seq, "Context")->check(number_in(1, 1 << 24));
  sub->add_option("--batches", batches, "Batch sizes")->delimiter(',')->check(number_in(1, 4096));
  sub->add_flag("--flag", flag, "A flag");
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  std::stringstream sink;
  auto* out = std::cout.rdbuf(sink.rdbuf());
  auto* err = std::cerr.rdbuf(sink.rdbuf());
  // run_cli turns every error into an exit status; anything that escapes it is a finding.
  run_cli(app, static_cast<int>(argv.size()), argv.data(), [&] {
    o.resolved_device();
    return 0;
  });
  std::cout.rdbuf(out), std::cerr.rdbuf(err);
  return 0;
}
