// Chapter 07's ops against a float64 oracle from the equations (scan_oracle.h), and against each
// other: the reference loop, the fast path, the chunked associative scan, token-by-token steps,
// and for LTI inputs the convolution. Shapes include T = 1, chunks that do not divide T, state
// sizes above and below 16, and a state carried in from before.
#include <gtest/gtest.h>

#include "scan_oracle.h"

namespace inferlab {
namespace {

using models::mamba::ScanInputs;

enum class Way { Reference, Fast, Parallel1, Parallel7, Parallel64, Steps, Convolution };
const char* name(Way w) {
  switch (w) {
    case Way::Reference: return "ref::selective_scan";
    case Way::Fast: return "selective_scan";
    case Way::Parallel1: return "parallel_scan chunk 1";
    case Way::Parallel7: return "parallel_scan chunk 7";
    case Way::Parallel64: return "parallel_scan chunk 64";
    case Way::Steps: return "one token at a time";
    case Way::Convolution: return "lti_convolution";
  }
  return "";
}

// Rows [t, t + 1) of every per-token input: the step the decoder runs.
ScanInputs row(const ScanInputs& in, std::int64_t t) {
  ScanInputs r = in;
  r.u = in.u.slice(0, t, t + 1), r.z = in.z.slice(0, t, t + 1);
  if (!in.lti) r.dt = in.dt.slice(0, t, t + 1), r.B = in.B.slice(0, t, t + 1), r.C = in.C.slice(0, t, t + 1);
  return r;
}

void run(Way w, const ScanInputs& in, Tensor& h, Tensor& y) {
  switch (w) {
    case Way::Reference: return models::mamba::ref::selective_scan(in, h, y);
    case Way::Fast: return models::mamba::selective_scan(in, h, y);
    case Way::Parallel1: return models::mamba::parallel_scan(in, h, y, 1);
    case Way::Parallel7: return models::mamba::parallel_scan(in, h, y, 7);
    case Way::Parallel64: return models::mamba::parallel_scan(in, h, y, 64);
    case Way::Convolution: return models::mamba::lti_convolution(in, h, y);
    case Way::Steps:
      for (std::int64_t t = 0; t < in.T(); ++t) {
        Tensor y_t = y.slice(0, t, t + 1);
        models::mamba::selective_scan(row(in, t), h, y_t);
      }
      return;
  }
}

struct Shape3 {
  std::int64_t T, E, N;
};

// Every way in `ways`, selective and LTI inputs, from zeros and (`warm`) from a carried state.
void expect_every_way(const std::vector<Way>& ways, bool warm_too) {
  auto rng = test::rng_for_test();
  for (const bool lti : {false, true})
    for (const Shape3 s : {Shape3{1, 3, 2}, Shape3{5, 4, 16}, Shape3{37, 6, 5}, Shape3{130, 3, 24}, Shape3{64, 2, 1}}) {
      const auto r = test::random_scan(rng, s.T, s.E, s.N, lti);
      for (const bool warm : {false, true}) {  // from zeros, and continuing a state from earlier tokens
        if (warm && !warm_too) continue;
        const auto h0 =
            warm ? test::random_state(rng, s.E, s.N) : std::vector<double>(static_cast<std::size_t>(s.E * s.N), 0);
        const auto want = test::scan_oracle(r.in, h0);
        for (Way w : ways) {
          if (w == Way::Convolution && !lti) continue;
          SCOPED_TRACE(std::string(name(w)) + (lti ? ", LTI" : ", selective") + (warm ? ", warm state" : ", zero state") +
                       ", T = " + std::to_string(s.T) + ", E = " + std::to_string(s.E) + ", N = " + std::to_string(s.N));
          Tensor h = test::state_tensor(h0, s.E, s.N), y = Tensor::empty({s.T, s.E}, DType::F32);
          run(w, r.in, h, y);
          test::expect_within(y.to_double_vector(), want.y, test::scan_bound(want.y_scale, s.T, s.N), "y");
          test::expect_within(h.to_double_vector(), want.h, test::scan_bound(want.h_scale, s.T, s.N), "final state");
        }
      }
    }
}

TEST(Scan, EveryWayEqualsTheFloat64Recurrence) {
  expect_every_way({Way::Reference, Way::Fast, Way::Parallel1, Way::Parallel7, Way::Parallel64, Way::Steps}, true);
}

// S4's view: an LTI scan from an empty state is one convolution (it has no term for a state).
TEST(Scan, LtiConvolutionEqualsTheFloat64Recurrence) { expect_every_way({Way::Convolution}, false); }

TEST(Scan, LtiKernelIsTheImpulseResponse) {
  // K[c, k] is the output at lag k of a unit input at time 0 (with D = 0 and no gate): feed one
  // impulse through the recurrence and read it back.
  auto rng = test::rng_for_test();
  const std::int64_t T = 20, E = 3, N = 4;
  auto r = test::random_scan(rng, T, E, N, true);
  const Tensor K = models::mamba::lti_kernel(r.in.dt, r.in.A, r.in.B, r.in.C, T);
  ASSERT_EQ(K.shape(), (Shape{E, T}));
  Tensor u = Tensor::zeros({T, E}, DType::F32), d = Tensor::zeros({E}, DType::F32);
  for (std::int64_t c = 0; c < E; ++c) u.data<float>()[c] = 1.0f;
  ScanInputs in = r.in;
  in.u = u, in.D = d;
  const auto want = test::scan_oracle(in, std::vector<double>(E * N, 0));
  // The oracle's gate is silu(z); divide it out to get the bare response.
  const Tensor z = in.z.contiguous();
  for (std::int64_t c = 0; c < E; ++c)
    for (std::int64_t k = 0; k < T; ++k) {
      const double g = z.at<float>({k, c}), gate = g / (1 + std::exp(-g));
      const double exact = want.y[static_cast<std::size_t>(k * E + c)] / gate;
      // lti_kernel takes Δ = softplus(dt) in float (a relative error of a few u, which reaches
      // each term Δ·B·C·exp(kΔA) multiplied by 1 + k·Δ·|A|), sums in double and rounds once.
      const double delta = test::softplus64(r.in.dt.at<float>({c}));
      double scale = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        const double dA = delta * std::fabs(r.in.A.at<float>({c, n}));
        scale += std::fabs(r.in.C.at<float>({c, n}) * delta * r.in.B.at<float>({c, n})) * std::exp(-k * dA) * (1 + k * dA);
      }
      EXPECT_NEAR(K.at<float>({c, k}), exact, 0x1p-24 * std::fabs(exact) + test::gamma(4) * scale)
          << "c " << c << " lag " << k;
    }
}

TEST(Scan, RefusesWhatItCannotRun) {
  auto rng = test::rng_for_test();
  auto r = test::random_scan(rng, 4, 3, 2, false);
  Tensor h = Tensor::zeros({3, 2}, DType::F32), y = Tensor::empty({4, 3}, DType::F32);
  EXPECT_THROW(
      try { models::mamba::lti_convolution(r.in, h, y); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("do not depend on the token"), std::string::npos) << e.what();
        throw;
      },
      Error);
  Tensor wrong = Tensor::zeros({3, 5}, DType::F32);
  EXPECT_THROW(models::mamba::selective_scan(r.in, wrong, y), Error);  // the state's shape is named
  auto lti = test::random_scan(rng, 4, 3, 2, true);
  Tensor warm = Tensor::from_vector(std::vector<float>(6, 1.0f), {3, 2});
  EXPECT_THROW(models::mamba::lti_convolution(lti.in, warm, y), Error);  // a convolution has no term for an earlier state
  ScanInputs bad = r.in;
  bad.B = r.dbc.slice(1, 0, 3);  // R columns where N are expected
  EXPECT_THROW(models::mamba::ref::selective_scan(bad, h, y), Error);
}

