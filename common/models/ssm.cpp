#include "common/models/ssm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "common/lab.h"
#include "common/metrics.h"
#include "common/models/cuda_mamba.h"
#include "common/models/scan_view.h"

namespace inferlab::models::mamba {

namespace {

// A [rows, cols] f32 tensor whose last dimension is contiguous (rows may be strided).
void check_rows(const Tensor& t, std::int64_t rows, std::int64_t cols, Device dev, const char* who, const char* name) {
  IL_CHECK(t.defined() && t.ndim() == 2 && t.size(0) == rows && t.size(1) == cols && t.dtype() == DType::F32 &&
               t.device() == dev && t.strides()[1] == 1,
           who, ": ", name, " must be f32 [", rows, ", ", cols, "] on ", device_name(dev), " with contiguous rows; got ",
           t.describe());
}

void check_vector(const Tensor& t, std::int64_t n, Device dev, const char* who, const char* name) {
  IL_CHECK(t.defined() && t.ndim() == 1 && t.size(0) == n && t.dtype() == DType::F32 && t.device() == dev &&
               t.is_contiguous(),
           who, ": ", name, " must be contiguous f32 [", n, "] on ", device_name(dev), "; got ", t.describe());
}

ScanView view_of(const ScanInputs& in, Tensor& y) {
  ScanView v{};
  v.u = in.u.data<float>(), v.dt = in.dt.data<float>(), v.A = in.A.data<float>(), v.B = in.B.data<float>();
  v.C = in.C.data<float>(), v.D = in.D.data<float>(), v.z = in.z.data<float>(), v.y = y.data<float>();
  v.T = in.T(), v.E = in.E(), v.N = in.N();
  v.u_t = in.u.strides()[0], v.z_t = in.z.strides()[0], v.y_t = y.strides()[0];
  if (in.lti) {
    v.dt_t = 0, v.b_t = 0, v.b_c = in.B.strides()[0], v.c_t = 0, v.c_c = in.C.strides()[0];
  } else {
    v.dt_t = in.dt.strides()[0], v.b_t = in.B.strides()[0], v.b_c = 0, v.c_t = in.C.strides()[0], v.c_c = 0;
  }
  return v;
}

// Per (token, channel, state) an exp and three multiply-adds; the bytes of scan_bytes.
void count_scan(const char* op, const ScanInputs& in) {
  const double work = static_cast<double>(in.T()) * static_cast<double>(in.E()) * static_cast<double>(in.N());
  metrics::count(op, 7 * work, scan_bytes(in.T(), in.E(), in.N(), in.lti));
}

struct StdExp {
  float operator()(float x) const { return std::exp(x); }
};
struct FastExp {
  float operator()(float x) const { return exp_nonpositive(x); }
};

// The recurrence of one channel c over tokens t0 .. t1 − 1, from the state s[0 .. N−1] (updated
// in place): every way of running the scan is this loop, over the channels one after the other
// (ref::, with std::exp), side by side (threads) or over chunks of the sequence (parallel_scan),
// these two with exp_nonpositive, which lets the compiler run the N states as one vector.
// `prod`, when given, accumulates the product of Ā (the chunk's carry); y is written when `write`.
template <class Exp>
void scan_channel(const ScanView& v, std::int64_t c, std::int64_t t0, std::int64_t t1, float* s, float* prod, bool write,
                  Exp exp) {
  const float* A = v.A + c * v.N;
  for (std::int64_t t = t0; t < t1; ++t) {
    const float delta = softplus(v.dt_at(t, c));  // Δ: how much of this token to write
    const float u = v.u_at(t, c);
    float out = 0.0f;
    // EXERCISE 07.1 BEGIN: the selective state update
#pragma omp simd reduction(+ : out)
    for (std::int64_t n = 0; n < v.N; ++n) {
      const float a = exp(delta * A[n]);              // Ā = exp(Δ·A)
      s[n] = a * s[n] + delta * v.B_at(t, c, n) * u;  // h = Ā·h + B̄·u, B̄ = Δ·B
      if (prod) prod[n] *= a;
      out += v.C_at(t, c, n) * s[n];  // y = C·h
    }
    // EXERCISE 07.1 STUB
    // (void)A, (void)s, (void)prod, (void)delta, (void)exp;
    // lab::not_done("07.1", "update the N states of channel c for token t: Ā = exp(Δ·A[n]) with the exp this "
    //                       "function is given, then h[n] = Ā·h[n] + "
    //                       "Δ·B[n]·u (B at v.B_at(t, c, n)); multiply prod[n] by Ā when prod is given; and sum "
    //                       "C[n]·h[n] (v.C_at(t, c, n)) into out");
    // EXERCISE 07.1 END
    if (write) v.y_at(t, c) = (out + v.D[c] * u) * silu(v.z_at(t, c));  // the skip, then the gate
  }
}

// The checks of both convolutions (and their work); returns K.
std::int64_t check_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& state, const Tensor& out,
                        const char* who) {
  IL_CHECK(x.defined() && x.ndim() == 2 && x.size(0) > 0, who, ": x must be [T, E] with T > 0; got ", x.describe());
  const Device dev = x.device();
  const std::int64_t T = x.size(0), E = x.size(1);
  IL_CHECK(w.defined() && w.ndim() == 2 && w.size(0) == E && w.size(1) >= 1, who, ": w must be [E = ", E, ", K]; got ",
           w.describe());
  const std::int64_t K = w.size(1);
  check_rows(x, T, E, dev, who, "x");
  check_rows(w, E, K, dev, who, "w");
  if (b.defined()) check_vector(b, E, dev, who, "b");
  check_rows(state, K - 1, E, dev, who, "the conv state");
  IL_CHECK(state.is_contiguous() && w.is_contiguous(), who, ": w and the conv state must be contiguous");
  check_rows(out, T, E, dev, who, "out");
  metrics::count(who, 2.0 * static_cast<double>(T * E * K), 4.0 * static_cast<double>(2 * T * E + E * K + 2 * (K - 1) * E));
  return K;
}

}  // namespace

