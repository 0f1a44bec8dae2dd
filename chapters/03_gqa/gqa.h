#pragma once
/// @file gqa.h
/// @brief Chapter 03: grouped-query attention. N query heads share K key/value heads.
///
/// Nothing in the attention op changes: query head h reads KV head h / (N/K) (ops.h). What
/// changes is what has to be stored and read: the KV cache shrinks by K/N, while every weight
/// (except the small k and v projections) stays. So the speed-up of a decode step is K/N only
/// where the cache dominates the bytes read: long contexts and large batches.

#include "chapters/01_naive_decode/llama.h"

namespace inferlab::ch03 {

/// MHA (or GQA) -> GQA with `kv_heads` KV heads, without retraining: the K and V projection heads
/// of each group are averaged (mean pooling, the starting point of GQA uptraining in Ainslie et
/// al. 2023, section 2.1). Query heads keep their order: group g holds heads g·N/K .. (g+1)·N/K − 1.
models::Llama mean_pool_kv_heads(const models::Llama& m, std::int64_t kv_heads);

/// The inverse view: every KV head's projection rows repeated for each query head of its
/// group. The result is an MHA model computing exactly the same function.
models::Llama repeat_kv_heads(const models::Llama& m);

}  // namespace inferlab::ch03
