#pragma once
/// @file ssm.h
/// @brief Chapter 07's ops: the causal convolution and the selective scan, three ways.
///
/// A Mamba mixer keeps, per channel c, a state h[c, ·] of N numbers and updates it per token t:
///
///     Δ = softplus(dt[t, c])                      the step size, from the token (selection)
///     h[c, n] ← exp(Δ·A[c, n]) · h[c, n] + Δ·B[t, n] · u[t, c]
///     y[t, c] = (Σ_n C[t, n] · h[c, n] + D[c] · u[t, c]) · silu(z[t, c])
///
/// exp(Δ·A) is Ā of the zero-order hold; Δ·B is B̄ as the reference code (and transformers)
/// discretise it, Euler's first-order B̄ = ΔB rather than the exact (ΔA)⁻¹(exp(ΔA) − I)·ΔB of
/// the zero-order hold. The two agree to O(Δ²), and Δ is small (0.001 to 0.1 at initialisation);
/// the model is trained with the one it runs.
///
/// The recurrence runs three ways, which agree to float32 rounding (tests/ch07/test_ssm.cpp):
/// - ref::selective_scan: the loop above, token after token, one channel after another (the
///   reading version, single-threaded);
/// - selective_scan: the same recurrence on the fast path: CPU threads over the channels, or on
///   the GPU a chunked parallel scan (T > 1) and a fused step kernel (T = 1, decoding);
/// - parallel_scan: the associative form on the CPU. h_t = a_t·h_{t−1} + b_t composes as
///   (a₁, b₁) ∘ (a₂, b₂) = (a₁a₂, a₂b₁ + b₂), so chunks of the sequence are scanned at once
///   and their carries joined afterwards: the algorithm of the GPU kernel, there to be read.
///
/// With Δ, B and C fixed per channel (tiny-lti, S4D-style) nothing depends on the token, and the
/// whole scan is one causal convolution of u with the kernel K[c, k] = Σ_n C·Ā^k·B̄: lti_kernel
/// and lti_convolution.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "common/tensor.h"

namespace inferlab::models::mamba {

/// One sequence's inputs to the scan, all f32 on one device. Rows may be strided (columns of a
/// wider projection output are passed as views), the last dimension must be contiguous.
struct ScanInputs {
  Tensor u;          ///< [T, E] the convolution's output after SiLU
  Tensor dt;         ///< [T, E] Δ before the softplus (dt_proj's output); LTI: [E], the same for every token
  Tensor A;          ///< [E, N], A = −exp(A_log)
  Tensor B;          ///< [T, N] (selective: from x_proj); LTI: [E, N]
  Tensor C;          ///< [T, N] (selective); LTI: [E, N]
  Tensor D;          ///< [E] the skip connection
  Tensor z;          ///< [T, E] the gate (the second half of in_proj's output)
  bool lti = false;  ///< dt, B and C per channel (tiny-lti) rather than per token

  std::int64_t T() const { return u.size(0); }
  std::int64_t E() const { return u.size(1); }
  std::int64_t N() const { return A.size(1); }
  /// Throws naming the tensor whose shape, dtype or device disagrees (h [E, N], y [T, E]).
  void check(const Tensor& h, const Tensor& y, const char* who) const;
};

/// Bytes a scan must move at least: u, Δ, z in and y out per token and channel, B and C per token
/// (per channel for LTI), A and the state read, the state written, D.
double scan_bytes(std::int64_t T, std::int64_t E, std::int64_t N, bool lti);

/// exp(x) for x ≤ 0 (Δ·A never is positive) in plain arithmetic, so that the loop over the N states
/// vectorises: 2^k · p(r) with k = round(x / ln 2), r = x − k·ln 2 in two parts (Cody and Waite),
/// p the degree-7 Taylor polynomial (its remainder below 2e-9 on |r| ≤ ln 2 / 2), 2^k built in the
/// exponent bits (k ≥ −126: a normal float); 0 below −87.3365 (where exp is under float's smallest
/// normal, 2^−126). Within 2 ulp of std::exp.
inline float exp_nonpositive(float x) {
  const bool underflows = x < -87.336544f;  // ln 2^−126
  x = std::max(x, -87.336544f);
  const float k = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720, p = p * r + 1.0f / 120, p = p * r + 1.0f / 24, p = p * r + 1.0f / 6;
  p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
  return underflows ? 0.0f : p * std::bit_cast<float>((static_cast<std::int32_t>(k) + 127) << 23);
}

/// softplus(x) = log(1 + eᵡ), as torch computes it (x itself above 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

namespace ref {
/// The recurrence, token after token: continues from state h [E, N] (updated in place) and
/// writes y [T, E].
void selective_scan(const ScanInputs& in, Tensor& h, Tensor& y);

/// The causal depthwise convolution of Mamba's input branch, then SiLU, per channel c:
/// out[t, c] = silu(b[c] + Σ_k w[c, k] · x[t − K + 1 + k, c]), where positions before this call
/// come from `state` [K − 1, E] (the last K − 1 inputs, oldest first; zeros at the start), which
/// is then advanced to end with this call's inputs. x [T, E] (rows may be strided), w [E, K],
/// b [E] or undefined, out [T, E].
void causal_conv(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& state, Tensor& out);
}  // namespace ref

/// The fast path of ref::selective_scan: on the CPU the channels' recurrences split over
/// threads; on CUDA tensors the chunked scan kernel (or the fused step kernel when T = 1).
void selective_scan(const ScanInputs& in, Tensor& h, Tensor& y);

/// ref::causal_conv on the CPU; on CUDA tensors its kernel.
void causal_conv(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& state, Tensor& out);

/// The chunked associative scan on the CPU: chunks of `chunk` tokens are scanned from a zero
/// state at once (their products of exp(ΔA) and end states), the carries are joined chunk after
/// chunk, and each chunk is rerun from its true start state to write y. Same contract as
/// selective_scan; the result does not depend on the number of threads.
void parallel_scan(const ScanInputs& in, Tensor& h, Tensor& y, std::int64_t chunk = 64);

/// The LTI layer's convolution kernel [E, T]: K[c, k] = Σ_n C[c, n] · exp(k·Δ_c·A[c, n]) · Δ_c·B[c, n]
/// with Δ_c = softplus(dt[c]) (dt [E], A, B, C [E, N]; CPU).
Tensor lti_kernel(const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, std::int64_t T);

/// The LTI scan as a convolution, from a zero state: y[t, c] = (Σ_{k ≤ t} K[c, k] · u[t − k, c] +
/// D[c] · u[t, c]) · silu(z[t, c]), with K = lti_kernel (direct, O(T²·E); an FFT would make it
/// O(T log T)). The state the scan would leave, h[c, n] = Σ_k Ā^(T−1−k) · B̄ · u[k, c], is written
/// to h so that decoding can continue. `in.lti` must be set; CPU.
void lti_convolution(const ScanInputs& in, Tensor& h, Tensor& y);

}  // namespace inferlab::models::mamba