double scan_bytes(std::int64_t T_, std::int64_t E_, std::int64_t N_, bool lti) {
  const double T = static_cast<double>(T_), E = static_cast<double>(E_), N = static_cast<double>(N_);
  return 4 * (4 * T * E + (lti ? 2 * E * N : 2 * T * N) + 3 * E * N + E);
}

void ScanInputs::check(const Tensor& h, const Tensor& y, const char* who) const {
  IL_CHECK(u.defined() && u.ndim() == 2 && u.size(0) > 0, who, ": u must be [T, E] with T > 0; got ", u.describe());
  IL_CHECK(A.defined() && A.ndim() == 2, who, ": A must be [E, N]; got ", A.describe());
  const Device dev = u.device();
  const std::int64_t T = u.size(0), E = u.size(1), N = A.size(1);
  check_rows(u, T, E, dev, who, "u");
  check_rows(A, E, N, dev, who, "A");
  IL_CHECK(A.is_contiguous(), who, ": A must be contiguous");
  if (lti) {
    check_vector(dt, E, dev, who, "dt (per channel)");
    check_rows(B, E, N, dev, who, "B (per channel)");
    check_rows(C, E, N, dev, who, "C (per channel)");
  } else {
    check_rows(dt, T, E, dev, who, "dt");
    check_rows(B, T, N, dev, who, "B");
    check_rows(C, T, N, dev, who, "C");
  }
  check_vector(D, E, dev, who, "D");
  check_rows(z, T, E, dev, who, "z");
  check_rows(h, E, N, dev, who, "the state h");
  IL_CHECK(h.is_contiguous(), who, ": the state h must be contiguous");
  check_rows(y, T, E, dev, who, "y");
}

