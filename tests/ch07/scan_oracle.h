#pragma once
// Chapter 07's test oracle: the scan in float64, straight from the equations of ssm.h, and beside
// it the same recurrence over absolute values (|Ā|·s + |B̄·u|, Σ|C|·s + |D·u|, times |silu(z)|),
// which bounds how far float32 rounding can move each output. A step rounds about 9 times (Δ's
// softplus, Δ·A, its exp, Ā·s, Δ·B·u, the sum), each error at most u of that step's scale, and
// later steps multiply it by Ā ≤ 1 exactly as they multiply the scale, so after T steps the state
// is within 9T·u of its final scale; the output adds N + 8 roundings (the sum over N, the skip,
// the gate): every float32 path is within γ(9T + N + 8) of the scale.
#include <cmath>
#include <random>
#include <vector>

#include "common/models/ssm.h"
#include "golden_util.h"

namespace inferlab::test {

struct ScanOracle {
  std::vector<double> y, y_scale;  // [T, E]
  std::vector<double> h, h_scale;  // [E, N]
};

inline double softplus64(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

inline ScanOracle scan_oracle(const models::mamba::ScanInputs& in, const std::vector<double>& h0) {
  const std::int64_t T = in.T(), E = in.E(), N = in.N();
  const Tensor u = in.u.contiguous(), z = in.z.contiguous(), dt = in.dt.contiguous(), B = in.B.contiguous(),
               C = in.C.contiguous();
  ScanOracle o;
  o.h = h0, o.h_scale.assign(h0.size(), 0);
  for (std::size_t i = 0; i < h0.size(); ++i) o.h_scale[i] = std::fabs(h0[i]);
  o.y.assign(static_cast<std::size_t>(T * E), 0), o.y_scale.assign(o.y.size(), 0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < E; ++c) {
      const double delta = softplus64(in.lti ? dt.at<float>({c}) : dt.at<float>({t, c})), x = u.at<float>({t, c});
      double y = 0, ys = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        const double b = in.lti ? B.at<float>({c, n}) : B.at<float>({t, n});
        const double cc = in.lti ? C.at<float>({c, n}) : C.at<float>({t, n});
        const double a = std::exp(delta * in.A.at<float>({c, n}));
        const auto i = static_cast<std::size_t>(c * N + n);
        o.h[i] = a * o.h[i] + delta * b * x;
        o.h_scale[i] = a * o.h_scale[i] + std::fabs(delta * b * x);
        y += cc * o.h[i], ys += std::fabs(cc) * o.h_scale[i];
      }
      const double g = z.at<float>({t, c}), gate = g / (1 + std::exp(-g)), d = in.D.at<float>({c});
      o.y[static_cast<std::size_t>(t * E + c)] = (y + d * x) * gate;
      o.y_scale[static_cast<std::size_t>(t * E + c)] = (ys + std::fabs(d * x)) * std::fabs(gate);
    }
  return o;
}

// The bound of every element: γ(9T + N + 8) of its scale, and the output's own rounding.
inline std::vector<double> scan_bound(const std::vector<double>& scale, std::int64_t T, std::int64_t N) {
  std::vector<double> b(scale.size());
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = gamma(static_cast<double>(9 * T + N + 8)) * scale[i] + 0x1p-24 * scale[i];
  return b;
}

// Random scan inputs: B and C columns of a wider x_proj-like output (strided rows), z the second
// half of an in_proj-like output, as the model passes them.
struct RandomScan {
  Tensor xz, dbc, u, dt, A, D, Bc, Cc;
  models::mamba::ScanInputs in;
};

inline RandomScan random_scan(std::mt19937_64& rng, std::int64_t T, std::int64_t E, std::int64_t N, bool lti) {
  auto fill = [&](Tensor t, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  };
  RandomScan r;
  const std::int64_t R = 3;
  r.xz = fill(Tensor::empty({T, 2 * E}, DType::F32), -2, 2);
  r.dbc = fill(Tensor::empty({T, R + 2 * N}, DType::F32), -1, 1);
  r.u = fill(Tensor::empty({T, E}, DType::F32), -1, 1);
  r.dt = fill(Tensor::empty(lti ? Shape{E} : Shape{T, E}, DType::F32), -4, 1);  // Δ from about 0.02 to 1.3
  r.A = fill(Tensor::empty({E, N}, DType::F32), -static_cast<float>(N), -0.5f);
  r.D = fill(Tensor::empty({E}, DType::F32), -1, 1);
  r.Bc = fill(Tensor::empty({E, N}, DType::F32), -1, 1);
  r.Cc = fill(Tensor::empty({E, N}, DType::F32), -1, 1);
  r.in.u = r.u, r.in.dt = r.dt, r.in.A = r.A, r.in.D = r.D, r.in.z = r.xz.slice(1, E, 2 * E), r.in.lti = lti;
  r.in.B = lti ? r.Bc : r.dbc.slice(1, R, R + N);
  r.in.C = lti ? r.Cc : r.dbc.slice(1, R + N, R + 2 * N);
  return r;
}

inline std::vector<double> random_state(std::mt19937_64& rng, std::int64_t E, std::int64_t N) {
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> h(static_cast<std::size_t>(E * N));
  for (auto& x : h) x = static_cast<float>(d(rng));  // values a float32 state holds exactly
  return h;
}

inline Tensor state_tensor(const std::vector<double>& h, std::int64_t E, std::int64_t N) {
  std::vector<float> f(h.begin(), h.end());
  return Tensor::from_vector(f, {E, N});
}

}  // namespace inferlab::test
