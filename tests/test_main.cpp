// Test entry point: prints the random seed so any failure can be replayed with
// INFERLAB_TEST_SEED=<seed>.
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <thread>

#include "test_util.h"

namespace inferlab::test {

std::uint64_t run_seed() {
  static const std::uint64_t seed = []() -> std::uint64_t {
    if (const char* s = std::getenv("INFERLAB_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

std::mt19937_64 rng_for_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::uint64_t h = run_seed();
  if (info)
    for (const char* p : {info->test_suite_name(), info->name()})
      for (; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return std::mt19937_64(h);
}

Tensor uniform(std::mt19937_64& rng, const Shape& shape, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

Tensor uniform_as(std::mt19937_64& rng, const Shape& shape, DType dtype, float lo, float hi) {
  Tensor t = uniform(rng, shape, lo, hi);
  return dtype == DType::F32 ? t : t.to(dtype);
}

void expect_within(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.size(), bound.size()) << what;
  std::size_t worst = 0, bad = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double ratio = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0);
    if (!(err <= bound[i])) ++bad;  // also catches NaN
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside the bound; worst at " << worst
                     << ": got " << got[worst] << ", want " << want[worst] << ", bound " << bound[worst] << " (seed "
                     << run_seed() << ")";
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "inferlab-test-XXXXXX").string();
  path_ = mkdtemp(tmpl.data());
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void expect_fifo_refused(const std::string& path, const std::function<void(const std::string&)>& load) {
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      load(path);
      return "no error";
    } catch (const std::exception& e) {
      return e.what();
    }
  });
  if (result.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "the reader blocked opening the FIFO " << path;
    // Non-blocking, this open succeeds only once the reader has its end open; closing it
    // again gives the reader end-of-file.
    while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
      if (const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK); fd >= 0) ::close(fd);
  }
  const std::string message = result.get();
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("FIFO"), std::string::npos) << message;
}

bool eventually(const std::function<bool()>& done, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> list_folder(const std::string& path) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

FileSizeLimit::FileSizeLimit(std::uint64_t bytes) {
  rlimit r{};
  getrlimit(RLIMIT_FSIZE, &r);
  previous_ = r.rlim_cur;
  previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
  r.rlim_cur = bytes;
  EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &r), 0) << "cannot limit the file size";
}

FileSizeLimit::~FileSizeLimit() {
  rlimit r{};
  getrlimit(RLIMIT_FSIZE, &r);
  r.rlim_cur = previous_;
  setrlimit(RLIMIT_FSIZE, &r);
  std::signal(SIGXFSZ, previous_handler_);
}

ThreadCount::ThreadCount(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
ThreadCount::~ThreadCount() { omp_set_num_threads(previous_); }

std::string shared_dir() {
  const std::string d = INFERLAB_SHARED_DIR;
  return std::filesystem::is_directory(d) ? d : "";
}

}  // namespace inferlab::test

namespace {

// In a trace tree (tools/lab.sh relabel) every exercise region records that it ran, under the
// name of the test that is running: this listener names it in the environment, where the
// chapter programs a test starts find it too.
class LabTrace : public ::testing::EmptyTestEventListener {
 public:
  explicit LabTrace(std::string program) : program_(std::move(program)) {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    const std::string name = program_ + " " + info.test_suite_name() + "." + info.name();
    setenv("INFERLAB_LAB_TEST", name.c_str(), 1);
  }
  void OnTestEnd(const ::testing::TestInfo&) override { unsetenv("INFERLAB_LAB_TEST"); }

 private:
  std::string program_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* trace = std::getenv("INFERLAB_LAB_TRACE"); trace && *trace) {
    const std::string program = argv[0];
    ::testing::UnitTest::GetInstance()->listeners().Append(new LabTrace(program.substr(program.find_last_of('/') + 1)));
  }
  std::cout << "InferLab tests: random seed " << inferlab::test::run_seed()
            << " (replay with INFERLAB_TEST_SEED=" << inferlab::test::run_seed() << ")\n";
  return RUN_ALL_TESTS();
}
