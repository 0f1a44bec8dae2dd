// A program that starts as every chapter executable does (wait_passively first) and prints what
// the OpenMP runtime was loaded with: test_metrics.cpp runs it with and without a policy set.
#include <cstdio>
#include <cstdlib>

#include "common/cli.h"

int main(int argc, char** argv) {
  inferlab::wait_passively(argv);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spins = std::getenv("GOMP_SPINCOUNT");
  std::printf("policy=%s spins=%s", policy ? policy : "(unset)", spins ? spins : "(unset)");
  for (int i = 1; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");
  return 0;
}
