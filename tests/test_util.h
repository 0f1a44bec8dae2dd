#pragma once
// Helpers shared by the tests: fresh random inputs, float64 reference arithmetic, and
// tolerances derived from the dtype (never widened to make a test pass).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/backend.h"
#include "common/tensor.h"

namespace inferlab::test {

/// The seed of this test run: INFERLAB_TEST_SEED if set, else fresh from std::random_device.
/// Printed at start-up (test_main.cpp) so any failure can be replayed.
std::uint64_t run_seed();

/// A random generator seeded from run_seed() and the current test's name.
std::mt19937_64 rng_for_test();

/// F32 tensor of uniform values in [lo, hi).
Tensor uniform(std::mt19937_64& rng, const Shape& shape, float lo = -1.0f, float hi = 1.0f);
/// Same values rounded to `dtype` (F32, F16 or BF16), so that a float64 reference can use the
/// exact stored values.
Tensor uniform_as(std::mt19937_64& rng, const Shape& shape, DType dtype, float lo = -1.0f, float hi = 1.0f);

/// γ_n = n·u / (1 − n·u): the classic bound on the relative error of an n-term float sum
/// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1) for unit roundoff u.
inline double gamma(double n, double u = 0x1p-24) { return n * u / (1.0 - n * u); }

/// Expects |got[i] − want[i]| ≤ bound[i] for every element; reports the worst offender.
void expect_within(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what);

/// A temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Polls `done` every 10 ms for up to `seconds`; its last answer (for what happens on other
/// threads: a server's gauges, a connection closing).
bool eventually(const std::function<bool()>& done, double seconds = 10);

/// Writes `text` to a file.
void write_file(const std::string& path, const std::string& text);
/// The whole content of a file ("" when it cannot be read).
std::string read_file(const std::string& path);
/// The names in a folder, sorted: what a writer left behind.
std::vector<std::string> list_folder(const std::string& path);

/// For its scope, files may not grow beyond `bytes` (RLIMIT_FSIZE): a write past it fails with
/// EFBIG, as a full disk would fail it (SIGXFSZ, which would end the process, is ignored).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(std::uint64_t bytes);
  ~FileSizeLimit();

 private:
  std::uint64_t previous_;
  void (*previous_handler_)(int);
};

/// Makes a FIFO (named pipe) at `path` and expects `load(path)` to refuse it at once with an
/// inferlab::Error naming the path and "FIFO". A reader that opens the FIFO instead blocks
/// until a writer comes: after a few seconds the test fails and opens the write end itself, so
/// that the reader sees an empty file and the test ends rather than hangs.
void expect_fifo_refused(const std::string& path, const std::function<void(const std::string&)>& load);

/// Expects `f` to throw inferlab::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an inferlab::Error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what();
  }
}

/// Skips the current test unless a CUDA device is usable, printing why.
#define IL_REQUIRE_CUDA()                                                                \
  do {                                                                                   \
    const std::string il_reason_ = ::inferlab::cuda::unavailable_reason();               \
    if (!il_reason_.empty()) GTEST_SKIP() << "no CUDA device available: " << il_reason_; \
  } while (0)

/// Sets the OpenMP thread count for the current scope (the fast paths' threaded code runs
/// with a team of this size; ctest itself runs tests with one thread each).
class ThreadCount {
 public:
  explicit ThreadCount(int n);
  ~ThreadCount();

 private:
  int previous_;
};

/// The shared read-only test data folder (../shared), or "" when it is absent.
std::string shared_dir();

/// A parameterised test's name from its model folder's name ("qwen3-gqa" → "qwen3_gqa"): GoogleTest
/// names allow no '-'.
struct ModelName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string n = info.param;
    for (char& c : n)
      if (c == '-') c = '_';
    return n;
  }
};

}  // namespace inferlab::test
