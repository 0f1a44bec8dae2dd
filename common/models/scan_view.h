#pragma once
// The scan's inputs as raw pointers and row strides, read the same way by the CPU loops
// (ssm.cpp) and the CUDA kernels (cuda_mamba.cu). Element (t, c, n) of B is
// B[t·b_t + c·b_c + n]: a selective model's B is per token (b_c = 0), an LTI model's per channel
// (b_t = 0); dt likewise (dt_t = 0 for LTI).
#include <cstdint>

#include "common/host_device.h"

namespace inferlab::models::mamba {

struct ScanView {
  const float *u, *dt, *A, *B, *C, *D, *z;
  float* y;
  std::int64_t T, E, N;
  std::int64_t u_t, dt_t, b_t, b_c, c_t, c_c, z_t, y_t;  // strides (elements)

  IL_HD float u_at(std::int64_t t, std::int64_t c) const { return u[t * u_t + c]; }
  IL_HD float dt_at(std::int64_t t, std::int64_t c) const { return dt[t * dt_t + c]; }
  IL_HD float B_at(std::int64_t t, std::int64_t c, std::int64_t n) const { return B[t * b_t + c * b_c + n]; }
  IL_HD float C_at(std::int64_t t, std::int64_t c, std::int64_t n) const { return C[t * c_t + c * c_c + n]; }
  IL_HD float z_at(std::int64_t t, std::int64_t c) const { return z[t * z_t + c]; }
  IL_HD float& y_at(std::int64_t t, std::int64_t c) const { return y[t * y_t + c]; }
};

}  // namespace inferlab::models::mamba