// The convolution over a sequence equals the same convolution in pieces, the state carrying the
// last K − 1 inputs across: exactly, since each output sums the same K products in the same order.
TEST(CausalConv, InPiecesEqualsAtOnceAndMatchesTheFormula) {
  auto rng = test::rng_for_test();
  for (const std::int64_t K : {1, 2, 4, 5}) {
    const std::int64_t T = 11, E = 6;
    const Tensor x = test::uniform(rng, {T, E}), w = test::uniform(rng, {E, K}), b = test::uniform(rng, {E});
    Tensor state = Tensor::zeros({K - 1, E}, DType::F32), out = Tensor::empty({T, E}, DType::F32);
    models::mamba::ref::causal_conv(x, w, b, state, out);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < E; ++c) {
        double acc = b.at<float>({c}), scale = std::fabs(acc);
        for (std::int64_t k = 0; k < K; ++k) {
          const std::int64_t s = t - (K - 1) + k;
          if (s >= 0) {
            const double term = static_cast<double>(w.at<float>({c, k})) * x.at<float>({s, c});
            acc += term, scale += std::fabs(term);
          }
        }
        const double want = acc / (1 + std::exp(-acc));
        // The float sum is within γ_(K+1) of Σ|terms|; silu's slope is at most 1.1, and it rounds
        // a few times itself (exp, the sum, the division).
        EXPECT_NEAR(out.at<float>({t, c}), want,
                    1.1 * test::gamma(static_cast<double>(K + 1)) * scale + test::gamma(8) * std::fabs(want))
            << "K " << K << " t " << t;
      }
    for (std::int64_t r = 0; r < K - 1; ++r)  // the state ends with the last K − 1 inputs, oldest first
      for (std::int64_t c = 0; c < E; ++c) EXPECT_EQ(state.at<float>({r, c}), x.at<float>({T - (K - 1) + r, c}));
    Tensor piece_state = Tensor::zeros({K - 1, E}, DType::F32), pieces = Tensor::empty({T, E}, DType::F32);
    for (auto [t0, t1] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {1, 3}, {3, 4}, {4, 11}}) {
      Tensor o = pieces.slice(0, t0, t1);
      models::mamba::causal_conv(x.slice(0, t0, t1), w, b, piece_state, o);
    }
    EXPECT_EQ(pieces.to_float_vector(), out.to_float_vector()) << "K " << K;
    EXPECT_EQ(piece_state.to_float_vector(), state.to_float_vector()) << "K " << K;
  }
}

// The fast path's exp, on a dense grid of [−100, 0] and at the ends: within 2 ulp of the exact
// value, 0 where the exact value is below float's smallest normal, never above 1.
TEST(FastExp, IsWithinTwoUlpOfTheExactExp) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -100.0f * static_cast<float>(i) / 2000000.0f;
    const float got = models::mamba::exp_nonpositive(x);
    const double want = std::exp(static_cast<double>(x));
    ASSERT_LE(got, 1.0f) << x;
    if (want < 0x1p-126) {
      ASSERT_LE(got, 0x1p-125) << x;
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  EXPECT_LE(worst, 2.0) << "largest error in ulp";
  EXPECT_EQ(models::mamba::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(models::mamba::exp_nonpositive(-1e30f), 0.0f);
}

}  // namespace
}  // namespace inferlab