namespace ref {

void selective_scan(const ScanInputs& in, Tensor& h, Tensor& y) {
  in.check(h, y, "ref::selective_scan");
  IL_CHECK(!h.is_cuda(), "ref::selective_scan: CPU tensors only");
  count_scan("ref::selective_scan", in);
  const ScanView v = view_of(in, y);
  for (std::int64_t c = 0; c < v.E; ++c) scan_channel(v, c, 0, v.T, h.data<float>() + c * v.N, nullptr, true, StdExp{});
}

void causal_conv(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& state, Tensor& out) {
  const std::int64_t K = check_conv(x, w, b, state, out, "ref::causal_conv");
  IL_CHECK(!x.is_cuda(), "ref::causal_conv: CPU tensors only");
  const std::int64_t T = x.size(0), E = x.size(1);
  const float* xs = x.data<float>();
  const float* ws = w.data<float>();
  float* st = state.data<float>();
  float* o = out.data<float>();
  const std::int64_t xt = x.strides()[0], ot = out.strides()[0];
  // Input at position s (negative: before this call, from the state's rows).
  auto input = [&](std::int64_t s, std::int64_t c) { return s >= 0 ? xs[s * xt + c] : st[(K - 1 + s) * E + c]; };
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < E; ++c) {
      float acc = b.defined() ? b.data<float>()[c] : 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += ws[c * K + k] * input(t - (K - 1) + k, c);
      o[t * ot + c] = silu(acc);
    }
  std::vector<float> next(static_cast<std::size_t>((K - 1) * E));  // the last K − 1 inputs, oldest first
  // EXERCISE 07.2 BEGIN: the convolution's state
  for (std::int64_t r = 0; r < K - 1; ++r)
    for (std::int64_t c = 0; c < E; ++c) next[static_cast<std::size_t>(r * E + c)] = input(T - (K - 1) + r, c);
  // EXERCISE 07.2 STUB
  // (void)input;
  // lab::not_done("07.2", "fill next [K − 1, E] with the last K − 1 inputs, oldest first: row r is the input at "
  //                       "position T − (K − 1) + r, which input(s, c) reads from x, or from the old state when "
  //                       "it came before this call (a prompt shorter than K − 1)");
  // EXERCISE 07.2 END
  std::copy(next.begin(), next.end(), st);
}

}  // namespace ref

void selective_scan(const ScanInputs& in, Tensor& h, Tensor& y) {
  in.check(h, y, "selective_scan");
  count_scan("selective_scan", in);
  const ScanView v = view_of(in, y);
  if (h.is_cuda()) return cuda_selective_scan(v, h.data<float>());
  float* state = h.data<float>();
#pragma omp parallel for schedule(static) if (v.T * v.E * v.N >= (1 << 15))
  for (std::int64_t c = 0; c < v.E; ++c) scan_channel(v, c, 0, v.T, state + c * v.N, nullptr, true, FastExp{});
}

void causal_conv(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& state, Tensor& out) {
  if (!x.is_cuda()) return ref::causal_conv(x, w, b, state, out);  // K multiply-adds per value: the loop is fast enough
  const std::int64_t K = check_conv(x, w, b, state, out, "causal_conv");
  cuda_causal_conv(x.data<float>(), x.strides()[0], w.data<float>(), b.defined() ? b.data<float>() : nullptr,
                   state.data<float>(), out.data<float>(), out.strides()[0], x.size(0), x.size(1), K);
}

void parallel_scan(const ScanInputs& in, Tensor& h, Tensor& y, std::int64_t chunk) {
  in.check(h, y, "parallel_scan");
  IL_CHECK(!h.is_cuda(), "parallel_scan: CPU tensors only (on CUDA, selective_scan runs the chunked kernel)");
  IL_CHECK(chunk >= 1, "parallel_scan: chunk must be at least 1; got ", chunk);
  count_scan("parallel_scan", in);
  const ScanView v = view_of(in, y);
  const std::int64_t E = v.E, N = v.N, chunks = (v.T + chunk - 1) / chunk, per = E * N;
  auto range = [&](std::int64_t k) { return std::pair{k * chunk, std::min(v.T, (k + 1) * chunk)}; };
  // 1. Every chunk from a zero state, all at once: its end state and its product of Ā, i.e. the
  //    chunk as one element (a, b) of the associative scan.
  std::vector<float> prod(static_cast<std::size_t>(chunks * per), 1.0f), end(static_cast<std::size_t>(chunks * per), 0.0f);
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const auto [t0, t1] = range(k);
    for (std::int64_t c = 0; c < E; ++c)
      scan_channel(v, c, t0, t1, &end[static_cast<std::size_t>(k * per + c * N)],
                   &prod[static_cast<std::size_t>(k * per + c * N)], false, FastExp{});
  }
  // 2. The carries: the state entering chunk k + 1 is (a_k, b_k) applied to the one entering k.
  std::vector<float> start(static_cast<std::size_t>((chunks + 1) * per));
  std::copy(h.data<float>(), h.data<float>() + per, start.begin());
  for (std::int64_t k = 0; k < chunks; ++k)
    for (std::int64_t i = 0; i < per; ++i) {
      const auto at = static_cast<std::size_t>(k * per + i);
      start[at + static_cast<std::size_t>(per)] = prod[at] * start[at] + end[at];
    }
    // 3. Every chunk again from its true start state, all at once, writing y.
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < chunks; ++k) {
    const auto [t0, t1] = range(k);
    for (std::int64_t c = 0; c < E; ++c)
      scan_channel(v, c, t0, t1, &start[static_cast<std::size_t>(k * per + c * N)], nullptr, true, FastExp{});
  }
  std::copy(start.end() - per, start.end(), h.data<float>());
}

