#pragma once
/// @file cuda_mamba.h
/// @brief Chapter 07 on the GPU: the causal convolution, the chunked selective scan, the fused step.
///
/// # The scan (prefill, T > 1)
///
/// The recurrence h_t = Ā_t·h_{t−1} + B̄_t·u_t is sequential in t, but E·N independent ones run
/// side by side (one per channel and state), and each is an associative scan: chunks of the
/// sequence can be scanned at once and joined afterwards (ssm.h). One block per channel, 256
/// threads as 16 chunks × 16 state lanes (lanes step by 16 when N > 16):
///
///  1. each thread scans its chunk of the sequence from a zero state, keeping only the chunk's
///     product of Ā and its end state (registers);
///  2. 16 threads join the chunks' carries in order (16 steps of the associative operator) and
///     write the final state;
///  3. every thread reruns its chunk from its true start state; the 16 lanes of a chunk (a half
///     warp) sum C·h over the states with shuffles, and lane 0 writes y = (Σ + D·u)·silu(z).
///
/// Twice the arithmetic of one sequential pass, in exchange for 16× the parallelism over time:
/// what the Mamba paper's hardware-aware scan does, with the chunk in registers rather than
/// SRAM tiles. u, Δ, B, C and z are read twice, y written once, the state read and written once.
///
/// # The step (decode, T = 1)
///
/// One thread per (channel, state): softplus, Ā = exp(Δ·A), the update, C·h summed over a half
/// warp, the skip and the gate, all in one kernel; it reads the state once and writes it once.
/// Per token the step reads E·N·4 bytes of state and A, whatever the position: decode time per
/// token is flat, where attention's grows with every cached position.
///
/// # The convolution
///
/// A thread per (token, channel) over K inputs (the state's K − 1 columns for the first ones),
/// then a second kernel moves the last K − 1 inputs into the state.

#include <cstdint>

#include "common/models/scan_view.h"

namespace inferlab::models::mamba {

/// selective_scan on device pointers (f32, checked by the caller): h [E, N] updated in place.
void cuda_selective_scan(const ScanView& v, float* h);

/// ref::causal_conv on device pointers: x [T, E] (row stride x_t), w [E, K], b [E] or null,
/// state [K − 1, E] (advanced), out [T, E] (row stride out_t).
void cuda_causal_conv(const float* x, std::int64_t x_t, const float* w, const float* b, float* state, float* out,
                      std::int64_t out_t, std::int64_t T, std::int64_t E, std::int64_t K);

}  // namespace inferlab::models::mamba
