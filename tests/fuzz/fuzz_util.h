#pragma once
// What every fuzz target shares. A target writes the fuzzer's bytes to a file (the readers take
// paths, and the file path is the one users hit) and calls a reader. The promise under test:
// bad input ends in an inferlab::Error, which the target swallows; anything else (a crash, a
// sanitizer report, a hang, or another exception type) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"

namespace inferlab::fuzz {

/// A folder of this process's own, in memory when /dev/shm exists (one write per execution).
inline const std::string& work_dir() {
  static const std::string dir = [] {
    const std::string root =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    std::string d = root + "/inferlab-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/// Writes the input to work_dir()/name and returns the path.
inline std::string write_input(const std::uint8_t* data, std::size_t size, const std::string& name) {
  const std::string path = work_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

/// Runs `f`; an inferlab::Error is the expected answer to bad input, any other exception aborts
/// (the fuzzer then saves the input).
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "not an inferlab::Error: %s\n", e.what());
    std::abort();
  }
}

}  // namespace inferlab::fuzz
