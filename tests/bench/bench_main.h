#pragma once
// The main of every benchmark program: OpenMP set as the chapter executables set it (threads that
// wait spin briefly, then sleep; fewer threads beside other work: common/cli.h, wait_passively),
// so that a benchmark run bare measures what the executables run, then Google Benchmark's main.
#include <benchmark/benchmark.h>

#include "common/cli.h"

#define INFERLAB_BENCHMARK_MAIN()                                       \
  int main(int argc, char** argv) {                                     \
    inferlab::wait_passively(argv);                                     \
    ::benchmark::Initialize(&argc, argv);                               \
    if (::benchmark::ReportUnrecognizedArguments(argc, argv)) return 1; \
    ::benchmark::RunSpecifiedBenchmarks();                              \
    ::benchmark::Shutdown();                                            \
    return 0;                                                           \
  }
