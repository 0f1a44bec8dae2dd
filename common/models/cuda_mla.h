#pragma once
/// @file cuda_mla.h
/// @brief Chapter 04 on the GPU: absorbed-MLA decode attention, one latent row read for many heads.
///
/// In the absorbed path (mla.h) every query head attends over the same cached rows: the key is
/// the whole row [c ‖ k_pe] (r + dr values), the value its first r values. That is MQA over the
/// latents, so the kernel follows chapter 03's grouped kernel with a single KV head: a block
/// serves many query heads and scores each row it reads against all of them.
///
/// # Data flow
///
/// The context is cut into chunks of 256 positions (chapter 02's split, so long contexts fill
/// the GPU) and the N heads into groups of up to 16; one block per (head group, chunk):
///
///  1. the group's query rows, already multiplied by the scale, go to shared memory;
///  2. scores: a warp per cached row loads the row once (16-byte loads, all r + dr values in
///     registers) and dots it with each query of the group;
///  3. softmax statistics of each head over the chunk (max m, sum l): a warp per head;
///  4. values: a thread per latent dimension d < r reads column d of the chunk's rows and
///     accumulates it into the group's heads (acc = Σ e^(s−m)·c_d);
///  5. chapter 02's merge rescales the chunks by e^(m_c − M) and divides by the total sum.
///
/// Why groups and not all N heads in a block: a block's partial output is heads × r floats,
/// and DeepSeek-V2's 128 × 512 (256 KiB) fits in neither registers nor shared memory; 16 heads
/// keep 16 accumulators per thread (one per head, for each of its dimensions in turn) and the
/// shared memory at 16 × (256 + r + dr) floats (52 KiB at r + dr = 576, opted in beyond the
/// default 48 KiB). The N/16 blocks of a chunk are
/// neighbours in the grid (the head group is blockIdx.x), so they run together: the first
/// fetches the chunk from HBM and the others find it in L2. Each row therefore crosses HBM once
/// per step for all N heads, and L2 once per group; chapter 02's per-head kernel would fetch it
/// N times. The grid has N/16 × ⌈len/256⌉ blocks: at N = 128 it fills an H200's 132 SMs from
/// about 4K positions on; shorter contexts leave SMs idle (they take microseconds anyway).
///
/// # Memory-bound or not
///
/// Per cached row the kernel reads (r + dr)·4 bytes and does 2·N·(r + dr) (scores) + 2·N·r
/// (values) FLOPs: 2·N·(2r + dr)/(4·(r + dr)) FLOP per byte. For DeepSeek-V2 (N = 128, r = 512,
/// dr = 64) that is 278,528 FLOPs per 2,304 bytes, about 121 FLOP/byte. An H200 streams about
/// 4.8 TB/s and does about 67 TFLOP/s of f32 on its CUDA cores: the ridge is near 14 FLOP/byte,
/// so this f32 kernel is compute-bound, roughly 9× past the ridge (a 32K context reads 75 MB,
/// about 16 µs of bandwidth, and does 9.1 GFLOP, about 136 µs at peak). With a bf16 cache and
/// tensor cores (about 990 TFLOP/s) the intensity doubles to 242 and the ridge moves to about
/// 200: there the absorbed kernel sits near the balance point, which is why production MLA
/// kernels (FlashMLA) are written for tensor cores. For tiny-mla (N = 8, r = 32, dr = 8) the
/// intensity is 7.2 FLOP/byte: memory-bound, like every MHA or GQA decode.

#include "common/tensor.h"

namespace inferlab::models::mla {

/// Absorbed-MLA decode attention of one query row against a layer's latent cache (CUDA, f32,
/// contiguous): q [1, N, r + dr] in latent space, latent [S, 1, r + dr] of which the first `len`
/// rows are attended, each row its own key and its first r values its value; out [1, N, r].
/// `scale` multiplies the scores (the model's 1/sqrt(dn + dr), MlaConfig::softmax_scale, not
/// 1/sqrt(r + dr)). Needs r + dr a multiple of 4 (16-byte row loads) and at most 1024.
void mla_decode_attention(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r, Tensor& out);

/// The plain path's rebuild on the GPU (for comparison with the absorbed kernel): from the first
/// `len` rows of latent [S, 1, r + dr] and kv_b_proj's weight w_kvb [N·(dn + dv), r] (f32),
/// every position's keys k [len, N, dn + dr] (W_UK c, then the shared k_pe) and values
/// v [len, N, dv] (W_UV c). Two strided-batched cuBLAS GEMMs over the heads read c in place and
/// write straight into k and v; a copy puts k_pe into every head. This is the MHA cache,
/// recomputed: len·N·(dn + dr + dv) values written per step, and 2·len·r·N·(dn + dv) FLOPs.
void mla_rebuild_kv(const Tensor& latent, std::int64_t len, const Tensor& w_kvb, std::int64_t dn, Tensor& k, Tensor& v);

}  // namespace inferlab::models::mla