Tensor lti_kernel(const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, std::int64_t T) {
  const char* who = "lti_kernel";
  IL_CHECK(A.defined() && A.ndim() == 2 && !A.is_cuda(), who, ": A must be a CPU [E, N]; got ", A.describe());
  const std::int64_t E = A.size(0), N = A.size(1);
  check_vector(dt, E, Device::CPU, who, "dt");
  check_rows(B, E, N, Device::CPU, who, "B");
  check_rows(C, E, N, Device::CPU, who, "C");
  IL_CHECK(T >= 1, who, ": T must be at least 1; got ", T);
  Tensor K = Tensor::empty({E, T}, DType::F32);
  for (std::int64_t c = 0; c < E; ++c) {
    const float delta = softplus(dt.data<float>()[c]);
    for (std::int64_t k = 0; k < T; ++k) {
      double sum = 0;  // Σ_n C · Ā^k · B̄ (a sum of decaying exponentials: S4's kernel)
      // EXERCISE 07.3 BEGIN: S4's convolution kernel
      for (std::int64_t n = 0; n < N; ++n)
        sum += static_cast<double>(C.at<float>({c, n})) * std::exp(static_cast<double>(k) * delta * A.at<float>({c, n})) *
               delta * B.at<float>({c, n});
      // EXERCISE 07.3 STUB
      // (void)delta;
      // lab::not_done("07.3", "sum over the N states C[c, n] · Ā^k · B̄ with Ā^k = exp(k·Δ·A[c, n]) and "
      //                       "B̄ = Δ·B[c, n] (Δ is delta): the output at lag k of a unit input, in double");
      // EXERCISE 07.3 END
      K.data<float>()[c * T + k] = static_cast<float>(sum);
    }
  }
  return K;
}

void lti_convolution(const ScanInputs& in, Tensor& h, Tensor& y) {
  const char* who = "lti_convolution";
  in.check(h, y, who);
  IL_CHECK(in.lti, who,
           ": the convolution needs Δ, B and C that do not depend on the token (an LTI layer); a "
           "selective layer's change with every token, which is why Mamba scans");
  IL_CHECK(!h.is_cuda(), who, ": CPU tensors only");
  const auto hv = h.to_float_vector();
  IL_CHECK(std::all_of(hv.begin(), hv.end(), [](float s) { return s == 0.0f; }), who,
           ": runs from an empty state (a convolution has no term for what came before); this state is not zero");
  const std::int64_t T = in.T(), E = in.E(), N = in.N();
  const Tensor K = lti_kernel(in.dt, in.A, in.B, in.C, T);
  const ScanView v = view_of(in, y);
  metrics::count(who, static_cast<double>(T * (T + 1) * E), 4.0 * static_cast<double>(4 * T * E + E * T));
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < E; ++c) {
    const float* k = K.data<float>() + c * T;
    for (std::int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (std::int64_t j = 0; j <= t; ++j) acc += k[j] * v.u_at(t - j, c);  // y = K * u, causal
      v.y_at(t, c) = (acc + v.D[c] * v.u_at(t, c)) * silu(v.z_at(t, c));
    }
    const float delta = softplus(v.dt_at(0, c));
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0;  // the state after T tokens: Σ_k Ā^(T−1−k) · B̄ · u_k
      for (std::int64_t j = 0; j < T; ++j)
        s += std::exp(static_cast<double>(T - 1 - j) * delta * v.A[c * N + n]) * delta * v.B_at(0, c, n) * v.u_at(j, c);
      h.data<float>()[c * N + n] = static_cast<float>(s);
    }
  }
}

}  // namespace inferlab::models::mamba
