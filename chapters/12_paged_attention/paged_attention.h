#pragma once
/// @file paged_attention.h
/// @brief Chapter 12: attention that reads K and V through a block table.
///
/// A paged sequence's position p lives in block table[p / B] at offset p % B (B positions a
/// block): its slot is table[p / B]·B + p % B among the pool's rows. Attention is chapter 01's,
/// except that key j is fetched from its slot instead of from row j. Within a block the rows are
/// contiguous, so a fast path walks block by block and loses almost nothing to the indirection.
///
/// For long contexts the positions are split into ranges that are attended in parallel, each
/// keeping its own softmax statistics (its maximum m and sum l of exp(s − m)); the merge rescales
/// each range's weighted sum by exp(m_range − m_max) (split-KV, as flash-decoding does).

#include <cstdint>
#include <vector>

#include "common/tensor.h"

namespace inferlab::ch12 {

/// One sequence's keys and values in a pool: rows of k_pool / v_pool [blocks, B, K, H] through
/// its block table.
struct PagedKV {
  const Tensor& k_pool;
  const Tensor& v_pool;
  const std::vector<std::int32_t>& table;  ///< on the host; the CUDA path copies it over
  std::int64_t block_size;
};

/// The pool row (slot) that holds position p: table[p / B]·B + p % B.
std::int64_t slot(const std::vector<std::int32_t>& table, std::int64_t block_size, std::int64_t p);

/// Writes k[t], v[t] ([T, K, H]) into the slots of positions start .. start + T − 1.
void write_slots(const PagedKV& kv, std::int64_t start, const Tensor& k, const Tensor& v);

/// Causal attention of q [T, N, H] at positions q_offset .. q_offset + T − 1 over the sequence's
/// positions 0 .. q_offset + T − 1, into out [T, N, H]. `splits`: how many ranges the positions
/// are cut into (0: one per 2048 positions, at least one). CPU or CUDA, as the tensors are.
void paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out, std::int64_t splits = 0);

namespace ref {
/// The same, as plain loops (CPU): for each query row and head, the scores of every position
/// through its slot, their softmax, the weighted sum of the values.
void paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out);
}  // namespace ref

}  // namespace inferlab::ch12
